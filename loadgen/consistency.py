"""How consistent a view's reads are under load: each read (its rows, and the timestamp it says
they are consistent at) is compared with the exact answer at that timestamp. The exact answer
comes from what the benchmark itself committed: every event's group, cost and commit
timestamp, above a baseline read at a snapshot before the load (only the benchmark writes
events meanwhile). A read is exact when every group equals the answer; otherwise its error is
the largest difference of a group's cost and of its count.

Pure: the benchmark records, this module judges, after the load, once every commit that
counts has been acknowledged."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal

Group = tuple[str, str]
Totals = dict[Group, tuple[Decimal, int]]


@dataclass
class Ledger:
    baseline: Totals
    baseline_ts: int
    events: list[tuple[int, Group, Decimal]] = field(default_factory=list)
    unknown: int = 0  # transactions whose outcome the client does not know: judge with care

    def add(self, ts: int, group: Group, cost: Decimal) -> None:
        self.events.append((ts, group, cost))


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
    events = sorted(ledger.events, key=lambda e: e[0])
    exact_now: Totals = dict(ledger.baseline)
    applied = 0
    count = exact = 0
    cost_error, count_error = Decimal(0), 0
    for ts, seen in sorted(reads, key=lambda r: r[0]):
        while applied < len(events) and events[applied][0] <= ts:
            _, group, cost = events[applied]
            total, n = exact_now.get(group, (Decimal(0), 0))
            exact_now[group] = (total + cost, n + 1)
            applied += 1
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
