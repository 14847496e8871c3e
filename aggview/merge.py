"""The refresh operator's arithmetic on one view row (Algorithm 5.3), schema-agnostic.

A view row is a dict of aggregate state: numbers (``_count``, sums, counts) add, and dicts are
ordered multisets {value: multiplicity} (for MIN, MAX, COUNT DISTINCT) whose entries add and
vanish at zero. Merges commute, so concurrent transactions that hit the same group never wait
for each other; a row whose ``_count`` reaches 0 is deleted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aggview.partition_map import group_of

Row = dict[str, Any]


def combine(delta: Row, more: Row) -> Row:
    """Two deltas as one (zeros kept: a delta is not a row)."""
    out = dict(delta)
    for field, change in more.items():
        if isinstance(change, dict):
            multiset = dict(out.get(field) or {})
            for value, count in change.items():
                multiset[value] = multiset.get(value, 0) + count
            out[field] = multiset
        else:
            out[field] = out.get(field, 0) + change
    return out


def accumulate(total: Row, more: Row) -> None:
    """Adds ``more`` into ``total`` in place, as ``combine`` would: for a sum of many deltas
    (a view computed from scratch), where copying a group's multiset for every joined tuple
    made MIN, MAX and COUNT(DISTINCT) quadratic in the group's distinct values. ``total``'s
    multisets must be its own: built here (copied from ``more`` when first seen)."""
    for field, change in more.items():
        if isinstance(change, dict):
            multiset = total.get(field)
            if multiset is None:
                total[field] = dict(change)
                continue
            for value, count in change.items():
                multiset[value] = multiset.get(value, 0) + count
        else:
            total[field] = total.get(field, 0) + change


def negate(delta: Row) -> Row:
    """The delta that undoes ``delta`` (every number and multiplicity negated)."""
    return {
        field: {v: -n for v, n in change.items()} if isinstance(change, dict) else -change
        for field, change in delta.items()
    }


def normalized(fields: Row) -> Row:
    """A state with its zero counters and empty multisets dropped, for comparisons: a group
    maintained through deletes may keep ``n0: 0`` where a fresh computation has no field."""
    out: Row = {}
    for name, value in fields.items():
        if isinstance(value, dict):
            value = {v: n for v, n in value.items() if n}
        if value:
            out[name] = value
    return out


def merge(row: Row | None, delta: Row) -> Row | None:
    """Applies a delta to a view row; None in and out means the group has no rows.

    Nothing is lost: a sum whose ``_count`` is 0 while other fields are not is kept whole (a
    delta committed before an older one it depends on, e.g. deleting a row the older one
    inserted), so the older delta still adds up exactly; ``RowState.settle`` deletes such a
    row once no older delta is pending."""
    merged = combine(row or {}, delta)
    for field, value in merged.items():
        if isinstance(value, dict):
            merged[field] = {v: n for v, n in value.items() if n}
    if not any(merged.values()):
        return None
    return merged


def gather(rows: Iterable[tuple[bytes, Row]], partials: bool) -> dict[bytes, Row]:
    """A view's groups from its stored rows: as they are, or, for a view kept as partial rows
    (``aggview.partition_map``), each group's partials added up (a group whose partials cancel
    out is absent)."""
    if not partials:
        return dict(rows)
    groups: dict[bytes, Row] = {}
    for key, row in rows:
        group = group_of(key)
        groups[group] = combine(groups.get(group, {}), row)
    return {g: kept for g, row in groups.items() if (kept := merge(None, row)) is not None}
