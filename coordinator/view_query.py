"""The query layer over a view's stored state: slice and dice (conditions on group columns),
roll-up (fewer group columns) and drill-down (back to the view's own), exact.

A roll-up adds up the groups' states, not their finished values: SUM and COUNT add, AVG comes
from the summed hidden sum and count, MIN, MAX and COUNT(DISTINCT) from the merged multisets.
So each rolled-up column is what the view's aggregate would give over the coarser groups, and
nothing is approximated. Conditions that fix leading group columns (equalities, IN lists) become
lookups or key-prefix reads; the rest filter the groups read. Pure: ``ViewManager.query`` does
the reading.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aggview import errors
from aggview.merge import combine
from cumulus.aggstate import Row, ViewState
from cumulus.plan import MULTIPLICITY, ViewPlan

MAX_LOOKUPS = 1000  # prefixes an IN list may expand to before the view is read by range


@dataclass(frozen=True)
class Condition:
    """A test on one group column: ``op`` is "=", "in", "between", "<", "<=", ">", ">=",
    "!=" or "is null"."""

    column: str
    op: str
    value: Any = None
    high: Any = None

    def holds(self, value: Any) -> bool:
        if self.op == "is null":
            return value is None
        if value is None:
            return False
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        if self.op == "in":
            return value in self.value
        if self.op == "between":
            return self.value <= value <= self.high
        return {
            "<": value < self.value,
            "<=": value <= self.value,
            ">": value > self.value,
            ">=": value >= self.value,
        }[self.op]


def check(
    state: ViewState, name: str, conditions: Sequence[Condition], keep: Sequence[str] | None
) -> None:
    """Refuses, naming it, what the view cannot answer."""
    groups = [g.name for g in state.plan.group_by]
    outputs = list(state.plan.output)
    for condition in conditions:
        if condition.column not in outputs:
            raise errors.UnknownColumn(
                f"materialized view {name} has no column {condition.column!r}"
            )
    if keep is None:  # the view's own groups
        return
    for column in keep:
        if column not in groups:
            raise errors.InvalidArgument(
                f"cannot group materialized view {name} by {column!r}: its groups are by "
                f"{', '.join(groups) or 'nothing'}"
            )
    if len(keep) < len(groups) and state.having is not None:
        raise errors.InvalidArgument(
            f"materialized view {name} keeps only the groups its HAVING accepts: a roll-up of "
            "them is not an aggregate of the data"
        )


def prefixes(state: ViewState, conditions: Sequence[Condition]) -> list[list[Any]] | None:
    """The values of the leading group columns that every answer must have, each an encoded
    key prefix to read (None: no column is fixed, read the whole view)."""
    fixed: list[list[Any]] = []
    by_column = {c.column: c for c in conditions}
    for group in state.plan.group_by:
        condition = by_column.get(group.name)
        if condition is None or condition.op not in ("=", "in"):
            break
        values = [condition.value] if condition.op == "=" else list(dict.fromkeys(condition.value))
        fixed.append(values)
    if not fixed:
        return None
    combos = [list(c) for c in itertools.product(*fixed)]
    return combos if len(combos) <= MAX_LOOKUPS else None


def answer(
    state: ViewState,
    groups: Mapping[bytes, Row],
    conditions: Sequence[Condition],
    keep: Sequence[str] | None,
    counted: bool = False,
) -> list[dict[str, Any]]:
    """The rows of the view's groups that meet ``conditions``, rolled up to ``keep`` (None:
    the view's own groups), in the view's column order with the dropped group columns left
    out. A bag view's row comes as many times as it counts (``counted``: once, with its
    count as ``MULTIPLICITY``); rolled up, a bag or distinct view's rows are the distinct
    values of the kept columns, as SQL's GROUP BY of them."""
    group_names = [g.name for g in state.plan.group_by]
    kept = group_names if keep is None else list(keep)
    bag = state.plan.shape == "bag"
    on_groups = [c for c in conditions if c.column in group_names]
    on_values = [c for c in conditions if c.column not in group_names]
    rolled: dict[tuple[Any, ...], tuple[bytes, Row]] = {}
    for key, group in groups.items():
        values = state.decode_group(key)
        if not all(c.holds(values.get(c.column)) for c in on_groups):
            continue
        coarse = tuple(values[n] for n in kept)
        if coarse in rolled:
            first, total = rolled[coarse]
            rolled[coarse] = (first, combine(total, group))
        else:
            rolled[coarse] = (key, group)
    out = []
    for coarse, (key, total) in rolled.items():
        row = state.finalize(key, total)
        if row is None or not all(c.holds(row.get(c.column)) for c in on_values):
            continue
        row.update(zip(kept, coarse, strict=True))
        row = {n: v for n, v in row.items() if n in kept or n not in group_names}
        copies = int(total.get("_count", 0)) if bag and keep is None else 1
        if counted and bag and keep is None:
            out.append({**row, MULTIPLICITY: copies})
        else:
            out += [dict(row) for _ in range(copies)]
    return sorted(out, key=lambda r: [(r[n] is None, 0 if r[n] is None else r[n]) for n in kept])


def counted_rows(
    plan: ViewPlan, rows: Sequence[dict[str, Any]], keep: Sequence[str] | None
) -> list[dict[str, Any]]:
    """Rows as read (a bag view's repeated) -> as a counted read gives them: a bag view's
    equal rows once, with their number as ``MULTIPLICITY``."""
    if plan.shape != "bag" or keep is not None:
        return list(rows)
    counts: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        key = tuple(row.items())
        if key in counts:
            counts[key][MULTIPLICITY] += 1
        else:
            counts[key] = {**row, MULTIPLICITY: 1}
    return list(counts.values())
