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
    and the deltas written after that cut, by key and timestamp; a key's value at the cut is
    kept (``base``) only while it has deltas after the cut, so that committing a cut is
    dropping what it folds, not copying it. Slices with open key positions are answered from
    an index on the bound positions, built on first use.

    A key's newest write is the last of its deltas since the cut (a key with none was last
    written at or below the cut, before every timestamp still read), so a write touches two
    dicts: its history and the current values."""

    __slots__ = ("base", "current", "history", "indexes", "newest")

    def __init__(self) -> None:
        self.current: dict[Key, Any] = {}
        # the value at the committed cut of each key written since (``history``'s keys)
        self.base: dict[Key, Any] = {}
        self.history: dict[Key, list[tuple[Timestamp, Any]]] = {}
        self.newest: Timestamp = BEFORE_ALL  # the newest write to any key
        # bound positions -> their values -> the keys having them (a dict as an ordered set:
        # a key that went to zero and is written again is added once)
        self.indexes: dict[tuple[int, ...], dict[Key, dict[Key, None]]] = {}

    def write(self, key: Key, delta: Any, ts: Timestamp) -> None:
        self.write_all(((key, delta),), ts)

    def write_all(self, deltas: Iterable[tuple[Key, Any]], ts: Timestamp) -> int:
        """Every non-zero delta of one update's result (its ``items()``), written at ``ts``
        (the runtime's busiest loop: the lookups are hoisted out of it); how many were."""
        history, current, base, written = self.history, self.current, self.base, 0
        for key, delta in deltas:
            if delta == 0:
                continue
            written += 1
            deltas_of = history.get(key)
            old = current.get(key)
            if deltas_of is None:  # its first write since the cut: keep its value there
                history[key] = [(ts, delta)]
                if old is None:  # maybe never written: into the indexes (a set: once)
                    if self.indexes:
                        self._indexed(key)
                else:
                    base[key] = old
            elif deltas_of[-1][0] <= ts:  # in timestamp order, as nearly every write is
                deltas_of.append((ts, delta))
            else:
                bisect.insort(deltas_of, (ts, delta), key=_at)
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
        if written and self.newest < ts:
            self.newest = ts
        return written

    def value_before(self, key: Key, ts: Timestamp) -> Any:
        deltas_of = self.history.get(key)
        if deltas_of is None or deltas_of[-1][0] < ts:
            return self.current.get(key, 0)
        value: Any = self.base.get(key, 0)
        for at, delta in deltas_of:
            if at >= ts:
                break
            value = add(value, delta)
        return value

    def value_at(self, key: Key, cut: int) -> Any:
        """The value once every write with a timestamp counter up to ``cut`` is in."""
        return self.value_before(key, (cut + 1, -1))

    def keys(self) -> Iterable[Key]:
        """Every key whose value may be non-zero at a timestamp after the committed cut."""
        return self.current.keys() | self.history.keys()

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
        current = self.current
        candidates: Iterable[Key]
        if bound:
            candidates = self.index(bound).get(tuple([pattern[i] for i in bound]), ())
        elif self.newest < ts:
            return dict(current)
        else:
            candidates = self.keys()
        if self.newest < ts:  # nothing written at or after ts: the newest values (not zeros)
            return {key: current[key] for key in candidates if key in current}
        found = {}
        history = self.history
        for key in candidates:
            deltas_of = history.get(key)
            if deltas_of is None or deltas_of[-1][0] < ts:  # the newest value
                value = current.get(key)
                if value is not None:  # zeros are not kept
                    found[key] = value
                continue
            value = self.value_before(key, ts)
            if value != 0:
                found[key] = value
        return found

    def index(self, bound: tuple[int, ...]) -> dict[Key, dict[Key, None]]:
        """The keys that may be non-zero, by their values at the ``bound`` positions (kept as
        keys are written: one built here stays current; a key that went to zero may stay)."""
        index = self.indexes.get(bound)
        if index is None:
            index = self.indexes[bound] = {}
            for key in self.keys():
                index.setdefault(tuple([key[i] for i in bound]), {})[key] = None
        return index

    def _indexed(self, key: Key) -> None:
        """A key that may be written for the first time, into every index built so far."""
        for bound, index in self.indexes.items():
            values = (key[bound[0]],) if len(bound) == 1 else tuple([key[i] for i in bound])
            keys = index.get(values)
            if keys is None:
                index[values] = {key: None}
            else:
                keys[key] = None

    def preloaded(self, key: Key, value: Any) -> None:
        """An entry's value before every timestamp (nothing written yet)."""
        if key not in self.current:
            self._indexed(key)
        self.current[key] = value

    def fold(self, cut: int) -> None:
        """Garbage collection at a committed cut: the deltas up to it are dropped, their sum
        kept only for a key with deltas after the cut."""
        if self.newest[0] <= cut:  # every delta folds: the current values are the cut's
            self.history, self.base = {}, {}
            return
        history, base = self.history, self.base
        for key in list(history):
            entries = history[key]
            if entries[-1][0][0] <= cut:
                del history[key]
                base.pop(key, None)
                continue
            split = bisect.bisect_left(entries, (cut + 1, -1), key=_at)
            if split:
                value = base.get(key, 0)
                for _, delta in entries[:split]:
                    value = add(value, delta)
                if value != 0:
                    base[key] = value
                else:
                    base.pop(key, None)
                history[key] = entries[split:]

    def at_cut(self) -> dict[Key, Any]:
        """Every non-zero value at the committed cut."""
        history = self.history
        values = {key: value for key, value in self.current.items() if key not in history}
        values.update(self.base)
        return values

    def entries(self) -> int:
        return sum(len(h) for h in self.history.values())


def _at(entry: tuple[Timestamp, Any]) -> Timestamp:
    return entry[0]


def accumulate(values: dict[Key, Any], key: Key, delta: Any) -> None:
    value = add(values.get(key, 0), delta)
    if value != 0:
        values[key] = value
    else:
        values.pop(key, None)
