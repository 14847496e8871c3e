"""The coordinator's gRPC face: thin servicers over the catalog and the transaction manager."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

import grpc

from aggview import errors
from aggview.keycodec import encode_key, prefix_end
from aggview.net import GRPC_OPTIONS, SERVER_OPTIONS, run_until_signalled
from aggview.schema import prefix_to_storage
from aggview.status import add_service, grpc_method
from aggview.values import from_row, to_row
from aggview.wire import client_pb2 as cpb
from aggview.wire import client_pb2_grpc as cpb_grpc
from aggview.wire import ltm_pb2 as lpb
from aggview.wire import ltm_pb2_grpc as lpb_grpc
from coordinator.catalog import Catalog
from coordinator.convert import key_bytes, wire_row
from coordinator.decision_log import DecisionLog
from coordinator.sql import run_sql
from coordinator.timestamp_oracle import TimestampOracle
from coordinator.transactions import TransactionManager
from coordinator.views import ViewManager
from ltm.store import open_store

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 16 * 1024 * 1024


class AggviewServicer(cpb_grpc.AggviewServicer):
    def __init__(self, manager: TransactionManager) -> None:
        self.manager = manager

    @grpc_method
    async def Sql(self, request: cpb.SqlRequest, context: object) -> cpb.SqlReply:
        result = await run_sql(request.sql, self.manager)
        return cpb.SqlReply(
            message=result.message,
            columns=result.columns,
            rows=result.rows,
            timestamp=result.timestamp,
        )

    @grpc_method
    async def Commit(self, request: cpb.CommitRequest, context: object) -> cpb.CommitReply:
        ts = await self.manager.commit(list(request.operations))
        return cpb.CommitReply(timestamp=ts)

    @grpc_method
    async def Get(self, request: cpb.GetRequest, context: object) -> cpb.GetReply:
        schema = self.manager.catalog.table(request.table)
        key = key_bytes(schema, from_row(request.key), self.manager.limits)
        rows, ts = await self.manager.read_keys(schema.table_id, [key])
        if key not in rows:
            return cpb.GetReply(found=False, timestamp=ts)
        return cpb.GetReply(found=True, row=wire_row(schema, rows[key]), timestamp=ts)

    @grpc_method
    async def Scan(self, request: cpb.ScanRequest, context: object) -> cpb.ScanReply:
        schema = self.manager.catalog.table(request.table)
        prefix = from_row(request.prefix)
        start = stop = b""
        if prefix:
            values = prefix_to_storage(schema, prefix)
            start = encode_key(schema.key_types[: len(values)], values)
            stop = prefix_end(start) or b""
        rows, ts = await self.manager.read_range(schema.table_id, start, stop, request.limit)
        return cpb.ScanReply(
            rows=[wire_row(schema, data) for _, data in rows],
            timestamp=ts,
            columns=list(schema.column_names),
        )

    @grpc_method
    async def View(self, request: cpb.ViewRequest, context: object) -> cpb.ViewReply:
        rows, ts = await self.manager.views.read(request.view, from_row(request.where))
        view = self.manager.views.views[request.view]
        return cpb.ViewReply(
            rows=[to_row(row) for row in rows], timestamp=ts, columns=list(view.plan.output)
        )

    @grpc_method
    async def Refresh(self, request: cpb.RefreshRequest, context: object) -> cpb.RefreshReply:
        return cpb.RefreshReply(timestamp=await self.manager.views.refresh(request.view))


class OutcomeServicer(lpb_grpc.TransactionOutcomeServicer):
    def __init__(self, manager: TransactionManager) -> None:
        self.manager = manager

    @grpc_method
    async def Query(self, request: lpb.OutcomeRequest, context: object) -> lpb.OutcomeReply:
        return lpb.OutcomeReply(outcomes=[self.manager.outcome(ts) for ts in request.ts])


@dataclass
class CoordinatorConfig:
    store_url: str
    log_dir: Path
    ltms: list[str]
    host: str = "127.0.0.1"
    port: int = 0
    fsync: bool = True


def build_manager(config: CoordinatorConfig) -> TransactionManager:
    store = open_store(config.store_url)
    catalog = Catalog(store)
    partitions = catalog.meta("partitions")
    if partitions is None:
        catalog.set_meta("partitions", str(len(config.ltms)))
    elif int(partitions) != len(config.ltms):
        raise errors.FailedPrecondition(
            f"this data was written by {partitions} LTMs; start with {partitions} "
            f"(got {len(config.ltms)}): repartitioning is not supported"
        )
    oracle = TimestampOracle(catalog.meta, catalog.set_meta)
    decisions = DecisionLog(config.log_dir, fsync=config.fsync)
    manager = TransactionManager(catalog, oracle, decisions, config.ltms)
    ViewManager(manager)
    return manager


async def serve(config: CoordinatorConfig, ready: asyncio.Event | None = None) -> None:
    """Runs the coordinator until SIGINT/SIGTERM."""
    manager = build_manager(config)
    await manager.start()
    await manager.views.start()
    server = grpc.aio.server(
        options=[
            *GRPC_OPTIONS,
            *SERVER_OPTIONS,
            ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
        ]
    )
    add_service(server, cpb.DESCRIPTOR.services_by_name["Aggview"], AggviewServicer(manager))
    add_service(
        server, lpb.DESCRIPTOR.services_by_name["TransactionOutcome"], OutcomeServicer(manager)
    )
    await run_until_signalled(server, config.host, config.port, "coordinator", ready)
    for channel in manager.channels:
        log.info(
            "LTM %d: %d decisions in %d calls",
            channel.index,
            channel.decisions.items,
            channel.decisions.calls,
        )
    await manager.views.stop()
    await manager.close()
    await manager.decisions.close()
    manager.catalog.store.close()
