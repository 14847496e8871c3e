"""One map's partition on a DW node as the speculative protocol keeps it (seed 000 §3.3, seed
003 §5.1, the **WriteLog**): every entry's deltas by timestamp, so a read at ts sees the sum of
those below ts whatever arrived later, folded into a base at each committed cut."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

from cumulus.expressions import add
from cumulus.runtime.messages import WILD, Key, Timestamp

BEFORE_ALL: Timestamp = (0, -1)  # below every update's (counter >= 1, switch >= 0)


class MapLog:
    """One map's partition on this node: current values, the values at the last committed cut,
    and the deltas written after that cut, by timestamp. Slices with open key positions are
    answered from an index on the bound positions, built on first use."""

    __slots__ = ("base", "current", "history", "indexes", "latest", "newest")

    def __init__(self) -> None:
        self.current: dict[Key, Any] = {}
        self.base: dict[Key, Any] = {}  # every write up to the committed cut, coalesced
        self.history: dict[Key, list[tuple[Timestamp, Any]]] = {}
        self.latest: dict[Key, Timestamp] = {}  # every key ever written: its newest write
        self.newest: Timestamp = BEFORE_ALL  # the newest write to any key
        # bound positions -> their values -> the keys having them
        self.indexes: dict[tuple[int, ...], dict[Key, list[Key]]] = {}

    def write(self, key: Key, delta: Any, ts: Timestamp) -> None:
        history = self.history.get(key)
        if history is None:
            self.history[key] = [(ts, delta)]
        elif history[-1][0] <= ts:  # in timestamp order, as nearly every write is
            history.append((ts, delta))
        else:
            bisect.insort(history, (ts, delta), key=lambda e: e[0])
        current = self.current  # ``accumulate``, inline: this is the runtime's busiest line
        old = current.get(key)
        if old is None:
            value = delta
        elif type(old) is int and type(delta) is int:
            value = old + delta
        else:
            value = add(old, delta)
        if value != 0:
            current[key] = value
        elif old is not None:
            del current[key]
        latest = self.latest.get(key)
        if latest is None:
            self._indexed(key)
        if latest is None or latest < ts:
            self.latest[key] = ts
            if self.newest < ts:
                self.newest = ts

    def value_before(self, key: Key, ts: Timestamp) -> Any:
        if self.latest.get(key, (0, 0)) < ts:
            return self.current.get(key, 0)
        value: Any = self.base.get(key, 0)
        for at, delta in self.history.get(key, ()):
            if at >= ts:
                break
            value = add(value, delta)
        return value

    def value_at(self, key: Key, cut: int) -> Any:
        """The value once every write with a timestamp counter up to ``cut`` is in."""
        return self.value_before(key, (cut + 1, -1))

    def keys(self) -> Iterable[Key]:
        return self.latest.keys()

    def slice_before(
        self, pattern: Key, ts: Timestamp, bound: tuple[int, ...] | None = None
    ) -> dict[Key, Any]:
        """The entries matching ``pattern`` as of just before ``ts``; ``bound``, the positions
        ``pattern`` does not leave open (WILD), if the caller planned them."""
        if bound is None:
            bound = tuple(i for i, part in enumerate(pattern) if part is not WILD)
        if len(bound) == len(pattern):  # a point read
            value = self.value_before(pattern, ts)
            return {pattern: value} if value != 0 else {}
        candidates: Iterable[Key] = self.latest
        if bound:
            candidates = self.index(bound).get(tuple([pattern[i] for i in bound]), ())
        current = self.current
        if self.newest < ts:  # nothing written at or after ts: the newest values (not zeros)
            return {key: current[key] for key in candidates if key in current}
        found = {}
        latest = self.latest
        for key in candidates:
            if latest[key] < ts:  # no write at or after ts: the newest value
                value = current.get(key)
                if value is not None:  # zeros are not kept
                    found[key] = value
                continue
            value = self.value_before(key, ts)
            if value != 0:
                found[key] = value
        return found

    def index(self, bound: tuple[int, ...]) -> dict[Key, list[Key]]:
        """Every key ever written, by its values at the ``bound`` positions (kept as keys are
        written: one built here stays current)."""
        index = self.indexes.get(bound)
        if index is None:
            index = self.indexes[bound] = {}
            for key in self.latest:
                index.setdefault(tuple([key[i] for i in bound]), []).append(key)
        return index

    def _indexed(self, key: Key) -> None:
        """A key written for the first time, into every index built so far."""
        for bound, index in self.indexes.items():
            index.setdefault(tuple([key[i] for i in bound]), []).append(key)

    def preloaded(self, key: Key, value: Any) -> None:
        """An entry's value before every timestamp (nothing written yet)."""
        if key not in self.latest:
            self._indexed(key)
        self.base[key] = self.current[key] = value
        self.latest[key] = BEFORE_ALL

    def fold(self, cut: int) -> None:
        """Garbage collection at a committed cut: the writes up to it become the base."""
        current, base = self.current, self.base
        for key in list(self.history):
            entries = self.history[key]
            if entries[-1][0][0] <= cut:  # every write folds: the base is the newest value
                value = current.get(key)
                if value is None:  # zeros are not kept
                    base.pop(key, None)
                else:
                    base[key] = value
                del self.history[key]
                continue
            split = bisect.bisect_left(entries, (cut + 1, -1), key=lambda e: e[0])
            for _, delta in entries[:split]:
                accumulate(base, key, delta)
            if split == len(entries):
                del self.history[key]
            elif split:
                self.history[key] = entries[split:]

    def entries(self) -> int:
        return sum(len(h) for h in self.history.values())


def accumulate(values: dict[Key, Any], key: Key, delta: Any) -> None:
    value = add(values.get(key, 0), delta)
    if value != 0:
        values[key] = value
    else:
        values.pop(key, None)
