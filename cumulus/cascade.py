"""Maintenance over views of views: one batch of base-row changes through every view, in
order (a view after the views it reads), each view's row changes becoming the input changes
of the views over it.

A view's rows as a view over it reads them move from ``view_row(before)`` to
``view_row(before + delta)`` for each group its delta touches; ``before`` is the group's stored
state (read by the caller at the batch's snapshot, as its own read: a sync transaction's read
keeps older writers of those rows off them) plus what this transaction merged in earlier
rounds (``own``). Sync maintenance, async refreshes over a sync view and the tests' refresh
operator run this one function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from aggview.merge import combine
from cumulus.aggstate import Row, ViewState
from cumulus.delta import Changes, RowsWhere, touching, view_delta
from cumulus.view_rows import GroupReader, RowChanges, row_changes

# view name -> group key -> merge delta
Deltas = dict[str, dict[bytes, Row]]


async def cascade(
    maintained: Iterable[ViewState],
    changes: Changes,
    rows_where: RowsWhere,
    read: GroupReader,
    read_by: set[str],
    own: Deltas | None = None,
    measured: Callable[[str], None] | None = None,
) -> tuple[Deltas, dict[str, RowChanges]]:
    """Each maintained view's delta (in the order given: inner views first) and the row
    changes of the views in ``read_by`` (those some view reads). ``rows_where`` serves views
    read as tables too (``cumulus.view_rows.with_views``); ``own`` (updated) is what this
    transaction merged before; ``measured(name)`` is called as each view's delta is done."""
    own = {} if own is None else own
    changes = dict(changes)
    deltas: Deltas = {}
    moved: dict[str, RowChanges] = {}
    for state in maintained:
        name = state.plan.name
        relevant = touching(state.plan, changes)
        if not relevant:
            continue
        delta = await view_delta(state, relevant, rows_where)
        if measured is not None:
            measured(name)
        if not delta:
            continue
        deltas[name] = delta
        if name not in read_by:
            continue
        mine = own.setdefault(name, {})
        stored = await read(name, list(delta))
        before = {key: combine(stored.get(key, {}), mine.get(key, {})) for key in delta}
        moved[name] = row_changes(state, before, delta)
        if moved[name]:
            changes[name] = moved[name]
        for key, change in delta.items():
            mine[key] = combine(mine.get(key, {}), change)
    return deltas, moved
