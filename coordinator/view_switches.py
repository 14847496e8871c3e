"""Cumulus views fed by a switch per coordinating member (issue #42; DECISIONS, "A switch per
coordinating member"): every member sends its own commits' changes of the tables such views
read as they commit (``coordinator.member_switch``); the leader, which holds the runtimes,
puts each member's changes into that member's switch of every view reading them, and ends an
epoch at T once every member said EPOCH END for T.

Views over views (subqueries' hidden views included) keep the drain into one switch
(``ViewRefresh._epoch``): their input is other views' row changes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from aggview.rowcodec import decode_row
from aggview.wire import ltm_pb2 as lpb
from coordinator.member_switch import SwitchLink
from coordinator.view_model import View, ViewsShared
from cumulus.plan import ViewPlan

log = logging.getLogger("coordinator.views")

EPOCH_WAIT = 30.0  # seconds an epoch waits for every member's EPOCH END before it reloads
Commits = list[tuple[int, list[tuple[str, Any, Any]]]]


def over_tables(views: Mapping[str, Any], plan: ViewPlan) -> bool:
    """Whether ``plan`` reads store tables only (no view): its runtime takes the members'
    switches."""
    return not any(table in views for table in plan.base_tables())


def dispatched(views: Mapping[str, View], view: View) -> bool:
    """A cumulus view over tables, or one becoming one: members send its tables' changes."""
    return (view.plan.mode == "cumulus" or view.also_captures) and over_tables(views, view.plan)


