"""A DW node as a state machine: ``handle(message)`` returns the messages to send, with no I/O
and no clock inside, so the simulator, gRPC processes and Spark tasks all run this code.

Speculative execution (seed 000 §3.3, seed 003 §5.1):

- **WriteLog**: every map entry keeps its deltas by timestamp; a read at ts sees the sum of
  those below ts (the state just before the update, whatever arrived later).
- A FETCH is answered at once, except that it waits for PUTs this node already holds at a lower
  timestamp writing a map it reads ("blocking only on pending write operations which the node
  is already aware of", seed 003): with one switch and FIFO links no correction is ever needed.
- **ReadLog** (the seed's SendLog, kept per read so a correction names exactly the reads it
  revises): every slice served, with its pattern, writer and timestamp.
- A write reaching a map after reads of it at later timestamps were served is a **late
  write**: each writer that read the entry gets a ``Corrective`` with the delta and the reads.
- **OperationLog** (with the seed's ReceiveLog inside it): each update this node wrote for keeps
  the slices it was pushed and the result it wrote. A corrective revises those slices,
  recomputes the result and writes the difference at the update's own timestamp, which may be
  a late write in turn (recursion ends: the map dependency graph is acyclic).
"""

from __future__ import annotations

import bisect
import heapq
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cumulus.expressions import add
from cumulus.m3.value_kinds import typing_of
from cumulus.runtime.evaluate import CompiledStep, Tables
from cumulus.runtime.fused import fuse
from cumulus.runtime.maplog import MapLog, accumulate
from cumulus.runtime.messages import (
    COORDINATOR,
    Batch,
    Corrective,
    Dispatch,
    EpochCommit,
    EpochEnd,
    EpochEndRequest,
    EpochReady,
    Fetch,
    Key,
    Message,
    Push,
    Read,
    Settled,
    Slice,
    Timestamp,
)
from cumulus.runtime.placement import Placement
from cumulus.runtime.readlog import ReadEntry, ReadLog

Outbox = list[tuple[int, Message]]
# a slice as served: (statement, factor, entries)
_Piece = tuple[int, int, Mapping[Key, Any] | Iterable[tuple[Key, Any]]]


@dataclass(slots=True)
class Operation:
    """An update's statement this node writes for: what it was pushed, what it wrote."""

    ts: Timestamp
    statement: int
    trigger: int = -1
    args: Key = ()
    expected: int | None = None  # PUSH messages to wait for, once the PUT is here
    heard: int = 0
    tables: Tables = field(default_factory=dict)
    result: dict[Key, Any] | None = None  # None until evaluated
    version: tuple[int, int] = (0, 0)  # conservative: (stream, the update's place in its PUTs)
    local: bool = False  # read here in place (``Node._fused``): a corrective reads again

    @property
    def ready(self) -> bool:
        return self.result is None and self.expected is not None and self.heard >= self.expected


@dataclass(slots=True)
class LocalUpdate:
    """An update whose statements ran here as one function (``Node._fused``) where a
    corrective may still revise its reads: what each statement wrote here, so a corrective
    makes it an ``Operation`` then (most never get one)."""

    trigger: int
    args: Key
    statements: tuple[int, ...]
    results: list[dict[Key, Any]]


@dataclass(slots=True, frozen=True)
class _Fusion:
    """The plan ``Node._fused`` runs an update's statements at one node by."""

    trigger: int
    statements: tuple[int, ...]
    run: Any  # the generated function: values -> each statement's result
    reads: tuple[str, ...]  # the maps read
    read_logs: tuple[MapLog, ...]  # and their logs
    writes: tuple[tuple[str, MapLog, CompiledStep | None], ...]  # target, its log, owned by
    logged: tuple[tuple[str, Any, tuple[int, ...], tuple[tuple[int, int], ...]], ...]


@dataclass
class NodeStats:
    corrective_sent: int = 0
    corrective_received: int = 0
    max_depth: int = 0
    deferred_fetches: int = 0
    epochs: int = 0


class ProtocolError(RuntimeError):
    """A message the protocol promises never arrives did (a host or network bug)."""


MODES = ("speculative", "conservative")


