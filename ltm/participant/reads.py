"""Reads of a partition at a timestamp: point reads, scans and pages, merged from memory and
the store."""

from __future__ import annotations

import asyncio

from aggview import errors
from aggview.partition_map import partition_of
from aggview.rowcodec import decode_stored, encode_row
from aggview.wire import ltm_pb2 as pb
from ltm.participant.operations import RowId
from ltm.participant.state import PartitionState
from ltm.rows import Row


class Reads(PartitionState):
    """A participant's reads (a part of ``Participant``)."""

    async def read(self, request: pb.ReadRequest) -> list[tuple[bytes, bytes]]:
        """Rows as of ``request.ts``, waiting only for transactions at or below it to land."""
        self._check_serving()
        ts, table = request.ts, request.table
        if request.scan:
            return await self._scan(request)
        row_ids = [(table, key) for key in request.keys]
        for row_id in row_ids:
            self._check_owned(row_id)
        pinned = await self._pin(row_ids)
        try:
            out = []
            for row_id in row_ids:
                row = await self._read_row(row_id, ts, request.register_read)
                if row is not None:
                    out.append((row_id[1], encode_row(row)))
            return out
        finally:
            self._unpin(pinned)

    async def _read_row(self, row_id: RowId, ts: int, register: bool) -> Row | None:
        """``register``: a read of transaction ``ts`` itself (view maintenance), which sees
        the committed state before ``ts`` and keeps older writers off the row."""
        state = self.rows[row_id]
        loop = asyncio.get_running_loop()
        deadline = 0.0
        # Checked again here after every wait, so the check, the rts and the version read are
        # one step of the event loop: the wait ends in a task of its own, and steps pass before
        # this one resumes, in which an older writer may take the row (its rts not raised yet)
        # and then commit below this read, which would not have seen it.
        while state.blocks(ts, own=register):  # most reads find the row free: no wait task
            deadline = deadline or loop.time() + self.settings.lock_wait_timeout
            blocker = state.blocker(ts, own=register)
            try:
                await asyncio.wait_for(
                    state.wait_readable(ts, own=register), deadline - loop.time()
                )
            except asyncio.TimeoutError:
                raise self._read_wait_timeout(row_id, blocker, register) from None
        if register:
            state.rts = max(state.rts, ts)
            return state.version_at(ts - 1)[1]
        return state.version_at(ts)[1]

    def _read_wait_timeout(self, row_id: RowId, blocker: int, register: bool) -> Exception:
        """A read that waited ``lock_wait_timeout`` for an older transaction's decision. In a
        writing transaction (``register``) it aborts like a lock wait that timed out, and the
        client retries it; a snapshot read reports the row unavailable."""
        waited = f"{self.settings.lock_wait_timeout:g} s"
        if register:
            return errors.TooLate(
                f"row of {row_id[0]} was held for {waited} by undecided transaction "
                f"{blocker}; retry it"
            )
        return errors.Unavailable(
            f"row of {row_id[0]} is still held after {waited} by undecided transaction {blocker}"
        )

    async def _scan(self, request: pb.ReadRequest) -> list[tuple[bytes, bytes]]:
        ts, table = request.ts, request.table
        start, stop = request.start or None, request.stop or None
        self.scans_running += 1  # no eviction meanwhile: the store copy we read must stay valid
        try:
            stored, _ = await asyncio.to_thread(self._scan_store, table, start, stop)
            if request.register_read:  # the read must stay remembered (rts) on every row
                self.range_reads.setdefault(table, []).append((start or b"", stop, ts))
                await self._load((table, key) for key, (_, data) in stored.items() if data)
            return await self._merged(
                table, stored, start, stop, ts, request.register_read, request.limit
            )
        finally:
            self.scans_running -= 1

    async def read_page(self, request: pb.ReadRequest) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """About ``limit`` rows of a snapshot scan, for bulk readers that page through a big
        range: the store is read only up to the page's last stored key, so a page costs its
        own size, not the rest of the range. Returns the rows and where the next page starts
        (empty when the range is done)."""
        self._check_serving()
        ts, table = request.ts, request.table
        start, stop = request.start or None, request.stop or None
        self.scans_running += 1
        try:
            stored, last = await asyncio.to_thread(
                self._scan_store, table, start, stop, max(request.limit, 1)
            )
            bound = stop if last is None else last + b"\x00"  # exclusive end of this page
            rows = await self._merged(table, stored, start, bound, ts, False, 0)
            return rows, (bound or b"") if last is not None else b""
        finally:
            self.scans_running -= 1

    async def _merged(
        self,
        table: str,
        stored: dict[bytes, tuple[int, bytes]],
        start: bytes | None,
        stop: bytes | None,
        ts: int,
        register: bool,
        limit: int,
    ) -> list[tuple[bytes, bytes]]:
        """Live rows of [start, stop) at ``ts``: the cached version where a row is in memory,
        the store's copy otherwise, in key order, at most ``limit`` (0: all). A store copy
        newer than ``ts`` fails the read, as a point read of it does (``RowState.version_at``):
        its older version is gone (a restart forgot it; in between, eviction keeps it)."""
        keys = set(stored)
        for key in list(self.rows.keys_of(table)):
            if (start is None or key >= start) and (stop is None or key < stop):
                keys.add(key)
        out: list[tuple[bytes, bytes]] = []
        for key in sorted(keys):
            row_id = (table, key)
            if row_id in self.rows:
                row = await self._read_row(row_id, ts, register)
                data = encode_row(row) if row is not None else b""
            else:
                version, data = stored.get(key, (0, b""))
                if version > ts:
                    raise errors.Unavailable(
                        f"snapshot too old: {table} has a row stored at {version}, newer than "
                        f"the read at {ts}; read again"
                    )
            if data:
                out.append((key, data))
                if limit and len(out) >= limit:
                    break
        return out

    def _scan_store(
        self, table: str, start: bytes | None, stop: bytes | None, limit: int = 0
    ) -> tuple[dict[bytes, tuple[int, bytes]], bytes | None]:
        """Rows of this partition in [start, stop) as stored: each key's version timestamp
        and encoded row (empty: a tombstone), and the last key read when ``limit`` live rows
        were reached before the end (None: the range was read to its end)."""
        out: dict[bytes, tuple[int, bytes]] = {}
        live = 0
        for key, value in self.store.scan(table, start, stop):
            if partition_of(table, key, self.settings.partitions) == self.settings.partition:
                version, row, _ = decode_stored(value)
                out[key] = (version, b"" if row is None else encode_row(row))
                if row is not None:
                    live += 1
                    if limit and live >= limit:
                        return out, key
        return out, None