class ViewSwitches(ViewsShared):
    """The members' switches' side of the view manager (a part of ``ViewManager``)."""

    def _init_switches(self) -> None:
        self.switch_link: SwitchLink | None = None
        self._askers: dict[int, Callable[[int], None]] = {}  # member -> asks it to end a cut
        self._unfed: dict[str, list[tuple[int, Commits]]] = {}  # a view's, while no runtime
        self._streams_seen: set[int] = set()
        self._open_cuts: dict[str, int] = {}
        self._dispatch_since = 0  # what this leader may have missed is at or below it
        self._sent_tables: tuple[int, set[str]] = (-1, set())  # (epoch, store table ids)
        self._parts: dict[int, list[lpb.RowImage]] = {}  # a member's big commit, so far
        self._taken: dict[int, int] = {}  # per member, the last batch number taken

    # ------------------------------------------------------------------ member side

    def _dispatched_ids(self) -> set[str]:
        """The store tables whose changes this member sends (under the current catalog);
        its switch starts with the first (its stream also carries EPOCH ENDs: an epoch
        waits for every member, committing or not)."""
        epoch, ids = self._sent_tables
        if epoch != self.manager.epoch:
            names = {
                table
                for view in self.views.values()
                if dispatched(self.views, view)
                for table in view.plan.base_tables()
            }
            ids = {self.catalog.tables[n].table_id for n in names if n in self.catalog.tables}
            self._sent_tables = (self.manager.epoch, ids)
            if ids and self.switch_link is None:
                with contextlib.suppress(RuntimeError):  # no event loop: at the next call
                    self._link()
        return ids

    def committed(self, ts: int, images: list[lpb.RowImage]) -> None:
        """At the decision of this member's transaction: its changes of the tables cumulus
        views read go to its switch (released once its older timestamps are decided)."""
        ids = self._dispatched_ids()
        if not ids:
            return
        mine = [image for image in images if image.table in ids]
        if mine:
            self._link().committed(ts, mine)

    def unknown(self, ts: int, images: list[lpb.RowImage]) -> None:
        """A transaction of this member whose outcome is unknown (its decision's write
        failed) may have changed tables cumulus views read: the runtimes load again from a
        snapshot, which has it if it committed, before any epoch past it closes (sending
        nothing for it and closing the epoch would drop it if it did commit)."""
        ids = self._dispatched_ids()
        if ids and any(image.table in ids for image in images):
            self._link().outcome_unknown(ts)

    def _link(self) -> SwitchLink:
        if self.switch_link is None:
            manager = self.manager
            link = SwitchLink(
                manager.member,
                manager.in_flight.oldest,
                lambda: manager.leader,
                self._deliver_local,
                self.tls,
                reload=lambda why: self._reload_switched(f"member {manager.member}: {why}"),
            )
            link.start()
            manager.in_flight.released = link.release
            self.switch_link = link
        return self.switch_link

    async def _deliver_local(self, member: int, request: lpb.SwitchRequest) -> None:
        self.take(member, request)

    # ------------------------------------------------------------------ leader side

    async def switch_stream(
        self, requests: AsyncIterator[lpb.SwitchRequest]
    ) -> AsyncIterator[lpb.SwitchReply]:
        """A member's ``Clock.Switch`` stream: its batches and EPOCH ENDs in, acknowledgements
        and the cuts of open epochs out."""
        first = await anext(aiter(requests), None)
        if first is None:
            return
        member = first.member
        if first.fresh:  # a new process: numbers its batches from 1 again
            self._parts.pop(member, None)
            self._taken.pop(member, None)
            if member in self._streams_seen:  # and may have lost some
                self._reload_switched(f"member {member} restarted")
        self._streams_seen.add(member)
        replies: asyncio.Queue[lpb.SwitchReply | None] = asyncio.Queue()

        def ask(cut: int) -> None:
            replies.put_nowait(lpb.SwitchReply(cut=cut))

        self._askers[member] = ask
        replies.put_nowait(lpb.SwitchReply())
        for cut in sorted(set(self._open_cuts.values())):
            ask(cut)

        async def read() -> None:
            try:
                async for request in requests:
                    self.take(member, request)
                    if request.seq:
                        replies.put_nowait(lpb.SwitchReply(acked=request.seq))
            finally:
                replies.put_nowait(None)

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while (reply := await replies.get()) is not None:
                yield reply
            await reader
        finally:
            if self._askers.get(member) is ask:
                del self._askers[member]
            reader.cancel()

    def take(self, member: int, request: lpb.SwitchRequest) -> None:
        """One request of member ``member``'s switch, in the order it sent them (a batch sent
        again on a new stream is taken once)."""
        if request.seq:
            if request.seq <= self._taken.get(member, 0):
                return
            self._taken[member] = request.seq
        whole = []
        for commit in request.commits:
            if commit.more or member in self._parts:
                self._parts.setdefault(member, []).extend(commit.changes)
                if commit.more:
                    continue
                commit = lpb.SwitchCommit(ts=commit.ts, changes=self._parts.pop(member))
            whole.append(commit)
        if whole:
            for name, commits in self._split(whole).items():
                runtime = self.runtimes.get(name)
                fed = runtime is not None and runtime.members is not None
                if fed:
                    runtime.post(member, commits)
                if not fed or self.views[name].switching:  # (another) runtime loading
                    self._unfed.setdefault(name, []).append((member, commits))
        if request.epoch_end:
            for runtime in self.runtimes.values():
                if runtime.members is not None:
                    runtime.end(member, request.epoch_end)

    def _split(self, commits: Any) -> dict[str, Commits]:
        """The commits' changes by the dispatched views (here) that read them."""
        readers: dict[str, list[str]] = {}
        for view in self.views.values():
            if dispatched(self.views, view):
                for table in view.plan.base_tables():
                    readers.setdefault(table, []).append(view.name)
        out: dict[str, Commits] = {}
        for commit in commits:
            per_view: dict[str, list[tuple[str, Any, Any]]] = {}
            for image in commit.changes:
                schema = self.catalog.by_id.get(image.table)
                if schema is None:
                    continue
                change = (schema.name, decode_row(image.before), decode_row(image.after))
                for name in readers.get(schema.name, ()):
                    per_view.setdefault(name, []).append(change)
            for name, changes in per_view.items():
                out.setdefault(name, []).append((commit.ts, changes))
        return out

    def _installed(self, view: View) -> None:
        """``view``'s runtime is in ``runtimes``: what arrived while it loaded goes in first."""
        runtime = self.runtimes[view.name]
        if runtime.members is None:
            self._unfed.pop(view.name, None)
            return
        view.leftovers = True  # change rows captured before: the first epoch deletes them
        for member, commits in self._unfed.pop(view.name, []):
            runtime.post(member, commits)

    async def _switched_epoch(self, view: View, runtime: Any, ts: int) -> None:
        """Ends the epoch at ``ts`` (every transaction at or below it decided): each member
        says EPOCH END after its dispatches up to it; a lost member's switch is closed for it
        (its decision log was adopted, and the runtime loaded again after that)."""
        done = runtime.open_epoch(ts)
        self._open_cuts[view.name] = ts
        try:
            lost = getattr(self.manager.clock, "lost", set())
            for member in range(runtime.members):
                if member == self.manager.member:
                    self._link().ask(ts)
                elif member in lost:
                    runtime.end(member, ts)
                elif member in self._askers:
                    self._askers[member](ts)
            async with asyncio.timeout(EPOCH_WAIT):  # not wait_for: it may drop a cancellation
                await asyncio.wrap_future(done)
        finally:
            self._open_cuts.pop(view.name, None)

    def _reload_switched(self, why: str) -> None:
        """Every runtime fed by the members' switches loads again from a new snapshot (some
        member's dispatches may be lost)."""
        for name, runtime in list(self.runtimes.items()):
            view = self.views.get(name)
            if runtime.members is None or view is None or view.switching:
                continue
            log.warning("cumulus view %s loads again: %s", name, why)
            self._retire(name)
            asyncio.get_running_loop().create_task(self._reload_runtime(view))

    def _members(self) -> int:
        return len(self.manager.members) or 1

    # implemented by ``ViewRefresh``
    def _retire(self, name: str) -> None:
        raise NotImplementedError

    async def _reload_runtime(self, view: View) -> None:
        raise NotImplementedError
