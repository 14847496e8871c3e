"""Reads at a snapshot: a read timestamp below which everything is decided, rows by key or range
from the partitions at it, and lookups through the lookup cache."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aggview import errors
from aggview.partition_map import partition_of
from aggview.wire import ltm_pb2 as lpb
from coordinator import lookup_cache

log = logging.getLogger("coordinator.transactions")  # the manager's log, as before the split
# how long a read waits for a partition that moved to be found where it went (see _read)
MOVED_READ_WAIT = 5.0


class SnapshotReads:
    """The transaction manager's reads (a part of ``TransactionManager``, over its state)."""

    @asynccontextmanager
    async def snapshot(self, at: int = 0) -> AsyncIterator[int]:
        """A read timestamp: every transaction at or below it is decided, and no LTM prunes
        the versions it needs until the block ends (it counts in the low watermark from the
        moment it is taken). ``at``: a timestamp the caller keeps readable (a held snapshot)."""
        if at:
            await self.clock.wait_decided(at)
            yield at
            return
        ts = await self.clock.read_timestamp()
        try:
            await self.clock.wait_decided(ts)
            yield ts
        finally:
            self.in_flight.stop_reading(ts)

    async def read_keys(
        self, table_id: str, keys: list[bytes], at: int = 0
    ) -> tuple[dict[bytes, bytes], int]:
        """Rows by key from one consistent snapshot (now, or ``at``, a held one); returns
        (key -> row, timestamp)."""
        async with self.snapshot(at) as ts:
            return await self.read_keys_at(table_id, keys, ts), ts

    async def read_range(
        self, table_id: str, start: bytes, stop: bytes, limit: int = 0, at: int = 0
    ) -> tuple[list[tuple[bytes, bytes]], int]:
        """A key range of a table from one consistent snapshot (now, or ``at``), in key
        order."""
        async with self.snapshot(at) as ts:
            return await self.read_range_at(table_id, start, stop, ts, limit=limit), ts

    async def read_keys_at(
        self, table_id: str, keys: list[bytes], ts: int, *, own: bool = False
    ) -> dict[bytes, bytes]:
        """Rows by key at ``ts``. ``own``: transaction ``ts`` reads (the state before it, and
        no older writer may change what it read afterwards)."""
        by_partition: dict[int, list[bytes]] = {}
        for key in keys:
            by_partition.setdefault(partition_of(table_id, key, self.partitions), []).append(key)
        replies = await asyncio.gather(
            *(
                self._read(p, lpb.ReadRequest(ts=ts, table=table_id, keys=ks, register_read=own))
                for p, ks in by_partition.items()
            )
        )
        return {kv.key: kv.row for reply in replies for kv in reply.rows}

    async def _read(self, partition: int, request: lpb.ReadRequest) -> lpb.ReadReply:
        """A read of one partition; one that moved meanwhile (handed back home, failed over)
        is read again from where its channel points next (replaced within a poll of the
        ownership records), for up to ``MOVED_READ_WAIT`` seconds: a read at a timestamp
        reads the same rows anywhere."""
        deadline = time.monotonic() + MOVED_READ_WAIT
        while True:
            channel = self.channels[partition]
            try:
                return await channel.read(request)
            except errors.NotServed:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.05)

    async def lookup_keys_at(self, table_id: str, keys: list[bytes], ts: int) -> dict[bytes, bytes]:
        """Rows by primary key as transaction ``ts`` reads them (``own``), from the lookup
        cache where it knows them, from the LTMs otherwise."""
        if table_id not in self.lookups.tables():
            return await self.read_keys_at(table_id, keys, ts, own=True)
        found: dict[bytes, bytes] = {}
        missing = []
        for key in keys:
            known, row = self.lookups.lookup((table_id, key), ts)
            if not known:
                missing.append(key)
            elif row is not None:
                found[key] = row
        if lookup_cache.CHECK and len(missing) < len(keys):
            read = await self._checked_lookups(table_id, keys, missing, found, ts)
        elif missing:
            read = await self.read_keys_at(table_id, missing, ts, own=True)
        else:
            return found
        for key in missing:  # the cache's own answers stand, even in check mode
            row = read.get(key)
            self.lookups.offer((table_id, key), row, ts)
            if row is not None:
                found[key] = row
        return found

    async def _checked_lookups(
        self,
        table_id: str,
        keys: list[bytes],
        missing: list[bytes],
        found: dict[bytes, bytes],
        ts: int,
    ) -> dict[bytes, bytes]:
        """Check mode: reads every key from the LTMs once, logs where a cache answer differs,
        and returns the rows read (the missing keys' answers among them)."""
        truth = await self.read_keys_at(table_id, keys, ts, own=True)
        for key in set(keys) - set(missing):
            if truth.get(key) != found.get(key):
                log.error(
                    "lookup cache mismatch: %s key %r at %d: cache %r, LTM %r",
                    table_id,
                    key,
                    ts,
                    found.get(key),
                    truth.get(key),
                )
        return truth

    def _warm(self, table_ids: set[str]) -> None:
        """Fills the lookup cache with the rows of newly cached tables, in the background."""
        if self._warming is not None:
            self._warming.cancel()
        self._warming = asyncio.get_running_loop().create_task(self._warm_from_snapshot(table_ids))

    async def _warm_from_snapshot(self, table_ids: set[str]) -> None:
        budget = self.lookups.max_rows // 2
        try:
            async with self.snapshot() as ts:
                for table_id in sorted(table_ids):
                    async for page in self.read_pages(table_id, b"", b"", ts):
                        for key, row in page[:budget]:
                            self.lookups.offer((table_id, key), row, ts + 1)
                        budget -= len(page)
                        if budget <= 0:
                            return
        except Exception as exc:  # noqa: BLE001 - e.g. an LTM down: lookups fill the cache
            log.info("lookup cache not warmed: %s", exc)

    async def read_range_at(
        self,
        table_id: str,
        start: bytes,
        stop: bytes,
        ts: int,
        *,
        limit: int = 0,
        own: bool = False,
    ) -> list[tuple[bytes, bytes]]:
        request = lpb.ReadRequest(
            ts=ts, table=table_id, scan=True, start=start, stop=stop, limit=limit, register_read=own
        )
        replies = await asyncio.gather(*(self._read(p, request) for p in range(len(self.channels))))
        rows = sorted((kv.key, kv.row) for reply in replies for kv in reply.rows)
        return rows[:limit] if limit else rows

    async def read_pages(
        self, table_id: str, start: bytes, stop: bytes, ts: int, page_rows: int = 5000
    ) -> AsyncIterator[list[tuple[bytes, bytes]]]:
        """[start, stop) at ``ts`` page by page, LTM by LTM (not in key order across LTMs), for
        readers of whole tables: no reply ever holds more than ``page_rows`` rows. The caller
        keeps ``ts`` readable (a held snapshot, or its own undecided transaction)."""
        for channel in self.channels:
            cursor = start
            while True:
                reply = await channel.read(
                    lpb.ReadRequest(
                        ts=ts,
                        table=table_id,
                        scan=True,
                        start=cursor,
                        stop=stop,
                        limit=page_rows,
                        page=True,
                    )
                )
                if reply.rows:
                    yield [(kv.key, kv.row) for kv in reply.rows]
                if not reply.resume:
                    break
                cursor = reply.resume
