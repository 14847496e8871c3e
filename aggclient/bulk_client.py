"""The client side of bulk access (see ``coordinator.bulk``): what Spark jobs call, over the
same channel, credentials and error mapping as :class:`aggclient.client.Client`."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from aggclient.client import Client
from aggview.rowcodec import decode_row
from aggview.schema import TableSchema, from_storage
from aggview.status import error_from_rpc
from aggview.wire import client_pb2 as pb

JOB_SECONDS = 3600  # the deadline of calls that last as long as a bulk job


@dataclass(frozen=True)
class Described:
    """A table or a view as a bulk reader needs it."""

    name: str
    kind: str  # "table" or "view"
    store_table: str
    columns: list[str]
    schema: dict[str, Any] | None  # TABLE: TableSchema JSON
    plan: dict[str, Any] | None  # VIEW: ViewPlan JSON
    base_schemas: list[dict[str, Any]]  # VIEW: schemas of its tables
    refreshed_at: int
    state: str
    store_url: str
    runtime: dict[str, Any] | None = None  # a cumulus view's runtime counts (at member 0)


class BulkClient:
    """Bulk calls on a :class:`Client`'s connection."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._stub = client._stub
        self._metadata = getattr(client, "_metadata", None)  # the client's token, if any

    def _call(self, method: Any, request: Any) -> Any:
        return self.client._call(method, request)

    def _call_long(self, method: Any, request: Any) -> Any:
        """A call that may take as long as a job over the whole table (up to an hour)."""
        try:
            return method(
                request, timeout=max(self.client.timeout, JOB_SECONDS), metadata=self._metadata
            )
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None  # type: ignore[arg-type]

    def list(self) -> tuple[list[str], list[str]]:
        """(tables, materialized views) by name."""
        reply = self._call(self._stub.List, pb.ListRequest())
        return list(reply.tables), list(reply.views)

    def describe(self, name: str) -> Described:
        reply = self._call(self._stub.Describe, pb.DescribeRequest(name=name))
        is_table = reply.kind == pb.DescribeReply.TABLE
        return Described(
            name=name,
            kind="table" if is_table else "view",
            store_table=reply.store_table,
            columns=list(reply.columns),
            schema=json.loads(reply.schema_json) if is_table else None,
            plan=None if is_table else json.loads(reply.plan_json),
            base_schemas=[json.loads(s) for s in reply.base_schemas_json],
            refreshed_at=reply.refreshed_at,
            state=reply.state,
            store_url=reply.store_url,
            runtime=json.loads(reply.runtime_json) if reply.runtime_json else None,
        )

    def hold_snapshot(self, ttl_ms: int = 0) -> tuple[int, int]:
        """A held snapshot: (lease, timestamp). Release it when the job is done."""
        reply = self._call(self._stub.HoldSnapshot, pb.SnapshotRequest(ttl_ms=ttl_ms))
        return reply.lease, reply.timestamp

    def renew_snapshot(self, lease: int, ttl_ms: int = 0) -> int:
        request = pb.SnapshotRequest(lease=lease, ttl_ms=ttl_ms)
        return self._call(self._stub.HoldSnapshot, request).timestamp

    def release_snapshot(self, lease: int) -> None:
        self._call(self._stub.ReleaseSnapshot, pb.ReleaseRequest(lease=lease))

    def splits(self, name: str, count: int) -> list[bytes]:
        reply = self._call(self._stub.Splits, pb.SplitsRequest(name=name, count=count))
        return list(reply.keys)

    def read_range(
        self, name: str, start: bytes, stop: bytes, snapshot: int, page_rows: int = 5000
    ) -> Iterator[list[tuple[bytes, bytes]]]:
        """Pages of raw rows (key, storage-form row) of [start, stop) at a held snapshot."""
        request = pb.ReadRangeRequest(
            name=name, start=start, stop=stop, snapshot=snapshot, page_rows=page_rows
        )
        try:
            pages = self._stub.ReadRange(
                request, timeout=self.client.timeout * 10, metadata=self._metadata
            )
            for page in pages:
                yield [(raw.key, raw.row) for raw in page.rows]
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None  # type: ignore[arg-type]

    def table_rows(self, name: str, snapshot: int) -> Iterator[dict[str, Any]]:
        """Every row of a table at a held snapshot, as the client's reads return them, page
        by page (a whole-table scan in one reply stops at the message size limit)."""
        described = self.describe(name)
        if described.schema is None:
            raise ValueError(f"{name} is a view, not a table")
        schema = TableSchema.from_json(described.schema)
        types = [(c, schema.column(c).type) for c in described.columns]
        for page in self.read_range(name, b"", b"", snapshot):
            for _, data in page:
                row = decode_row(data) or {}
                yield {c: from_storage(t, row.get(c)) for c, t in types}

    def load(self, table: str, staging_table: str) -> tuple[int, int]:
        """Commits staged rows into ``table`` at one timestamp: (timestamp, rows)."""
        request = pb.LoadRequest(table=table, staging_table=staging_table)
        reply = self._call_long(self._stub.Load, request)
        return reply.timestamp, reply.rows

    def begin_view(self, *, sql: str = "", view: str = "", ttl_ms: int = 0) -> pb.BeginViewReply:
        request = pb.BeginViewRequest(sql=sql, view=view, ttl_ms=ttl_ms)
        return self._call_long(self._stub.BeginView, request)  # may first index a big table

    def finish_view(
        self, view: str, snapshot: int, rows: Iterable[tuple[bytes, bytes]], chunk: int = 5000
    ) -> pb.FinishViewReply:
        def chunks() -> Iterator[pb.ViewRowsChunk]:
            batch: list[pb.RawRow] = []
            for key, row in rows:
                batch.append(pb.RawRow(key=key, row=row))
                if len(batch) >= chunk:
                    yield pb.ViewRowsChunk(view=view, snapshot=snapshot, rows=batch)
                    batch = []
            yield pb.ViewRowsChunk(view=view, snapshot=snapshot, rows=batch)

        return self._call_long(self._stub.FinishView, chunks())

    def abort_view(self, view: str) -> None:
        self._call(self._stub.AbortView, pb.AbortViewRequest(view=view))
