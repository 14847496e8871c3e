"""What a materialized view is on the coordinator (``View``), and the pure helpers every job of
the view manager shares (``coordinator.views``): the meta row, the changes a view reads."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aggview.merge import gather
from aggview.partition_map import changes_table, partial_key
from aggview.rowcodec import decode_row, encode_row
from aggview.schema import TableSchema
from aggview.wire import ltm_pb2 as lpb
from cumulus.aggstate import Row, ViewState
from cumulus.plan import ViewPlan

if TYPE_CHECKING:
    import itertools
    from pathlib import Path

    from aggview.security import TlsDir
    from coordinator.catalog import Catalog
    from coordinator.cumulus_view import CumulusView
    from coordinator.leader_views import LeaderReads
    from coordinator.transactions import TransactionManager

META_KEY = b"\x01"  # the one row of a view's meta table


@dataclass
class View:
    plan: ViewPlan
    number: int
    # "initializing": its rows are being computed, changes are captured, reads are refused;
    # "draining" (sync views only, briefly): transactions already maintain it and the changes
    # captured during initialization are applied once, reads still refused; "live": readable.
    # Only "initializing" and "live" are persisted ("draining" restarts as "initializing").
    state: str
    snapshot: int = 0  # changes at or below this are in the initial computation
    # a draining sync view: the last timestamp whose transactions captured their changes instead
    # of maintaining it; the drain evaluates those changes against the tables at it (later
    # transactions maintain the view themselves, against tables that hold the captured changes)
    drain_cut: int = 0
    compiled: ViewState | None = field(default=None, repr=False)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    refresher: asyncio.Task[None] | None = field(default=None, repr=False)
    external: ExternalInit | None = field(default=None, repr=False)
    # Kept as partial rows, one per partition that changed a group (see DECISIONS, Views);
    # views created before partial rows keep one row per group.
    partials: bool = False
    # ALTER ... SET (refresh = ...) is under way: no member refreshes it (in every member's
    # configuration: a refresh elsewhere could drain changes a new runtime needs)
    switching: bool = False
    # a sync view switching to cumulus captures its changes too (in every member's
    # configuration): the runtime loads a snapshot taken after capture started
    also_captures: bool = False
    # a runtime fed by the members' switches was just loaded: change rows captured before
    # (as an async view, while switching, while initializing) are deleted by its first epoch
    leftovers: bool = False

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def view_id(self) -> str:
        return f"{'u' if self.partials else 'v'}{self.number}_{self.name}"

    def merge(self, key: bytes, delta: Row, home: int) -> lpb.RowOp:
        """The operation adding ``delta`` to group ``key``: with partial rows, to the group's
        row on partition ``home`` (one the transaction writes anyway, so the view adds no
        participant; any other when none is)."""
        if self.partials:
            key = partial_key(key, home)
        return lpb.RowOp(
            kind=lpb.RowOp.MERGE, table=self.view_id, key=key, values=encode_row(delta)
        )

    def groups(self, rows: Iterable[tuple[bytes, bytes]]) -> dict[bytes, Row]:
        """Each group's state from the view's stored rows."""
        return gather(((key, decode_row(data) or {}) for key, data in rows), self.partials)

    @property
    def meta_id(self) -> str:
        return f"w{self.number}_{self.name}"

    def changes_id(self, table: TableSchema) -> str:
        return changes_table(self.number, table.table_id)

    @property
    def captures(self) -> bool:
        return self.plan.mode != "sync" or self.state == "initializing" or self.also_captures

    def to_json(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_json(),
            "number": self.number,
            "state": self.state,
            "snapshot": self.snapshot,
            "partials": self.partials,
        }

    def configured(self) -> dict[str, Any]:
        """What a member runs under: what is persisted, and the switch's flags."""
        return {**self.to_json(), "switching": self.switching, "also_captures": self.also_captures}


@dataclass
class ExternalInit:
    """A view being computed outside the coordinator (a Spark job) over a held snapshot."""

    snapshot: int
    created: bool  # a new view (forgotten if the job fails) or an existing one recomputed


def meta_row(view: View, *, refreshed_at: int) -> lpb.RowOp:
    return lpb.RowOp(
        kind=lpb.RowOp.PUT,
        table=view.meta_id,
        key=META_KEY,
        values=encode_row({"refreshed_at": refreshed_at}),
    )


class ViewsShared:
    """The state the view manager's jobs share (``coordinator.views.ViewManager`` sets it up;
    each job, ``ViewDdl``, ``ViewInit``, ``ViewMaintenance``, ``ViewRefresh`` and ``ViewReads``,
    is a base class of it)."""

    manager: TransactionManager
    catalog: Catalog
    views: dict[str, View]
    indexes: dict[tuple[str, str], str]  # (table, column) -> index table id
    # cumulus views' runtimes, at the leader (or the one coordinator) only
    runtimes: dict[str, CumulusView]
    runtime_dir: Path | None  # where runtimes hosted in processes keep their nodes' files
    tls: TlsDir | None  # how those nodes are reached
    leader_reads: LeaderReads  # a follower's cumulus view reads
    _ddl: asyncio.Lock  # one CREATE, ALTER, DROP or external initialization at a time
    _watched: tuple[int, set[str]]  # (epoch, the store tables watched under it)
    _runtimes_started: itertools.count[int]
