"""A view maintained by the Cumulus runtime (``refresh = 'cumulus'``): its SELECT compiled to an
M3 program by recursive delta compilation, run by DW nodes (``cumulus.runtime``), fed the
committed changes of our transactions in timestamp order. Reads come from the last committed
epoch, exact at the timestamp of the last change it holds.

Pure: the view manager (``coordinator.views``) reads the snapshot and the change rows, and
hands them here; this module never touches the cluster.

The runtime is the simulator host in this process (the same node state machines the gRPC and
Spark hosts run) or, given ``start``, another host (``coordinator.cumulus_hosts``).

Two ways in. Drained (views over views): each epoch is fed in timestamp order, then run until
committed. Switches per member (``members``, issue #42): each coordinating member's commits
arrive as they commit (``post``, in that member's timestamp order, not in any order across
members) and go into that member's switch; an epoch opens at a timestamp (``open_epoch``)
and commits once every member said EPOCH END for it (``end``). A worker thread applies what
arrives in order, so the event loop only queues."""

from __future__ import annotations

import concurrent.futures
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from aggview import errors
from aggview.schema import TableSchema, from_storage
from coordinator.member_switch import cut_of, stamp
from cumulus.m3.compiler import compile_program
from cumulus.m3.epoch_rows import EpochRows
from cumulus.m3.interpreter import Interpreter
from cumulus.m3.program import Program
from cumulus.m3.readout import expand, maps_read, read_groups, read_view
from cumulus.plan import ViewPlan
from cumulus.runtime.placement import relation_map
from cumulus.runtime.reads import roll_up
from cumulus.runtime.simulator import FEED_BATCH, Simulator, Update, holding

Row = dict[str, Any]
Key = tuple[Any, ...]
LIVE_READ_EVERY = 0.02  # seconds a tentative read of nodes in processes is reused
Change = tuple[str, Row | None, Row | None]  # (table, before, after)


