"""View subscriptions (``WatchView``): a view's changes streamed as they commit.

The server reads the (sliced) view from one snapshot every ``interval`` and sends what changed
since the last read, group by group, with the snapshot's timestamp: the subscriber's copy with
those changes applied is exactly the view at that timestamp. Commits between two reads arrive
together (for an async view, one read per refresh: its timestamp only moves then). The first
message, and the first after a reconnect, is the whole view marked ``reset`` (it replaces the
copy): row versions between the copy's timestamp and now may be gone, and a whole state is the
one way to lose nothing and count nothing twice.

A bag view's (a view without aggregates) equal rows are one group: its row carries their number
as ``__count`` (``cumulus.plan.MULTIPLICITY``), the copy holding each row once with it.

A view with GROUP BY columns its SELECT does not show (a top-level UNION ALL's branch, or a
column grouped by but not selected) may read two rows with the same shown groups: their key is
the shown groups and ``__row``, each row's place among those equal ones in the read.

A subscriber that does not take a message within the ``watch_stall_seconds`` limit is dropped
with RESOURCE_EXHAUSTED saying so: the server holds one message per subscriber (beyond what
HTTP/2 flow control lets the transport hold), never more.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from typing import Any

from aggview import errors
from aggview.values import to_row
from aggview.wire import client_pb2 as cpb
from coordinator.transactions import TransactionManager

DEFAULT_INTERVAL = 0.05
PLACE = "__row"  # a row's place among the rows of equal shown groups (see above)

Rows = dict[tuple[Any, ...], dict[str, Any]]


def keyed(rows: list[dict[str, Any]], groups: list[str]) -> Rows:
    """Rows by their groups' values; with ``__row`` last, by their place among equal ones."""
    if not groups or groups[-1] != PLACE:
        return {tuple(row[g] for g in groups): row for row in rows}
    places: Counter[tuple[Any, ...]] = Counter()
    out: Rows = {}
    for row in rows:
        shown = tuple(row[g] for g in groups[:-1])
        out[(*shown, places[shown])] = row
        places[shown] += 1
    return out


def changes(old: Rows, new: Rows, groups: list[str]) -> list[cpb.GroupChange]:
    """What turns ``old`` into ``new``, one change per group that differs."""
    out = []
    for key in sorted(old.keys() | new.keys(), key=repr):
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        change = cpb.GroupChange(group=to_row(dict(zip(groups, key, strict=True))))
        if before is not None:
            change.old.CopyFrom(to_row(before))
        if after is not None:
            change.new.CopyFrom(to_row(after))
        out.append(change)
    return out


async def watch(
    manager: TransactionManager,
    name: str,
    where: Mapping[str, Any],
    interval: float,
    tentative: bool = False,
) -> AsyncIterator[cpb.ViewChanges]:
    """The messages of one subscription (see the module's docstring); ``tentative``: a
    cumulus view's newest values, a message as each feed reaches them (the others' reads are
    exact anyway)."""
    views = manager.views
    if views is None or name not in views.views:
        raise errors.UnknownTable(f"unknown materialized view {name!r}")
    plan = views.views[name].plan
    groups = [g.name for g in plan.group_by if g.name in plan.output]
    if len(groups) < len(plan.group_by):
        groups.append(PLACE)
    previous: Rows | None = None
    last_ts = 0
    while True:
        rows, ts, ahead = await views.read(name, dict(where), tentative=tentative, counted=True)
        current = keyed(rows, groups)
        if previous is None:
            found = changes({}, current, groups)
            yield cpb.ViewChanges(timestamp=ts, changes=found, reset=True, tentative=ahead)
        elif ts != last_ts:
            found = changes(previous, current, groups)
            if found:
                yield cpb.ViewChanges(timestamp=ts, changes=found, tentative=ahead)
        previous, last_ts = current, ts
        await asyncio.sleep(interval)