class Node:
    def __init__(
        self,
        placement: Placement,
        number: int,
        *,
        switches: int = 1,
        mode: str = "speculative",
        log_limit: int | None = None,
        ordered: bool = False,
        per_switch: bool = False,
    ) -> None:
        """``ordered``: the host delivers each switch's messages in the order sent (FIFO
        links, as the simulator and the gRPC and Spark hosts do); the node then checks it.
        ``per_switch`` (conservative, switches of their own: a coordinating member's each):
        version numbers count each switch's PUTs apart, and a FETCH waits until every switch
        has gone past its timestamp and its earlier PUTs are written."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: expected one of {', '.join(MODES)}")
        self.placement = placement
        self.number = number
        self.switches = switches
        self.mode = mode
        self.log_limit = log_limit  # write-log entries past which the node asks for an epoch end
        self.ordered = ordered
        self.per_switch = per_switch and mode == "conservative"
        # A read is logged only where a later write can still revise it. With one switch whose
        # messages arrive in order, every PUT below a FETCH is known when it is served, and the
        # FETCH waits for those writing a map it reads; conservative mode waits for every
        # earlier PUT. Either way no write is late, so no read is logged: only the newest read
        # per map is kept, to refuse a late write loudly (``_unlogged``).
        self.log_reads = mode == "speculative" and not (ordered and switches == 1)
        self._newest_read: dict[str, Timestamp] = {}
        self._last_dispatch: dict[int, Timestamp] = {}  # ordered: per switch, the newest
        program = placement.program
        self._typings = [typing_of(program, trigger) for trigger in program.triggers]
        self.compiled = [
            [CompiledStep(step, trigger.args, typing) for step in steps]
            for trigger, steps, typing in zip(
                program.triggers, placement.steps, self._typings, strict=True
            )
        ]
        # per (trigger, statements written here): the update's fused function (``_fused``)
        self._fusions: dict[tuple[int, tuple[int, ...]], _Fusion] = {}
        # id(puts) -> (puts, fetches, trigger, the fused plan if all its reads are here)
        self._by_route: dict[int, tuple[Any, Any, int, _Fusion | None]] = {}
        # per trigger, per step: its reads, each with its pattern as a function of the values
        # and the pattern's bound positions (those not WILD)
        self._reads = [
            [
                [
                    (
                        read,
                        placement.pattern_of(read.keys, trigger.args),
                        tuple(i for i, k in enumerate(read.keys) if k in trigger.args),
                    )
                    for read in step.reads
                ]
                for step in steps
            ]
            for trigger, steps in zip(program.triggers, placement.steps, strict=True)
        ]
        self.maps: dict[str, MapLog] = defaultdict(MapLog)
        self._homes: dict[str, dict[Any, int]] = defaultdict(dict)
        self.reads: dict[str, ReadLog] = defaultdict(ReadLog)  # by map
        self.operations: dict[tuple[Timestamp, int], Operation] = {}
        self.local: dict[Timestamp, LocalUpdate] = {}  # fused updates a corrective may revise
        self.pending_writes: dict[str, list[Timestamp]] = defaultdict(list)  # sorted
        self._pending = 0  # how many timestamps pending_writes holds, over every map
        # FETCHes to look at, and those parked: by the map whose pending write blocks them
        # (speculative) or by the version they wait for (conservative)
        self._candidates: list[tuple[Dispatch, Fetch]] = []
        self._by_map: dict[str, list[tuple[Timestamp, int, Dispatch, Fetch]]] = defaultdict(list)
        self._by_version: list[tuple[int, int, Dispatch, Fetch]] = []
        self._parked = 0  # tie-breaker: parked FETCHes never compare among themselves
        self.stats = NodeStats()
        self.completed: list[Timestamp] = []  # updates written for since the host last looked
        self._ready: list[Operation] = []  # operations that have all they wait for
        # conservative mode: PUTs left per version, and how many versions are fully written,
        # per stream of version numbers (one shared by every switch, or one per switch)
        self._left: dict[tuple[int, int], int] = {}
        self._finished: dict[int, set[int]] = defaultdict(set)  # beyond the first gap
        self._written: dict[int, int] = defaultdict(int)
        # per_switch: each switch's timestamps of its updates with PUTs here (the first
        # ``_put_base`` of them folded away), the newest timestamp it went past, and the
        # FETCHes waiting for some switch
        self._put_ts: dict[int, list[Timestamp]] = defaultdict(list)
        self._put_base: dict[int, int] = defaultdict(int)
        self._heard: dict[int, Timestamp] = {}
        self._waiting: list[tuple[Dispatch, Fetch]] = []
        # correctives: those sent and not settled (seq -> lowest read counter, cause), and per
        # received corrective (source, seq) how many of the ones it caused are not settled
        self._sent = 0
        self._unsettled: dict[int, tuple[int, tuple[int, int] | None]] = {}
        self._caused: dict[tuple[int, int], int] = {}
        self._cause: tuple[int, int] | None = None
        # epochs
        self.committed = 0  # the last committed cut: no message at or below it arrives any more
        self.ready_cut = 0  # the highest cut this node said EPOCH READY for
        self._ends: dict[int, set[int]] = defaultdict(set)  # cut -> switches that closed it
        self._asked = False  # an EpochEndRequest is out
        self._log_entries = 0  # write-log entries after the committed cut

    # --------------------------------------------------------------------------- messages

    def handle(self, message: Message) -> Outbox:
        """What to send for ``message``; a ``Batch``'s messages are taken in order, each as if
        it had arrived alone (the node's state after it is the same), and the epoch's progress
        is looked at once, after the last."""
        out: Outbox = []
        self._take(message, out)
        self._progress(out)
        self._epoch_progress(out)
        return out

    def _take(self, message: Message, out: Outbox) -> None:
        kind = type(message)
        if kind is Dispatch:
            self._not_committed(message.ts[0], message)
            self._dispatch(message, out)
        elif kind is Push:
            self._not_committed(message.ts[0], message)
            self._push(message)
        elif kind is Corrective:
            self._not_committed(min(r.ts[0] for r in message.reads), message)
            self._corrective(message, out)
        elif kind is Settled:
            self._settled(message.seq, out)
        elif kind is EpochEnd:
            self._epoch_end(message)
        elif kind is EpochCommit:
            self._commit(message.cut)
        elif kind is Batch:
            for inner in message.messages:
                self._take(inner, out)
                self._progress(out)
        else:
            raise TypeError(f"a DW node cannot handle {kind.__name__}")

    def _not_committed(self, counter: int, message: Message) -> None:
        if counter <= self.committed:
            raise ProtocolError(
                f"node {self.number} got {type(message).__name__} for timestamp {counter} after "
                f"committing the epoch up to {self.committed}"
            )

    def _dispatch(self, message: Dispatch, out: Outbox) -> None:
        if self.ordered:
            last = self._last_dispatch.get(message.ts[1])
            if last is not None and message.ts <= last:
                raise ProtocolError(
                    f"node {self.number} got the Dispatch for {message.ts} after {last} from the "
                    "same switch: its host promised them in order"
                )
            self._last_dispatch[message.ts[1]] = message.ts
        if self.mode == "speculative":
            plan = self._here_plan(message)
            if plan is not None and (
                not self._pending
                or not any(self._blocked_on(message, fetch) for fetch in message.fetches)
            ):
                self._dispatch_here(message, plan, out)
                return
        steps = self.placement.steps[message.trigger]
        stream = message.ts[1] if self.per_switch else 0
        version = (stream, message.puts_before)
        if message.puts and self.mode == "conservative":
            self._left[version] = len(message.puts)
            if self.per_switch:
                self._put_ts[stream].append(message.ts)
        if self.per_switch:
            self._passed(stream, message.ts)
        ts = message.ts
        for statement, pushes in message.puts:
            if not pushes:  # reads no map: written at once, no read of it to revise
                op = Operation(ts, statement, message.trigger, message.args, 0)
                op.version = version
                self._written_op(op, out)
                continue
            op = self._operation(ts, statement)
            op.trigger, op.args, op.expected = message.trigger, message.args, pushes
            op.version = version
            pending = self.pending_writes[steps[statement].target]
            if not pending or pending[-1] < ts:  # in order, as nearly every PUT is
                pending.append(ts)
            else:
                bisect.insort(pending, ts)
            self._pending += 1
            if op.heard >= pushes:
                self._ready.append(op)
        if message.fetches:
            self._candidates += [(message, fetch) for fetch in message.fetches]

    def _here_plan(self, message: Dispatch) -> _Fusion | None:
        """The fused plan of the update's statements here if they read here only and all that
        reads here is written here (``_all_here``), else None; found again by its route's puts
        and fetches (a switch sends one route's objects again). If no earlier write pending
        here blocks their reads, they are read and written at once (``_dispatch_here``), as
        the protocol would once its own PUSH arrived."""
        puts, fetches, trigger = message.puts, message.fetches, message.trigger
        seen = self._by_route.get(id(puts))
        if seen is not None and seen[0] is puts and seen[1] is fetches and seen[2] == trigger:
            return seen[3]
        plan = None
        if self._all_here(message):
            plan = self._fusion(trigger, tuple([statement for statement, _ in puts]))
        if len(self._by_route) >= 4096:
            self._by_route.clear()
        self._by_route[id(puts)] = (puts, fetches, trigger, plan)  # kept alive: ids stay theirs
        return plan

    def _all_here(self, message: Dispatch) -> bool:
        """Whether the update's statements written here read here only, and every FETCH here
        is for a statement written here alone."""
        fetches = message.fetches
        if not fetches:
            return False
        me = (self.number,)
        for fetch in fetches:
            if fetch.writers != me:
                return False
        reading = 0  # statements that wait for a PUSH: each for one, from here
        for _, pushes in message.puts:
            if pushes > 1:
                return False  # read elsewhere too: it waits for two PUSHes
            reading += pushes
        # a FETCH here writes here, so its statement is one of those: all of them are here
        # if the counts agree (a statement has one FETCH per node)
        return len(fetches) == reading

    def _dispatch_here(self, message: Dispatch, plan: _Fusion, out: Outbox) -> None:
        """An update all of whose statements here read here (``_here_plan``): each statement's
        slices read as ``_serve`` reads them, then its result written, with no PUSH, pending
        write or waiting operation: by one generated function over the maps in place wherever
        it can (``_fused``)."""
        if self._fused(message, plan, out):
            return
        tables: dict[int, Tables] = {}
        for fetch, factor, entries in self._read_slices(message, message.fetches):
            mine = tables.get(fetch.statement)
            if mine is None:
                mine = tables[fetch.statement] = {}
            _put_slice(mine, factor, entries)
        ts, trigger, args, log_reads = message.ts, message.trigger, message.args, self.log_reads
        for statement, pushes in message.puts:
            op = Operation(ts, statement, trigger, args, pushes, pushes)
            if pushes:
                op.tables = tables[statement]
                if log_reads:  # a corrective may revise its reads
                    self.operations[(ts, statement)] = op
            self._written_op(op, out)

    def _fused(self, message: Dispatch, plan: _Fusion, out: Outbox) -> bool:
        """The update's statements run as one function reading this node's maps in place
        (``cumulus.runtime.fused``): only if nothing at or after its timestamp was written to
        a map they read, so that the maps are as they were just before it. Where reads are
        logged, each map's read is logged once per key shape for this node, and what each
        statement wrote is kept (``LocalUpdate``): a corrective makes its operation, which
        reads its slices again (``_revise``), the late write included."""
        ts, args = message.ts, message.args
        for log in plan.read_logs:
            if log.newest >= ts:
                return False
        self.completed += [ts] * len(plan.writes)
        if self.log_reads:
            self._fused_logged(plan, ts, args, out)
            return True
        self._note_reads(plan.reads, ts)
        newest_read = self._newest_read  # ``_unlogged``'s test, inline: once per statement
        for (target, log, owned_by), result in zip(plan.writes, plan.run(args), strict=True):
            if owned_by is not None:
                result = self._mine(owned_by, result)
            self._log_entries += log.write_all(result.items(), ts)  # zeros skipped
            newest = newest_read.get(target)
            if newest is not None and ts < newest:
                self._unlogged(target, ts)  # raises
        return True

    def _fused_logged(self, plan: _Fusion, ts: Timestamp, args: Key, out: Outbox) -> None:
        """``_fused`` where reads are logged: the reads into the read logs, each statement's
        result kept, and a write that may be late checked as one."""
        number = self.number
        for name, pattern_of, bound, uses in plan.logged:
            self.reads[name].add(ReadEntry(ts, pattern_of(args), number, uses), bound)
        kept = self.local[ts] = LocalUpdate(plan.trigger, args, plan.statements, [])
        for (target, log, owned_by), result in zip(plan.writes, plan.run(args), strict=True):
            if owned_by is not None:
                result = self._mine(owned_by, result)
            kept.results.append(result)
            later = self.reads.get(target)
            if later is not None and later.newest is not None and later.newest > ts:
                for key, delta in result.items():
                    if delta != 0:
                        self._write(target, key, delta, ts, 0, out)
                continue
            self._log_entries += log.write_all(result.items(), ts)

    def _fusion(self, trigger: int, statements: tuple[int, ...]) -> _Fusion:
        """``_fused``'s plan for the statements of a trigger written here (made once): the
        generated function, the maps read, where each result is written (with the step whose
        keys this node keeps, if other nodes write some), and the reads to log, one per map
        and key shape with the (statement, factor) pairs it serves."""
        plan = self._fusions.get((trigger, statements))
        if plan is not None:
            return plan
        steps = tuple(self.compiled[trigger][statement] for statement in statements)
        run = fuse(
            [step.step for step in steps],
            self.placement.program.triggers[trigger].args,
            self._typings[trigger],
            self.maps.__getitem__,
        )
        logged: dict[tuple[str, tuple[str, ...]], tuple[Any, Any, list[tuple[int, int]]]] = {}
        for statement in statements:
            for read, pattern_of, bound in self._reads[trigger][statement]:
                entry = logged.setdefault((read.map, read.keys), (pattern_of, bound, []))
                entry[2].append((statement, read.factor))
        reads = tuple({name: None for name, _ in logged})
        several = self.placement.nodes > 1
        plan = self._fusions[(trigger, statements)] = _Fusion(
            trigger,
            statements,
            run,
            reads,
            tuple(self.maps[name] for name in reads),  # a map's log is never replaced
            tuple(
                (
                    step.step.target,
                    self.maps[step.step.target],
                    step
                    if several
                    and not step.single_writer
                    and step.step.target not in self.placement.whole
                    else None,
                )
                for step in steps
            ),
            tuple((name, p, b, tuple(uses)) for (name, _), (p, b, uses) in logged.items()),
        )
        return plan

    def _push(self, message: Push) -> None:
        pieces = [(p.statement, p.factor, p.entries) for p in message.slices]
        self._pushed(message.ts, message.statements, pieces)

    def _pushed(self, ts: Timestamp, statements: Sequence[int], pieces: Sequence[_Piece]) -> None:
        """A PUSH's slices into the tables of the operations they are for; each statement it
        answers has heard from one more read node."""
        ops: dict[int, Operation] = {}
        for statement, factor, entries in pieces:
            op = ops.get(statement)
            if op is None:
                op = ops[statement] = self._operation(ts, statement)
            _put_slice(op.tables, factor, entries)
        for statement in statements:
            op = ops.get(statement) or self._operation(ts, statement)
            op.heard += 1
            if op.expected is not None and op.heard >= op.expected and op.result is None:
                self._ready.append(op)

    def _operation(self, ts: Timestamp, statement: int) -> Operation:
        op = self.operations.get((ts, statement))
        if op is None:
            op = self.operations[(ts, statement)] = Operation(ts, statement)
        return op

    # --------------------------------------------------------------------------- progress

    def _progress(self, out: Outbox) -> None:
        """Evaluates every operation that has all it waits for and serves every FETCH that no
        known earlier write blocks, until neither makes progress. A blocked FETCH is parked on
        what blocks it and looked at again only when that moves."""
        while self._ready or self._candidates:
            while self._ready:
                op = self._ready.pop()
                if op.result is None:  # not evaluated meanwhile
                    self._evaluate(op, out)
            candidates, self._candidates = self._candidates, []
            serve: dict[tuple[Timestamp, int], list[tuple[Dispatch, Fetch]]] = defaultdict(list)
            for dispatch, fetch in candidates:
                if not self._park(dispatch, fetch):
                    serve[(dispatch.ts, dispatch.trigger)].append((dispatch, fetch))
            for work in serve.values():
                self._serve(work, out)

    def _park(self, dispatch: Dispatch, fetch: Fetch) -> bool:
        """Parks the FETCH if it must wait (True), on the version or the map that blocks it."""
        self._parked += 1
        if self.per_switch:
            if not self._earlier_written(dispatch.ts):
                self._waiting.append((dispatch, fetch))
                self.stats.deferred_fetches += 1
                return True
            return False
        if self.mode == "conservative":  # seed 001: wait for every earlier PUT to this node
            if self._written[0] < dispatch.puts_before:
                heapq.heappush(
                    self._by_version, (dispatch.puts_before, self._parked, dispatch, fetch)
                )
                self.stats.deferred_fetches += 1
                return True
            return False
        blocking = self._blocked_on(dispatch, fetch)
        if blocking is None:
            return False
        heapq.heappush(self._by_map[blocking], (dispatch.ts, self._parked, dispatch, fetch))
        self.stats.deferred_fetches += 1
        return True

    def _blocked_on(self, dispatch: Dispatch, fetch: Fetch) -> str | None:
        """A map the FETCH reads with a write pending here at an earlier timestamp, if any
        (speculative mode: the read waits for it, not to be corrected at once)."""
        for read in self.placement.steps[dispatch.trigger][fetch.statement].reads:
            if read.factor in fetch.factors:
                pending = self.pending_writes.get(read.map)
                if pending and pending[0] < dispatch.ts:
                    return read.map
        return None

    def _earlier_written(self, ts: Timestamp) -> bool:
        """per_switch: every switch went past ``ts`` (its own: FIFO, so it has) and every PUT
        here below ``ts`` is written."""
        for switch in range(self.switches):
            if switch != ts[1] and self._heard.get(switch, (0, -1)) <= ts:
                return False
            below = self._put_base[switch] + bisect.bisect_left(self._put_ts[switch], ts)
            if self._written[switch] < below:
                return False
        return True

    def _passed(self, switch: int, ts: Timestamp) -> None:
        """per_switch: ``switch`` sends nothing at or below ``ts`` any more; the waiting
        FETCHes are looked at again."""
        if ts > self._heard.get(switch, (0, -1)):
            self._heard[switch] = ts
        self._candidates.extend(self._waiting)
        self._waiting = []

    def _release(self, map_name: str) -> None:
        """FETCHes parked on a map whose earliest pending write moved past them."""
        waiting = self._by_map.get(map_name)
        pending = self.pending_writes[map_name]
        while waiting and (not pending or waiting[0][0] <= pending[0]):
            _, _, dispatch, fetch = heapq.heappop(waiting)
            self._candidates.append((dispatch, fetch))

    def _read_slices(
        self, dispatch: Dispatch, fetches: Sequence[Fetch]
    ) -> list[tuple[Fetch, int, dict[Key, Any]]]:
        """Each fetch's slices as of just before the update, as (fetch, factor, entries): a
        slice is read once per map and pattern, and shared by the statements that read it
        (``_put_slice``). Where a corrective may revise a read, each slice is logged once per
        writer with the (statement, factor) pairs it was read for; else the map's newest read
        is noted."""
        ts, args, reads = dispatch.ts, dispatch.args, self._reads[dispatch.trigger]
        maps, log_reads = self.maps, self.log_reads
        seen: dict[tuple[str, Key], dict[Key, Any]] = {}
        uses: dict[tuple[str, Key, int], tuple[tuple[int, ...], list[tuple[int, int]]]] = {}
        served = []
        for fetch in fetches:
            for read, pattern_of, bound in reads[fetch.statement]:
                if read.factor not in fetch.factors:
                    continue
                pattern = pattern_of(args)
                entries = seen.get((read.map, pattern))
                if entries is None:
                    entries = maps[read.map].slice_before(pattern, ts, bound)
                    seen[(read.map, pattern)] = entries
                if log_reads:
                    for writer in fetch.writers:
                        use = uses.get((read.map, pattern, writer))
                        if use is None:
                            use = uses[(read.map, pattern, writer)] = (bound, [])
                        use[1].append((fetch.statement, read.factor))
                served.append((fetch, read.factor, entries))
        if log_reads:
            for (map_name, pattern, writer), (bound, used) in uses.items():
                entry = ReadEntry(ts, pattern, writer, tuple(used))
                self.reads[map_name].add(entry, bound)
        else:
            self._note_reads([map_name for map_name, _ in seen], ts)
        return served

    def _note_reads(self, map_names: Iterable[str], ts: Timestamp) -> None:
        """Where reads are not logged, the newest read of each map (``_unlogged`` checks
        every write against it)."""
        newest_read = self._newest_read
        for name in map_names:
            newest = newest_read.get(name)
            if newest is None or newest < ts:
                newest_read[name] = ts

    def _serve(self, work: list[tuple[Dispatch, Fetch]], out: Outbox) -> None:
        """PUSHes for the fetches of one update: one message per writer (to itself: taken at
        once, as if it came back, with no message)."""
        dispatch = work[0][0]
        ts = dispatch.ts
        by_writer: dict[int, tuple[list[int], list[_Piece]]] = {}
        fetches = [fetch for _, fetch in work]
        for fetch in fetches:
            for writer in fetch.writers:
                by_writer.setdefault(writer, ([], []))[0].append(fetch.statement)
        for fetch, factor, entries in self._read_slices(dispatch, fetches):
            piece = (fetch.statement, factor, entries)
            for writer in fetch.writers:
                by_writer[writer][1].append(piece)
        pairs: dict[int, tuple[tuple[Key, Any], ...]] = {}  # a slice's entries, as sent
        for writer, (statements, pieces) in by_writer.items():
            if writer == self.number:
                self._pushed(ts, statements, pieces)
                continue
            slices = []
            for statement, factor, entries in pieces:
                sent = pairs.get(id(entries))
                if sent is None:
                    sent = pairs[id(entries)] = tuple(entries.items())
                slices.append(Slice(statement, factor, sent))
            out.append((writer, Push(ts, self.number, tuple(statements), tuple(slices))))

    # --------------------------------------------------------------------------- writes

    def _evaluate(self, op: Operation, out: Outbox) -> None:
        if not self.log_reads:  # no read is logged, so no corrective comes to revise it
            del self.operations[(op.ts, op.statement)]
        step = self.placement.steps[op.trigger][op.statement]
        pending = self.pending_writes[step.target]
        pending.pop(bisect.bisect_left(pending, op.ts))
        self._pending -= 1
        self._release(step.target)
        self._written_op(op, out)

    def _written_op(self, op: Operation, out: Outbox) -> None:
        """The operation's result for the keys held here, written at its timestamp."""
        op.result = self._owned(op)
        self.completed.append(op.ts)
        step = self.placement.steps[op.trigger][op.statement]
        for key, delta in op.result.items():
            self._write(step.target, key, delta, op.ts, 0, out)
        if self.mode == "conservative":
            self._version_written(op.version)

    def _version_written(self, version: tuple[int, int]) -> None:
        self._left[version] -= 1
        if not self._left[version]:
            del self._left[version]
            stream, number = version
            finished = self._finished[stream]
            finished.add(number)
            while self._written[stream] in finished:
                finished.discard(self._written[stream])
                self._written[stream] += 1
            if self.per_switch:
                self._candidates.extend(self._waiting)
                self._waiting = []
                return
            while self._by_version and self._by_version[0][0] <= self._written[0]:
                _, _, dispatch, fetch = heapq.heappop(self._by_version)
                self._candidates.append((dispatch, fetch))

    def _owned(self, op: Operation) -> dict[Key, Any]:
        """The statement's result for the keys of its target this node holds."""
        step = self.compiled[op.trigger][op.statement]
        if self.placement.nodes == 1 or step.single_writer:
            return step.run(op.args, op.tables)  # one writer: the switch sent the PUT here alone
        return self._mine(step, step.run(op.args, op.tables))

    def _mine(self, step: CompiledStep, result: dict[Key, Any]) -> dict[Key, Any]:
        """The entries of a statement's result whose keys this node holds."""
        target = step.step.target
        if target in self.placement.whole:
            return result  # every node holds all of it, or its own part of every key
        homes = self._homes[target]  # the node of each first key seen (hashing costs)
        mine, owned = self.number, {}
        for key, value in result.items():
            home = homes.get(key[0])
            if home is None:
                home = homes[key[0]] = self.placement.node_of(target, key)
            if home == mine:
                owned[key] = value
        return owned

    def _write(
        self, map_name: str, key: Key, delta: Any, ts: Timestamp, depth: int, out: Outbox
    ) -> None:
        self.maps[map_name].write(key, delta, ts)
        self._log_entries += 1
        if not self.log_reads:
            self._unlogged(map_name, ts)
            return
        log = self.reads.get(map_name)
        if log is None or log.newest is None or log.newest <= ts:
            return  # no read of this map at a later timestamp was served yet
        late: dict[int, list[Read]] = defaultdict(list)
        for entry in log.late(key, ts):
            reads = late[entry.writer]
            for statement, factor in entry.uses:
                reads.append(Read(entry.ts, statement, factor))
        for writer, reads in late.items():
            self.stats.corrective_sent += 1
            self.stats.max_depth = max(self.stats.max_depth, depth + 1)
            self._sent += 1
            self._unsettled[self._sent] = (min(r.ts[0] for r in reads), self._cause)
            if self._cause is not None:
                self._caused[self._cause] += 1
            corrective = Corrective(
                self.number, ts, map_name, key, delta, tuple(reads), depth + 1, self._sent
            )
            out.append((writer, corrective))

    def _unlogged(self, map_name: str, ts: Timestamp) -> None:
        """A late write where reads are not logged breaks the rule that made them unneeded."""
        newest = self._newest_read.get(map_name)
        if newest is not None and ts < newest:
            raise ProtocolError(
                f"node {self.number}: a write to {map_name} at {ts} after a read of it at "
                f"{newest}, with reads not logged (one switch, in order)"
            )

    def _corrective(self, message: Corrective, out: Outbox) -> None:
        self.stats.corrective_received += 1
        cause = (message.source, message.seq)
        self._caused[cause] = 0
        self._cause = cause
        try:
            self._revise(message, out)
        finally:
            self._cause = None
        if not self._caused[cause]:
            self._settle(cause, out)

    def _revise(self, message: Corrective, out: Outbox) -> None:
        touched: dict[tuple[Timestamp, int], Operation] = {}
        for read in message.reads:
            op = self.operations.get((read.ts, read.statement)) or self._unfused(read)
            if op.local:  # read here: its slices are read again, the late write in them
                if (read.ts, read.statement) not in touched:
                    self._read_again(op)
                    touched[(read.ts, read.statement)] = op
                continue
            table = dict(op.tables.get(read.factor, ()))  # its own: slices are shared
            accumulate(table, message.key, message.delta)
            op.tables[read.factor] = table
            touched[(read.ts, read.statement)] = op
        for op in touched.values():
            if op.result is None:
                continue  # not evaluated yet: it will use the revised slices
            step = self.placement.steps[op.trigger][op.statement]
            revised = self._owned(op)
            for key in set(revised) | set(op.result):
                diff = add(revised.get(key, 0), -op.result.get(key, 0) if key in op.result else 0)
                if diff != 0:
                    self._write(step.target, key, diff, op.ts, message.depth, out)
            op.result = revised

    def _unfused(self, read: Read) -> Operation:
        """The operation of a statement that ran in a fused update (``LocalUpdate``), made
        when a corrective first names it."""
        kept = self.local[read.ts]
        result = kept.results[kept.statements.index(read.statement)]
        op = Operation(
            read.ts, read.statement, kept.trigger, kept.args, 0, 0, {}, result, local=True
        )
        self.operations[(read.ts, read.statement)] = op
        return op

    def _read_again(self, op: Operation) -> None:
        """A fused operation's slices as of just before it, now (every write known here
        below its timestamp in them): a corrective's re-evaluation sees each late write once,
        however many correctives for it are still on their way (the others then change
        nothing)."""
        tables: Tables = {}
        for read, pattern_of, bound in self._reads[op.trigger][op.statement]:
            entries = self.maps[read.map].slice_before(pattern_of(op.args), op.ts, bound)
            _put_slice(tables, read.factor, entries)
        op.tables = tables

    def _settle(self, cause: tuple[int, int], out: Outbox) -> None:
        del self._caused[cause]
        source, seq = cause
        out.append((source, Settled(seq)))

    def _settled(self, seq: int, out: Outbox) -> None:
        _, cause = self._unsettled.pop(seq)
        if cause is not None:
            self._caused[cause] -= 1
            if not self._caused[cause]:
                self._settle(cause, out)

    # --------------------------------------------------------------------------- epochs

    def _epoch_end(self, message: EpochEnd) -> None:
        # the next epoch's end may overtake this one's commit (they travel different links)
        self._not_committed(message.cut, message)
        self._ends[message.cut].add(message.switch)
        if self.per_switch:
            self._passed(message.switch, (message.cut, 1 << 62))

    def _epoch_progress(self, out: Outbox) -> None:
        """EPOCH READY once the cut is final here: every switch closed it (so every update up to
        it has arrived: links are FIFO), every write up to it is done, and every corrective this
        node sent that revises a read up to it is settled."""
        if self.log_limit is not None and not self._asked:
            if self._log_entries > self.log_limit:
                self._asked = True
                out.append((COORDINATOR, EpochEndRequest(self.number)))
        for cut in sorted(self._ends):
            if cut <= self.ready_cut:
                continue
            if len(self._ends[cut]) < self.switches:
                return
            if any(pending and pending[0][0] <= cut for pending in self.pending_writes.values()):
                return
            if any(lowest <= cut for lowest, _ in self._unsettled.values()):
                return
            self.ready_cut = cut
            out.append((COORDINATOR, EpochReady(cut, self.number)))

    def _commit(self, cut: int) -> None:
        """Garbage collection (seed 000 §3.4): logs up to the cut are folded or dropped."""
        if cut > self.ready_cut:
            raise ProtocolError(f"node {self.number} got EpochCommit for {cut} before being ready")
        for closed in [c for c in self._ends if c <= cut]:
            del self._ends[closed]
        for log in self.maps.values():
            log.fold(cut)
        self._log_entries = sum(log.entries() for log in self.maps.values())
        for reads in self.reads.values():
            reads.prune(cut)
        self.operations = {k: op for k, op in self.operations.items() if k[0][0] > cut}
        self.local = {ts: kept for ts, kept in self.local.items() if ts[0] > cut}
        for switch, puts in self._put_ts.items():  # all written: the count is what matters
            folded = bisect.bisect_right(puts, (cut, 1 << 62))
            del puts[:folded]
            self._put_base[switch] += folded
        self.committed, self._asked = cut, False
        self.stats.epochs += 1

    def _env(self, trigger: int, args: Key) -> dict[str, Any]:
        names = self.placement.program.triggers[trigger].args
        return dict(zip(names, args, strict=True))

    def preload(self, map_name: str, entries: Mapping[Key, Any]) -> None:
        """This node's part of a map computed outside the runtime before any update (the map's
        definition over a snapshot, DBToaster's SYSTEM READY): its base, as if written before
        every timestamp."""
        if self.operations or self.local or self.committed:
            raise ProtocolError(f"node {self.number}: preload after updates")
        log = self.maps[map_name]
        for key, value in entries.items():
            if value != 0:
                log.preloaded(key, value)

    @property
    def kept_operations(self) -> int:
        """Operations a corrective may still revise: kept as such, or in fused updates."""
        return len(self.operations) + sum(len(kept.statements) for kept in self.local.values())

    # --------------------------------------------------------------------------- reads

    def entries(self, map_name: str) -> dict[Key, Any]:
        """The newest values of this node's partition of a map (tentative)."""
        return dict(self.maps[map_name].current)

    def snapshot(self, map_name: str, cut: int) -> dict[Key, Any]:
        """This node's partition of a map at a cut it has committed, or is ready to (exact)."""
        if not self.committed <= cut <= self.ready_cut:
            raise ValueError(
                f"node {self.number} has no snapshot at {cut}: it committed {self.committed}"
            )
        log = self.maps[map_name]
        if cut == self.committed:  # folded at the commit: the base is the map at the cut
            return log.at_cut()
        found = {}
        for key in log.keys():
            value = log.value_at(key, cut)
            if value != 0:
                found[key] = value
        return found


def _put_slice(tables: Tables, factor: int, entries: Mapping[Key, Any] | Iterable[Any]) -> None:
    """A slice into an operation's table for ``factor``, added to those other nodes sent for
    it: a partitioned map's slices have no key in common, a partial map's are the parts of
    one. A slice read here is shared, not copied: the statements reading it hold the same
    dict, and nothing changes a table in place (``_revise`` replaces the one it revises)."""
    table = tables.get(factor)
    if table is None:
        tables[factor] = entries if type(entries) is dict else dict(entries)
        return
    table = dict(table)
    for key, value in entries.items() if isinstance(entries, Mapping) else entries:
        accumulate(table, key, value)
    tables[factor] = table
