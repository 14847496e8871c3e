"""Reading a view off the Cumulus runtime with hybrid consistency (seed 000 §3.4, seed 003 §5):

- ``committed``: the last committed epoch's snapshot, exact, with its cut (every update whose
  timestamp counter is at most the cut is in, none after);
- ``tentative``: the newest values on every node; lowest latency, but may mix timestamps (an
  update half applied, a correction not yet in), so it carries no timestamp.

A read may slice (equality or a set of values per group column) and roll up to fewer group
columns when every aggregate is one whose values roll up (``Rule.rollup``: SUM, COUNT, MIN,
MAX); AVG and COUNT(DISTINCT) are named as not derivable from rows.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aggview import errors
from cumulus.aggregates import RULES
from cumulus.m3.program import Program, View
from cumulus.m3.readout import read_view
from cumulus.runtime.messages import Key
from cumulus.runtime.simulator import holding

CONSISTENCIES = ("committed", "tentative")


class Runtime(Protocol):
    program: Program

    def maps(self) -> dict[str, dict[Key, Any]]: ...

    def snapshot(self, cut: int | None = None) -> tuple[int, dict[str, dict[Key, Any]]]: ...


@dataclass(frozen=True)
class ViewRead:
    rows: list[dict[str, Any]]
    consistency: str
    ts: int | None  # the committed cut; None for a tentative read


def read(
    runtime: Runtime,
    view: str,
    *,
    consistency: str = "committed",
    where: Mapping[str, Any] | None = None,
    group_by: Sequence[str] | None = None,
) -> ViewRead:
    views = {v.name: v for v in runtime.program.views}
    if view not in views:
        raise errors.UnknownTable(f"no Cumulus view {view!r} (views: {', '.join(sorted(views))})")
    if consistency not in CONSISTENCIES:
        raise errors.InvalidArgument(
            f"consistency is one of {', '.join(CONSISTENCIES)}, not {consistency!r}"
        )
    shape = views[view]
    keys = [k for k, _ in shape.keys]
    _check_columns(shape, keys, where or {}, group_by)
    if consistency == "committed":
        ts, maps = runtime.snapshot()
    else:
        ts, maps = None, runtime.maps()
    rows = [r for r in read_view(holding(runtime.program, maps), shape) if _in(r, where or {})]
    if group_by is not None:
        rows = _roll_up(shape, rows, list(group_by))
    return ViewRead(rows, consistency, ts)


def _check_columns(
    view: View, keys: list[str], where: Mapping[str, Any], group_by: Sequence[str] | None
) -> None:
    for column in where:
        if column not in keys:
            raise errors.InvalidArgument(
                f"{view.name} can be sliced on its group columns ({', '.join(keys)}), "
                f"not on {column!r}"
            )
    if group_by is None:
        return
    for column in group_by:
        if column not in keys:
            raise errors.InvalidArgument(
                f"{view.name} rolls up to some of its group columns ({', '.join(keys)}), "
                f"not {column!r}"
            )
    for column in view.columns:
        if column.expr is not None and not column.hidden:
            raise errors.InvalidArgument(
                f"{view.name}.{column.name} is an expression over aggregates: it cannot be "
                "rolled up from the view's rows"
            )
        if column.kind is not None and RULES[column.kind].rollup is None and not column.hidden:
            raise errors.InvalidArgument(
                f"{view.name}.{column.name} is {column.kind.name}: it cannot be rolled up from the "
                "view's rows (only SUM, COUNT, MIN and MAX add up)"
            )


def _in(row: Mapping[str, Any], where: Mapping[str, Any]) -> bool:
    for column, wanted in where.items():
        if isinstance(wanted, Collection) and not isinstance(wanted, str | bytes):
            if row[column] not in wanted:
                return False
        elif row[column] != wanted:
            return False
    return True


def roll_up(view: View, rows: list[dict[str, Any]], group_by: list[str]) -> list[dict[str, Any]]:
    """The view's rows added up to ``group_by`` (some of its group columns); a column that
    does not add up from rows (AVG, COUNT(DISTINCT)) is named in the error."""
    _check_columns(view, [k for k, _ in view.keys], {}, group_by)
    return _roll_up(view, rows, group_by)


def _roll_up(view: View, rows: list[dict[str, Any]], group_by: list[str]) -> list[dict[str, Any]]:
    rules = {c.name: RULES[c.kind] for c in view.columns if c.kind is not None and not c.hidden}
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        key = tuple(row[c] for c in group_by)
        total = out.get(key)
        if total is None:
            out[key] = {**{c: row[c] for c in group_by}, **{c: row[c] for c in rules}}
            continue
        for column, rule in rules.items():
            total[column] = rule.combine_values(total[column], row[column])
    return list(out.values())
