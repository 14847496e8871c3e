"""Bulk access for the Spark layer: held snapshots, raw range reads, split points, bulk loads
and views computed outside the coordinator.

A Spark job reads millions of rows at one snapshot over minutes, so the snapshot is *held*: a
lease keeps the low watermark at its timestamp (the LTMs keep every version it needs) until the
job releases it or stops renewing it. Rows travel in storage form, as the LTMs hold them; the
Spark side decodes them with the same codecs.

A bulk load is one transaction: the loader stages encoded rows in a store table, then the
coordinator checks them against the schema and prepares them in chunks at a single timestamp,
so the load becomes visible at once, aborts as a whole, and never blocks an LTM for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from aggview import errors
from aggview.keycodec import encode_key
from aggview.retry import RetryPolicy
from aggview.rowcodec import decode_row
from aggview.schema import TableSchema, from_storage
from aggview.wire import ltm_pb2 as lpb
from coordinator.transactions import TransactionManager

log = logging.getLogger(__name__)

DEFAULT_TTL_MS = 10 * 60 * 1000
MAX_TTL_MS = 24 * 3600 * 1000
LOAD_CHUNK_ROWS = 5000  # rows per prepare round of a bulk load
# a load's timestamp-order aborts: a client's policy (20 tries, full jitter up to 0.1 s), its
# waits starting at 2 ms
LOAD_RETRY = RetryPolicy(first_delay=0.002)
MAX_PAGE_ROWS = 100_000


@dataclass
class Lease:
    ts: int
    ttl: float
    expires: float
    hold: contextlib.ExitStack
    on_expiry: Any = None  # an async callable, for a view initialization left behind


class SnapshotLeases:
    """Snapshots held across calls, each until released or not renewed within its ttl."""

    def __init__(self, manager: TransactionManager) -> None:
        self.manager = manager
        self.leases: dict[int, Lease] = {}
        self._ids = itertools.count(1)
        self._sweeper: asyncio.Task[None] | None = None

    async def hold(self, ttl_ms: int = 0) -> tuple[int, int]:
        """A new lease on the current snapshot: (lease id, timestamp)."""
        ttl = _ttl(ttl_ms)
        ts = await self.manager.clock.read_timestamp()
        stack = contextlib.ExitStack()
        stack.callback(self.manager.in_flight.stop_reading, ts)
        try:
            await self.manager.clock.wait_decided(ts)
        except BaseException:
            stack.close()
            raise
        lease = next(self._ids)
        self.leases[lease] = Lease(ts, ttl, time.monotonic() + ttl, stack)
        self._start_sweeper()
        return lease, ts

    def renew(self, lease: int, ttl_ms: int = 0) -> int:
        held = self._get(lease)
        if ttl_ms:
            held.ttl = _ttl(ttl_ms)
        held.expires = time.monotonic() + held.ttl
        return held.ts

    def release(self, lease: int) -> None:
        held = self.leases.pop(lease, None)
        if held is not None:
            held.hold.close()

    def check(self, ts: int) -> None:
        """A read at ``ts`` is safe only while a lease at or below it holds the watermark."""
        if ts > self.manager.clock.issued():
            raise errors.InvalidArgument(f"snapshot {ts} is in the future")
        now = time.monotonic()
        for held in self.leases.values():
            if held.ts <= ts and held.expires > now:
                held.expires = now + held.ttl  # reading through it keeps it alive
                return
        raise errors.FailedPrecondition(
            f"snapshot {ts} is not held: hold a snapshot first (HoldSnapshot) and read at or "
            "after its timestamp while the lease lasts"
        )

    def _get(self, lease: int) -> Lease:
        held = self.leases.get(lease)
        if held is None or held.expires <= time.monotonic():
            raise errors.FailedPrecondition(f"snapshot lease {lease} expired or unknown")
        return held

    def _start_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        while self.leases:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for lease, held in list(self.leases.items()):
                if held.expires <= now:
                    log.warning(
                        "snapshot lease %d at %d expired", lease, held.ts, extra={"ts": held.ts}
                    )
                    self.release(lease)
                    if held.on_expiry is not None:
                        with contextlib.suppress(Exception):
                            await held.on_expiry()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(BaseException):
                await self._sweeper
        for lease in list(self.leases):
            self.release(lease)


def _ttl(ttl_ms: int) -> float:
    ttl_ms = ttl_ms or DEFAULT_TTL_MS
    if not 0 < ttl_ms <= MAX_TTL_MS:
        raise errors.InvalidArgument(f"ttl_ms must be between 1 and {MAX_TTL_MS}; got {ttl_ms}")
    return ttl_ms / 1000


class BulkAccess:
    """What the Spark layer asks of the coordinator, over the transaction manager."""

    def __init__(self, manager: TransactionManager) -> None:
        self.manager = manager
        self.catalog = manager.catalog
        self.leases = SnapshotLeases(manager)
        self.loads_running: set[str] = set()

    # ----------------------------------------------------------------- reads

    def store_table(self, name: str) -> str:
        """The store table holding the rows of a table or a view, by name."""
        if name in self.catalog.tables:
            return self.catalog.tables[name].table_id
        view = self.manager.views.views.get(name) if self.manager.views else None
        if view is not None:
            return view.view_id
        raise errors.UnknownTable(f"unknown table or materialized view {name!r}")

    async def pages(
        self, name: str, start: bytes, stop: bytes, ts: int, page_rows: int
    ) -> AsyncIterator[list[tuple[bytes, bytes]]]:
        """The rows of [start, stop) at a held snapshot, page by page, LTM by LTM (not in
        key order across LTMs: a bulk reader does not need it)."""
        table_id = self.store_table(name)
        self.leases.check(ts)
        if not 0 < page_rows <= MAX_PAGE_ROWS:
            raise errors.InvalidArgument(
                f"page_rows must be between 1 and {MAX_PAGE_ROWS}; got {page_rows}"
            )
        await self.manager.clock.wait_decided(ts)
        async for page in self.manager.read_pages(table_id, start, stop, ts, page_rows):
            yield page

    async def splits(self, name: str, count: int) -> list[bytes]:
        """About ``count`` - 1 keys cutting the table into ranges of similar size, from the rows
        checkpointed to the store (rows still only in LTM memory just make ranges uneven)."""
        table_id = self.store_table(name)
        if not 1 <= count <= 10_000:
            raise errors.InvalidArgument(f"count must be between 1 and 10000; got {count}")
        if count == 1:
            return []
        keys = await asyncio.to_thread(_store_keys, self.catalog.store, table_id)
        if len(keys) < count:
            return []
        step = len(keys) / count
        return sorted({keys[int(step * i)] for i in range(1, count)})

    # ----------------------------------------------------------------- bulk load

    async def load(self, table: str, staging: str) -> tuple[int, int]:
        """Commits the rows staged in ``staging`` into ``table`` as one transaction; returns
        (timestamp, rows). A timestamp-order abort loads the staged rows again at a new
        timestamp (``LOAD_RETRY``: the client cannot retry, the staging table being gone). The
        staging table is dropped either way."""
        schema = self.catalog.table(table)
        if staging in self.catalog.by_id or not staging.startswith("load_"):
            raise errors.InvalidArgument(
                f"staging table must be a store table named load_...; got {staging!r}"
            )
        if table in self.loads_running:
            raise errors.FailedPrecondition(f"a bulk load into {table} is already running")
        store = self.catalog.store
        if staging not in store.list_tables():
            raise errors.UnknownTable(f"no staging table {staging!r} in the store")
        self.loads_running.add(table)

        async def once() -> tuple[int, int]:
            counted = [0]
            chunks = _staged_chunks(store, schema, staging, LOAD_CHUNK_ROWS, counted)
            ts = await self.manager.bulk_transaction(_in_thread(chunks), {schema.table_id})
            return ts, counted[0]

        def again(exc: BaseException, failed: int, wait: float) -> None:
            # a younger transaction read or wrote a row it inserts: the whole load runs again
            # at a new timestamp, as a client retries a transaction
            log.info("bulk load into %s: %s; attempt %d", table, exc, failed + 1)

        try:
            return await LOAD_RETRY.arun(once, again)
        finally:
            self.loads_running.discard(table)
            await asyncio.to_thread(store.drop_table, staging)


def _store_keys(store: Any, table_id: str) -> list[bytes]:
    return [key for key, _ in store.scan(table_id, None, None)]


def _staged_chunks(
    store: Any, schema: TableSchema, staging: str, size: int, counted: list[int]
) -> Iterator[list[lpb.RowOp]]:
    chunk: list[lpb.RowOp] = []
    for key, data in store.scan(staging, None, None):
        counted[0] += 1
        chunk.append(
            lpb.RowOp(
                kind=lpb.RowOp.INSERT,
                table=schema.table_id,
                key=key,
                values=check_staged_row(schema, key, data),
            )
        )
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


async def _in_thread(chunks: Iterator[list[lpb.RowOp]]) -> AsyncIterator[list[lpb.RowOp]]:
    """Store reads and row checks off the event loop, one chunk at a time."""
    done = object()
    while True:
        chunk = await asyncio.to_thread(next, chunks, done)
        if chunk is done:
            return
        yield chunk  # type: ignore[misc]


def check_staged_row(schema: TableSchema, key: bytes, data: bytes) -> bytes:
    """A staged row must be exactly what a transaction would have stored: every column of the
    table in storage form, and the key its primary-key columns encode to."""
    try:
        row = decode_row(data)
    except (ValueError, json.JSONDecodeError):
        row = None
    if not isinstance(row, dict) or set(row) != set(schema.column_names):
        raise errors.InvalidArgument(
            f"staged row for table {schema.name} does not have exactly its columns"
        )
    for column in schema.columns:
        value = row[column.name]
        if value is None:
            if not column.nullable:
                raise errors.TypeMismatch(f"column {schema.name}.{column.name} is NOT NULL")
            continue
        from_storage(column.type, value)  # raises TypeMismatch
    expected = encode_key(schema.key_types, [row[c] for c in schema.primary_key])
    if expected != key:
        raise errors.InvalidArgument(
            f"staged row for table {schema.name}: key does not match its primary-key columns"
        )
    return data