class CumulusView:
    def __init__(
        self,
        plan: ViewPlan,
        schemas: Mapping[str, TableSchema],
        start: Callable[[Program], Any] | None = None,
        members: int | None = None,
    ) -> None:
        """``schemas``: every table the view reads, by name; ``start``: the runtime for the
        compiled program (default: the simulator host, in this process), with ``members``
        switches stamped by the members (None: one switch, drained)."""
        self.plan = plan
        self.schemas = dict(schemas)
        self.program: Program = compile_program(
            [plan], self.schemas.__getitem__, plan.program_depth
        )
        self.shape = self.program.views[0]
        self._read = maps_read(self.shape)  # what rows are read from (not every map)
        self._epoch_rows = EpochRows(self.shape)  # rows by group, kept across epochs
        self._columns: dict[str, list[tuple[str, Any]]] = {}  # per table, as ``_values`` reads
        self._reader: Interpreter | None = None
        self._reading = threading.Lock()
        self.members = members
        if start is None:
            self.runtime: Any = Simulator(
                self.program,
                nodes=plan.nodes,
                mode=plan.speculation,
                switches=members or 1,
                stamped=members is not None,
                batch=FEED_BATCH,
            )
        else:
            self.runtime = start(self.program)
        # the view's rows at the last committed epoch and our timestamp of it: one object,
        # replaced whole, so a read (on the event loop) never pairs rows with another epoch's
        # timestamp while ``apply`` runs in a worker thread
        self._last: tuple[list[Row], int] = ([], 0)
        self.fed_at = 0  # our timestamp of the last change fed (committed or not)
        self.cpu_seconds = 0.0  # what driving the runtime took in this process (its threads)
        self.epochs = 0
        self._counts: dict[str, Any] = {}
        # the simulator host is driven from one thread at a time (a feed or an epoch runs in
        # a worker thread, a tentative read in another); the other hosts' nodes are processes
        # the simulator host comes to rest after each feed: its newest values change only
        # then; the others' nodes apply what they were fed on their own, read at most every
        # LIVE_READ_EVERY seconds (gathering the maps from every node costs)
        self._at_rest = isinstance(self.runtime, Simulator)
        self._driving = threading.Lock() if self._at_rest else contextlib.nullcontext()
        self._newest: tuple[list[Row], int, float] | None = None  # rows, fed_at, good until
        # switches per member: what arrived, applied in order by one worker thread
        self._events: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._fed: dict[int, int] = {}  # per member, the newest timestamp fed
        self._loaded_at = 0
        self._open: tuple[int, set[int], concurrent.futures.Future[int]] | None = None
        self.failure: BaseException | None = None

    def load(self, tables: Mapping[str, Iterable[Row]], ts: int) -> None:
        """The view's tables at snapshot ``ts`` (stored rows): every map's value over them,
        computed by the reference interpreter (about 20 times the rate of the runtime's
        protocol in one process) and installed on the nodes before any update."""
        reference = Interpreter(self.program)
        for table, rows in tables.items():
            for row in rows:
                reference.apply("+", table, self._values(table, row))
        self._install(reference, ts)

    def load_maps(self, maps: Mapping[str, Mapping[Key, Any]], ts: int) -> None:
        """Every map's value at snapshot ``ts`` computed elsewhere (Spark, from the maps'
        definitions), installed on the nodes before any update. Entries of maps the program
        does not have, or keys of another width, are refused, naming them."""
        reference = Interpreter(self.program)
        read = {relation_map(name): name for name in reference.relations}
        widths = {m.name: len(m.keys) for m in self.program.maps}
        widths.update({r: len(self.program.source(n).columns) for r, n in read.items()})
        for name, entries in maps.items():
            if name not in widths:
                raise errors.InvalidArgument(f"the view's program has no map {name!r}")
            for key in entries:
                if len(key) != widths[name]:
                    raise errors.InvalidArgument(
                        f"map {name} has {widths[name]} key columns, not {len(key)}"
                    )
            store = reference.relations[read[name]] if name in read else reference.maps[name]
            store.data.update(entries)
        self._install(reference, ts)

    def _install(self, reference: Interpreter, ts: int) -> None:
        """The reference's maps, and the relations a depth-bounded program reads (their rows,
        each counted once), onto the nodes."""
        maps = {name: store.data for name, store in reference.maps.items()}
        for name, store in reference.relations.items():
            maps[relation_map(name)] = store.data
        self.runtime.preload(maps)
        self._last = (read_view(reference, self.shape, counted=True), ts)
        self._epoch_rows = EpochRows(self.shape)  # its first epoch reads every group
        self.fed_at = self._loaded_at = ts
        self._count()
        if self.members is not None:
            self._worker = threading.Thread(target=self._work, name="cumulus-switches")
            self._worker.daemon = True
            self._worker.start()

    # ------------------------------------------------------------ switches per member

    def post(self, member: int, commits: list[tuple[int, list[Change]]]) -> None:
        """Member ``member``'s commits, in its timestamp order, as (ts, changes): those at or
        below the load's snapshot, or fed already (sent again), are skipped."""
        self._events.put(("feed", member, commits))

    def open_epoch(self, ts: int) -> concurrent.futures.Future[int]:
        """An epoch at ``ts``; done when every member ended it (``end``) and it committed."""
        done: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._events.put(("open", ts, done))
        return done

    def end(self, member: int, ts: int) -> None:
        """Member ``member`` sent everything it committed at or below ``ts``."""
        self._events.put(("end", member, ts))

    def _work(self) -> None:
        while (event := self._events.get()) is not None:
            events = [event]
            with contextlib.suppress(queue.Empty):
                while (more := self._events.get_nowait()) is not None:
                    events.append(more)
                else:
                    self._events.put(None)  # stop after these
            if self.failure is None:
                try:
                    self._take(events)
                except Exception as exc:  # its state is unknown now: the view reloads it
                    self.failure = exc
            if self.failure is not None:
                for kind, _, *rest in events:
                    if kind == "open":
                        _settle(rest[0], failure=self.failure)
                if self._open is not None:
                    _settle(self._open[2], failure=self.failure)
                    self._open = None

    def _take(self, events: list[tuple[Any, ...]]) -> None:
        with self._driving:
            started = time.thread_time()
            fed = False
            try:
                for event in events:
                    if event[0] == "feed":
                        fed = self._feed_member(event[1], event[2]) or fed
                    elif event[0] == "open":
                        self.runtime.open_at(cut_of(event[1]))
                        self._open = (event[1], set(), event[2])
                    else:
                        self._end(event[1], event[2])
                if fed and isinstance(self.runtime, Simulator):  # its network is virtual
                    self.runtime.deliver()
            finally:
                self.cpu_seconds += time.thread_time() - started

    def _feed_member(self, member: int, commits: list[tuple[int, list[Change]]]) -> bool:
        updates: list[tuple[int, Update]] = []
        last = self._fed.get(member, self._loaded_at)
        for ts, changes in commits:
            if ts <= last:
                continue
            i = 0
            for table, before, after in changes:
                if before is not None:
                    updates.append((stamp(ts, i), ("-", table, self._values(table, before))))
                    i += 1
                if after is not None:
                    updates.append((stamp(ts, i), ("+", table, self._values(table, after))))
                    i += 1
            last = ts
        self._fed[member] = last
        if not updates:
            return False
        self.runtime.feed_stamped(member, updates, checked=True)  # rows as stored: typed
        self.fed_at = max(self.fed_at, last)
        return True

    def _end(self, member: int, ts: int) -> None:
        if self._open is None or self._open[0] != ts or member in self._open[1]:
            return  # an answer again (a new stream), or for an epoch that failed
        assert self.members is not None
        if member >= self.members:
            return
        self.runtime.close_switch(member, cut_of(ts))
        self._open[1].add(member)
        if len(self._open[1]) < self.members:
            return
        done = self._open[2]
        self._open = None
        self.runtime.finish()
        _, maps = self.runtime.snapshot(names=self._read)  # the maps rows are read from
        self.epochs += 1
        self._count()
        self._last = (self._epoch_rows.read(maps, lambda: self._groups(maps)), ts)
        _settle(done, ts)

    def feed(self, changes: Iterable[tuple[str, Row | None, Row | None]], ts: int) -> None:
        """Every committed change of the view's tables up to ``ts`` not yet fed, in timestamp
        order, as (table, before, after): the nodes apply them speculatively; the next
        ``apply`` commits them with its own."""
        updates: list[Update] = []
        for table, before, after in changes:
            if before is not None:
                updates.append(("-", table, self._values(table, before)))
            if after is not None:
                updates.append(("+", table, self._values(table, after)))
        with self._driving:  # a tentative read pairs these maps with this timestamp
            started = time.thread_time()
            self.runtime.feed(updates)
            if isinstance(self.runtime, Simulator):  # its network is virtual: run it
                self.runtime.deliver()
            self.fed_at = ts
            self.cpu_seconds += time.thread_time() - started

    def apply(self, changes: Iterable[tuple[str, Row | None, Row | None]], ts: int) -> None:
        """Like ``feed``, then runs until everything fed is committed as one epoch at ``ts``."""
        self.feed(changes, ts)
        with self._driving:
            started = time.thread_time()
            self.runtime.finish()
            _, maps = self.runtime.snapshot(names=self._read)  # the maps rows are read from
            self.cpu_seconds += time.thread_time() - started
        self.epochs += 1
        self._count()
        self._last = (self._epoch_rows.read(maps, lambda: self._groups(maps)), ts)

    def tentative(
        self, conditions: Sequence[Any], keep: Sequence[str] | None, counted: bool = False
    ) -> tuple[list[Row], int]:
        """The newest values (``query``'s shape): every change fed, as far as the nodes have
        applied it, corrections still on their way included; the rows may mix timestamps.
        Also the timestamp of the last change fed (at rest, the rows are exact there)."""
        with self._driving:
            newest = self._newest
            stale = newest is None or (
                newest[1] != self.fed_at if self._at_rest else time.monotonic() > newest[2]
            )
            if stale:
                rows = self._rows(self.runtime.maps(names=self._read))
                newest = self._newest = (rows, self.fed_at, time.monotonic() + LIVE_READ_EVERY)
        assert newest is not None
        return self._shaped(newest[0], conditions, keep, counted), newest[1]

    def _rows(self, maps: Mapping[str, Mapping[Any, Any]]) -> list[Row]:
        """The view's rows from the maps it reads."""
        return list(self._groups(maps).values())

    def _groups(self, maps: Mapping[str, Mapping[Any, Any]]) -> dict[Any, Row]:
        """The view's rows by group, every group read from the maps it reads."""
        read = {name: entries for name, entries in maps.items() if name in self._read}
        with self._reading:  # one reader, made once (a new one compiles every trigger)
            self._reader = holding(self.program, read, self._reader)
            return read_groups(self._reader, self.shape)

    def counts(self) -> dict[str, Any]:
        """What the runtime did since it was loaded, as of the last epoch (read on the event
        loop while an epoch may run in a worker thread): updates fed (a change is a delete and
        an insert), messages by kind, corrective updates, epochs, log entries, and the CPU
        seconds this process spent driving the runtime (on the simulator host: all of it)."""
        return self._counts

    def _count(self) -> None:
        report = self.runtime.report
        self._counts = {
            "updates": report.updates,
            "messages": dict(report.messages),
            "corrective": report.corrective,
            "epochs": self.epochs,
            "logs": self.runtime.log_sizes(),
            "cpu_seconds": self.cpu_seconds,
        }

    def close(self) -> None:
        """Stops the worker, and the runtime's nodes where they are processes."""
        if self._worker is not None:
            self._events.put(None)
            self._worker.join(timeout=30)
        close = getattr(self.runtime, "close", None)
        if close is not None:
            close()

    @property
    def committed_at(self) -> int:
        """Our timestamp of the last committed epoch."""
        return self._last[1]

    def _values(self, table: str, stored: Row) -> tuple[Any, ...]:
        """A stored row's values in the order of the program's relation (a tuple: the
        switch checks it without looking names up)."""
        columns = self._columns.get(table)
        if columns is None:
            types = {c.name: c.type for c in self.schemas[table].columns}
            names = next(  # a table the program does not read: as the schema has it
                (s.column_names() for s in self.program.sources if s.name == table), types
            )
            columns = self._columns[table] = [(n, types[n]) for n in names]
        return tuple([from_storage(kind, stored.get(name)) for name, kind in columns])

    def query(
        self, conditions: Sequence[Any], keep: Sequence[str] | None, counted: bool = False
    ) -> tuple[list[Row], int]:
        """The last committed epoch's rows whose group columns meet ``conditions``
        (``view_query.Condition``), rolled up to ``keep`` (None: the view's own groups), and
        the epoch's timestamp. A bag view's row comes as often as it counts (``counted``:
        once, with its ``__count``); rolled up, a bag or distinct view gives the distinct
        values of the kept columns (``view_query.answer``)."""
        rows, ts = self._last
        return self._shaped(rows, conditions, keep, counted), ts

    def _shaped(
        self,
        rows: list[Row],
        conditions: Sequence[Any],
        keep: Sequence[str] | None,
        counted: bool = False,
    ) -> list[Row]:
        groups = [g.name for g in self.plan.group_by]
        rows = [dict(r) for r in rows if all(c.holds(r.get(c.column)) for c in conditions)]
        if keep is not None and self.plan.shape != "aggregate":
            kept = {tuple(r[c] for c in keep): {c: r[c] for c in keep} for r in rows}
            return list(kept.values())
        if keep is not None and list(keep) != groups:
            rows = roll_up(self.shape, rows, list(keep))
        return rows if counted else expand(rows)


def _settle(
    done: concurrent.futures.Future[int], ts: int = 0, failure: BaseException | None = None
) -> None:
    """An epoch's outcome to whoever waits for it; one who gave up (the refresher cancelled
    by an ALTER or DROP) cancelled the future, and the epoch goes on without them: the worker
    must not die of it (every later epoch and the view's drop would wait for it)."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if failure is not None:
            done.set_exception(failure)
        else:
            done.set_result(ts)
