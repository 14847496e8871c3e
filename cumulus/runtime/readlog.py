"""One map's read log on a DW node (seed 000 §3.3, the **ReadLog**): the reads served at each
timestamp, so that a write arriving late finds the reads it invalidates and sends them
corrective updates.

A late write must find the reads after its timestamp whose pattern matches its key. Scanning
every later read costs a pattern match per read per write: where two switches' batches
interleave, that was the runtime's largest cost (most of a node's time on the dashboard view
with member switches). The log is kept by the pattern's bound positions and their values
instead, so a write looks up the reads that can match it, one dict lookup per shape of pattern
this map was read with (a few), and walks only those after its timestamp."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass

from cumulus.runtime.messages import Key, Timestamp


@dataclass(slots=True, unsafe_hash=True)
class ReadEntry:
    """A slice read at ``ts`` for ``writer``, with the (statement, factor) pairs it was read
    for (a corrective names each)."""

    ts: Timestamp
    pattern: Key
    writer: int
    uses: tuple[tuple[int, int], ...]


def _ts(entry: tuple[Timestamp, int, ReadEntry]) -> Timestamp:
    return entry[0]


class ReadLog:
    """The reads of one map served on this node since the last committed cut. Entries are
    kept by their pattern's bound positions (those not WILD), then by the values there, each
    list in timestamp order, ties in the order served."""

    __slots__ = ("_count", "_served", "by_shape", "newest")

    def __init__(self) -> None:
        # bound positions -> their values -> (ts, order served, entry), sorted
        self.by_shape: dict[tuple[int, ...], dict[Key, list[tuple[Timestamp, int, ReadEntry]]]]
        self.by_shape = {}
        self.newest: Timestamp | None = None  # the latest read kept, if any
        self._served = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, entry: ReadEntry, bound: tuple[int, ...]) -> None:
        """A read at ``entry.ts`` of the keys matching ``entry.pattern``, whose positions
        ``bound`` are the ones it does not leave open."""
        self._served += 1
        self._count += 1
        item = (entry.ts, self._served, entry)
        values = tuple([entry.pattern[i] for i in bound])
        shape = self.by_shape.get(bound)
        if shape is None:
            shape = self.by_shape[bound] = {}
        reads = shape.get(values)
        if reads is None:
            shape[values] = [item]
        elif reads[-1][0] <= entry.ts:  # in order, as most reads are
            reads.append(item)
        else:
            bisect.insort(reads, item)
        if self.newest is None or self.newest < entry.ts:
            self.newest = entry.ts

    def late(self, key: Key, ts: Timestamp) -> Iterator[ReadEntry]:
        """The reads after ``ts`` of patterns matching ``key``, in the order served."""
        if self.newest is None or self.newest <= ts:
            return iter(())
        found: list[tuple[Timestamp, int, ReadEntry]] = []
        for bound, shape in self.by_shape.items():
            reads = shape.get(tuple([key[i] for i in bound]))
            if reads and reads[-1][0] > ts:
                found += reads[bisect.bisect_right(reads, ts, key=_ts) :]
        if len(self.by_shape) > 1:
            found.sort()
        return (item[2] for item in found)

    def prune(self, cut: int) -> None:
        """Drops the reads at or below the committed ``cut``: no write can come before them."""
        keep: Timestamp = (cut + 1, -1)
        count = 0
        for shape in self.by_shape.values():
            for values in list(shape):
                reads = shape[values]
                start = bisect.bisect_left(reads, keep, key=_ts)
                if start == len(reads):
                    del shape[values]
                elif start:
                    shape[values] = reads[start:]
                count += len(shape.get(values, ()))
        self._count = count
        if count == 0:
            self.newest = None
