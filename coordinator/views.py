"""Aggregate views on the coordinator: DDL, maintenance inside transactions, refreshes, reads.

- **sync** (Algorithm 5.1, §5.3.1): after the votes, the row images give ΔB; ΔV is computed with
  reads at the transaction's own timestamp and added as MERGE sub-transactions on the view rows,
  committed atomically with the base rows (and the secondary-index entries the joins need).
- **async** (Algorithm 5.2): the LTMs append each change to a change table of the view, beside
  the base row; a refresher runs one transaction every ``interval_ms`` that drains the change
  rows below its timestamp, computes ΔV against the tables at that timestamp and merges it.
- **initialization** over existing rows: changes are captured from the moment the view is
  declared; the view is computed from a snapshot, then the captured changes after the snapshot
  are drained, then the view goes live. Writers never stop.

View rows are keyed by the GROUP BY values; their state merges commutatively (``aggview.merge``),
so concurrent writers to one group never wait for each other.

The jobs, one module each (``ViewManager`` here keeps the state they share and the start, stop
and configuration of the views in a member):

- ``coordinator.view_model``: ``View`` and the helpers every job shares;
- ``coordinator.view_ddl``: CREATE, DROP, ALTER (mode switches);
- ``coordinator.view_init``: initialization over existing rows (Spark's too), index backfill;
- ``coordinator.view_maintenance``: sync maintenance and change capture (``ViewHooks``);
- ``coordinator.view_refresh``: the async refresher, cumulus runtimes and epochs;
- ``coordinator.view_switches``: cumulus views fed by a switch per member;
- ``coordinator.view_reads``: reads.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

from aggview import loops
from aggview.schema import TableSchema
from aggview.security import TlsDir
from coordinator.catalog import Catalog
from coordinator.cumulus_view import CumulusView
from coordinator.leader_views import LeaderReads
from coordinator.transactions import TransactionManager
from coordinator.view_ddl import ViewDdl
from coordinator.view_init import ViewInit
from coordinator.view_maintenance import ViewMaintenance
from coordinator.view_model import META_KEY, ExternalInit, View
from coordinator.view_reads import SWITCH_WAIT_S, ViewReads
from coordinator.view_refresh import ViewRefresh
from coordinator.view_stack import compile_all, relation
from cumulus.aggstate import ViewState
from cumulus.delta import touching
from cumulus.plan import ViewPlan

__all__ = ["META_KEY", "SWITCH_WAIT_S", "ExternalInit", "View", "ViewManager", "touching"]


class ViewManager(ViewDdl, ViewInit, ViewMaintenance, ViewRefresh, ViewReads):
    """A member's views: the state every job shares (the views, their indexes, the cumulus
    runtimes, the DDL lock) and their life in the member (start, stop, the configuration of
    each catalog epoch); each job is a module of its own, a base class here. It is the
    transaction path's ``ViewHooks`` (``coordinator.view_maintenance``)."""

    def __init__(
        self,
        manager: TransactionManager,
        runtime_dir: Path | None = None,
        tls: TlsDir | None = None,
    ) -> None:
        """``runtime_dir``: where cumulus views hosted in processes keep their nodes' files;
        ``tls``: how those nodes are reached."""
        self.manager = manager
        self.runtime_dir = runtime_dir
        self.tls = tls
        self.leader_reads = LeaderReads(tls)  # a follower's cumulus view reads
        self._runtimes_started = itertools.count()
        self.catalog: Catalog = manager.catalog
        self.views: dict[str, View] = {}
        self.indexes: dict[tuple[str, str], str] = {}  # (table, column) -> index table id
        self._ddl = asyncio.Lock()
        self._watched: tuple[int, set[str]] = (-1, set())
        # cumulus views' runtimes, at member 0 (or the one coordinator) only: in memory, so
        # loaded again from a snapshot after a restart (``_load_runtime``)
        self.runtimes: dict[str, CumulusView] = {}
        self._init_switches()
        self.follow_clock()

    def follow_clock(self) -> None:
        """The leader runs a dead member's share of refreshers (its clock says who), and
        loads the runtimes fed by the members' switches again once a member is lost (its
        adopted commits were never sent) or back."""
        if hasattr(self.manager.clock, "lost_changed"):
            self.manager.clock.lost_changed = self._lost_changed

    def _lost_changed(self) -> None:
        self._reconcile_refreshers()
        self._reload_switched("a member was lost or is back")

    # ------------------------------------------------------------------ start, stop

    async def start(self) -> None:
        self._dispatch_since = self.manager.clock.issued()
        for entry in self.catalog.entries("index"):
            self.indexes[(entry["table"], entry["column"])] = entry["index_id"]
        # in number order: a view is registered after the views it reads (its compiled
        # state reads their row schemas)
        for entry in sorted(self.catalog.entries("view"), key=lambda e: e["number"]):
            view = View(
                ViewPlan.from_json(entry["plan"]),
                entry["number"],
                entry["state"],
                partials=entry.get("partials", False),
            )
            view.snapshot = entry["snapshot"]
            self._register(view)
        self.publish()  # what other members run under, tables included
        for view in list(self.views.values()):
            if view.state != "live":  # the coordinator stopped while initializing it
                asyncio.get_running_loop().create_task(self._initialize(view, fresh=False))
            elif view.plan.mode == "cumulus" and self.manager.leader is None:
                asyncio.get_running_loop().create_task(self._reload_runtime(view))
            else:
                self._reconcile_refresher(view)

    async def lead(self) -> None:
        """This member took the lead from a dead one (``coordinator.leadership``). The
        catalog is the store's (the dead leader wrote every change there before publishing
        it); then as at a leader's start: cumulus runtimes load again from a snapshot, an
        initialization cut short starts over, and refreshers are shared out again."""
        here = [v.refresher for v in self.views.values() if v.refresher is not None]
        await asyncio.gather(*(loops.stop(refresher) for refresher in here))
        self.views, self.indexes = {}, {}
        self.catalog.reload()
        self.catalog.view_names.clear()
        await self.start()

    def _reconcile_refreshers(self) -> None:
        for view in list(self.views.values()):
            if view.state == "live":
                self._reconcile_refresher(view)

    def _reconcile_refresher(self, view: View) -> None:
        """Runs ``view``'s refresher here exactly when it is a live async view whose turn is
        here: refreshers are spread over the coordinating members, view number n at member
        n % P (member 0 alone when there are none), and the leader runs a dead member's share
        until it is back (two refreshes of one view at once are ordered by timestamp)."""
        if view.plan.mode == "cumulus":  # its runtime is at the leader
            here = view.name in self.runtimes
        else:
            home = view.number % (len(self.manager.members) or 1)
            lost = getattr(self.manager.clock, "lost", ())
            here = home == self.manager.member or (self.manager.leader is None and home in lost)
        wanted = view.state == "live" and view.plan.mode != "sync" and here and not view.switching
        running = view.refresher is not None and not view.refresher.done()
        if wanted and not running:
            self._start_refresher(view)
        elif running and not wanted:
            assert view.refresher is not None
            view.refresher.cancel()
            view.refresher = None

    async def stop(self) -> None:
        await asyncio.gather(
            *(loops.stop(v.refresher) for v in self.views.values() if v.refresher is not None)
        )
        runtimes, self.runtimes = list(self.runtimes.values()), {}
        await asyncio.gather(*(asyncio.to_thread(r.close) for r in runtimes))
        await self.leader_reads.close()
        if self.switch_link is not None:
            await self.switch_link.stop()

    def _register(self, view: View) -> None:
        self.views[view.name] = view
        view.compiled = ViewState(view.plan, lambda t: relation(self.views, self.catalog, t))
        self.catalog.view_names.add(view.name)
        self.publish()

    def publish(self) -> None:
        """A new catalog epoch: every transaction timestamped from now on runs under the
        tables, views and indexes as they are at this moment (other members get this very
        configuration with their next timestamps)."""
        self.manager.bump_epoch(self.configuration())
        self._dispatched_ids()  # this member's switch, if a view now needs it

    def configuration(self) -> dict[str, Any]:
        """What a member needs to run transactions: tables, indexes, views and their state."""
        return {
            "tables": [schema.to_json() for schema in self.catalog.tables.values()],
            "indexes": [
                {"table": t, "column": c, "index_id": i} for (t, c), i in self.indexes.items()
            ],
            "views": [v.configured() for v in self.views.values()],
        }

    def install(self, epoch: int, configuration: dict[str, Any]) -> None:
        """A follower member takes the leader's configuration of ``epoch``."""
        catalog = self.catalog
        schemas = [TableSchema.from_json(t) for t in configuration["tables"]]
        catalog.tables = {s.name: s for s in schemas}
        catalog.by_id = {s.table_id: s for s in schemas}
        self.indexes = {(e["table"], e["column"]): e["index_id"] for e in configuration["indexes"]}
        views = {}
        for entry in configuration["views"]:
            view = View(
                ViewPlan.from_json(entry["plan"]),
                entry["number"],
                entry["state"],
                partials=entry["partials"],
                snapshot=entry.get("snapshot", 0),
                switching=entry.get("switching", False),
                also_captures=entry.get("also_captures", False),
            )
            before = self.views.get(view.name)
            if before is not None and before.number == view.number:
                view.lock, view.refresher = before.lock, before.refresher  # the same view
            views[view.name] = view
        compile_all(views, catalog)
        for name, before in self.views.items():  # dropped, or now refreshed elsewhere
            if before.refresher is not None and (
                name not in views or views[name].refresher is not before.refresher
            ):
                before.refresher.cancel()
        self.views = views
        catalog.view_names = set(views)
        self.manager.epoch = epoch
        for view in views.values():  # this member's share of the async views' refreshes
            self._reconcile_refresher(view)
        self._dispatched_ids()  # this member's switch, if a view now needs it

    def _persist(self, view: View) -> None:
        self.catalog.put_entry("view", view.name, view.to_json())
