"""How consistent a view's reads are under load: each read (its rows, and the timestamp it says
they are consistent at) is compared with the exact answer at that timestamp. The exact answer
comes from what the benchmark itself committed: every event's group, cost and commit
timestamp, above a baseline read at a snapshot before the load (only the benchmark writes
events meanwhile). An event may belong to an item (a product) whose group changes when the item
moves (to another category): a move carries the item's whole total, baseline included, from
its old group to its new one at the move's timestamp. A read is exact when every group equals
the answer; otherwise its error is the largest difference of a group's cost and of its count.

Pure: the benchmark records, this module judges, after the load, once every commit that
counts has been acknowledged."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

Group = tuple[str, str]
Totals = dict[Group, tuple[Decimal, int]]


@dataclass
class Ledger:
    baseline: Totals
    baseline_ts: int
    events: list[tuple[int, Group, Decimal]] = field(default_factory=list)
    unknown: int = 0  # transactions whose outcome the client does not know: judge with care
    # Items (products) whose group changes: each one's (first part of its group, category) at
    # the baseline, the categories' names (unique), and each item's totals at the baseline
    # (counted in ``baseline`` too). An item's group is (first part, its category's name).
    placement: dict[Any, tuple[str, Any]] = field(default_factory=dict)
    names: dict[Any, str] = field(default_factory=dict)
    item_baseline: dict[Any, tuple[Decimal, int]] = field(default_factory=dict)
    changes: list[tuple[int, int, Any, Any]] = field(default_factory=list)

    def add(self, ts: int, group: Group, cost: Decimal) -> None:
        """An event in a group that never moves."""
        self.events.append((ts, group, cost))

    def add_to(self, ts: int, item: Any, cost: Decimal) -> None:
        """An event of ``item``: it counts in the item's group of the moment."""
        self.changes.append((ts, _ITEM_EVENT, item, cost))

    def move(self, ts: int, item: Any, category: Any) -> None:
        """``item`` (with everything counted for it so far) is in ``category`` from ``ts``."""
        self.changes.append((ts, _MOVE, item, category))

    def rename(self, ts: int, category: Any, name: str) -> None:
        """``category``'s groups are called ``name`` from ``ts``."""
        self.changes.append((ts, _RENAME, category, name))


_EVENT, _ITEM_EVENT, _MOVE, _RENAME = range(4)


class _Replay:
    """The exact answer, advanced through the ledger's changes in timestamp order."""

    def __init__(self, ledger: Ledger) -> None:
        self.totals: Totals = dict(ledger.baseline)
        self.placement = dict(ledger.placement)
        self.names = dict(ledger.names)
        self.items = dict(ledger.item_baseline)
        changes = [(ts, _EVENT, group, cost) for ts, group, cost in ledger.events]
        self.changes = sorted(changes + ledger.changes, key=lambda c: (c[0], c[1]))
        self.applied = 0

    def until(self, ts: int) -> Totals:
        """The exact answer at ``ts``."""
        changes = self.changes
        while self.applied < len(changes) and changes[self.applied][0] <= ts:
            _, kind, subject, value = changes[self.applied]
            if kind == _EVENT:
                self._bump(subject, value, 1)
            elif kind == _ITEM_EVENT:
                self._bump(self._group(subject), value, 1)
                cost, n = self.items.get(subject, (Decimal(0), 0))
                self.items[subject] = (cost + value, n + 1)
            elif kind == _MOVE:
                cost, n = self.items.get(subject, (Decimal(0), 0))
                if n:
                    self._bump(self._group(subject), -cost, -n)
                self.placement[subject] = (self.placement[subject][0], value)
                if n:
                    self._bump(self._group(subject), cost, n)
            else:
                old, self.names[subject] = self.names[subject], value
                for group in [g for g in self.totals if g[1] == old]:
                    self.totals[(group[0], value)] = self.totals.pop(group)
            self.applied += 1
        return self.totals

    def _group(self, item: Any) -> Group:
        first, category = self.placement[item]
        return first, self.names[category]

    def _bump(self, group: Group, cost: Decimal, n: int) -> None:
        total, count = self.totals.get(group, (Decimal(0), 0))
        if count + n:
            self.totals[group] = (total + cost, count + n)
        else:
            self.totals.pop(group, None)  # a group without rows is not in the view


@dataclass(frozen=True)
class Verdict:
    reads: int
    exact: int
    max_cost_error: Decimal
    max_count_error: int

    @property
    def share(self) -> float | None:
        """The share of reads equal to the exact answer at their timestamp (None: no read)."""
        return self.exact / self.reads if self.reads else None


def judge(ledger: Ledger, reads: Iterable[tuple[int, Totals]]) -> Verdict:
    """Every read against the exact answer at its timestamp (a read older than the baseline
    against the baseline: nothing of the benchmark's was committed before it)."""
    replay = _Replay(ledger)
    count = exact = 0
    cost_error, count_error = Decimal(0), 0
    for ts, seen in sorted(reads, key=lambda r: r[0]):
        exact_now = replay.until(ts)
        count += 1
        if seen == exact_now:
            exact += 1
            continue
        for group in seen.keys() | exact_now.keys():
            got = seen.get(group, (Decimal(0), 0))
            want = exact_now.get(group, (Decimal(0), 0))
            cost_error = max(cost_error, abs(got[0] - want[0]))
            count_error = max(count_error, abs(got[1] - want[1]))
    return Verdict(count, exact, cost_error, count_error)
