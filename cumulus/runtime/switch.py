"""The switch as a state machine: an update in, the ``Dispatch`` messages for it out.

For each statement of the update's trigger (seed 001, Trigger Dispatch): guards on the trigger
arguments are checked here (a false one sends nothing for that statement); the writers are the
nodes holding the target's partitions the update can touch; each map factor's read nodes get a
FETCH naming the writers; each writer's PUT says how many PUSHes to wait for. Everything for
one node and one update goes in one message.

Timestamps come from a ``Clock``. Speculative: one per switch, so no switch waits for
another; the total order is (counter, switch) and the counters are pulled together at each
epoch end. Conservative: one shared by all switches (seed 003's "central coordinator"), because
seed 001's version numbers need every node's PUTs counted in one order before they are sent.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aggview import errors
from cumulus.m3.exprs import compile_guard
from cumulus.m3.interpreter import Interpreter
from cumulus.runtime.messages import Dispatch, EpochEnd, Fetch, Timestamp
from cumulus.runtime.placement import Placement, stable_hash

ROUTED = 4096  # planned signatures kept per trigger (a cache: cleared when full)


@dataclass(frozen=True)
class _Route:
    """One step as the switch dispatches it."""

    number: int
    guards: list[Callable[[dict[str, Any]], bool]]
    writers: Callable[[tuple[Any, ...]], tuple[int, ...]]
    reads: list[tuple[int, Callable[[tuple[Any, ...]], tuple[int, ...]]]]
    local: tuple[int, ...]  # the factors reading replicated maps: read where written
    # every factor reading a map, where each writer reads them all at itself (its own
    # copies, its own parts: ``Placement.writers``), else None
    at_writer: tuple[int, ...] | None


class Clock:
    """Timestamp counters, and per node how many updates with PUTs for it were dispatched."""

    def __init__(self) -> None:
        self.counter = 0
        self.puts: dict[int, int] = defaultdict(int)


class Switch:
    def __init__(self, placement: Placement, number: int, clock: Clock | None = None) -> None:
        self.placement = placement
        self.number = number
        self.clock = clock or Clock()
        program = placement.program
        self._checker = Interpreter(program)  # checks and converts stream rows, names bad ones
        self._triggers = {(t.sign, t.relation): i for i, t in enumerate(program.triggers)}
        # per trigger, per step: its guards, its writers and each read's nodes as functions of
        # the update's values (planned once: an update only hashes its first keys)
        self._plans: list[list[_Route]] = []
        for number, steps in enumerate(placement.steps):
            args = program.triggers[number].args
            plan = []
            for step in steps:
                writers, self_read = placement.writers(number, step)
                plan.append(
                    _Route(
                        step.number,
                        [compile_guard(g.pred) for g in step.switch_guards],
                        writers,
                        [
                            (r.factor, placement.route(r.map, r.keys, args))
                            for r in step.reads
                            if r.map not in placement.replicated
                        ],
                        tuple(r.factor for r in step.reads if r.map in placement.replicated),
                        tuple(r.factor for r in step.reads) if self_read else None,
                    )
                )
            self._plans.append(plan)

        # per trigger: the routes with guards, the argument positions whose home node routes
        # (``Placement.homes``), and the planned parts by signature
        self._guarded = [[i for i, r in enumerate(plan) if r.guards] for plan in self._plans]
        self._homes = placement.homes
        self._routed: list[dict[Any, Any]] = [{} for _ in self._plans]

    def stamp(self) -> Timestamp:
        self.clock.counter += 1
        return (self.clock.counter, self.number)

    def update_at(
        self,
        counter: int,
        sign: str,
        relation: str,
        row: Sequence[Any] | Mapping[str, Any],
        checked: bool = False,
    ) -> tuple[Timestamp, list[tuple[int, Dispatch]]]:
        """Like ``update``, stamped ``(counter, switch)`` by the caller (a coordinating member's
        commit timestamp): counters must rise on this switch and stay above every cut it
        closed, or the nodes could not trust its EPOCH ENDs. ``checked``: a tuple row is the
        relation's values as ``check`` gives them (a stored row read back at its schema's
        types, which the relation's are), so it is not checked again; any other row is."""
        values = row if checked and type(row) is tuple else self.check(sign, relation, row)
        trigger = self._triggers.get((sign, relation))
        if trigger is None:
            raise errors.InvalidArgument(f"no trigger ON {sign} {relation}")
        if counter <= self.clock.counter:
            raise errors.FailedPrecondition(
                f"switch {self.number}: update stamped {counter} after {self.clock.counter}"
            )
        self.clock.counter = counter
        ts = (counter, self.number)
        return ts, self.dispatch(ts, trigger, values)

    def close(self, cut: int) -> list[tuple[int, EpochEnd]]:
        """Ends the epoch at ``cut``: nothing is stamped at or below it any more, and every node
        hears so after this switch's updates up to it (links are FIFO)."""
        self.clock.counter = max(self.clock.counter, cut)
        return [(node, EpochEnd(cut, self.number)) for node in range(self.placement.nodes)]

    def check(
        self, sign: str, relation: str, row: Sequence[Any] | Mapping[str, Any]
    ) -> tuple[Any, ...]:
        """The row's values, converted; an ``errors`` exception naming a row that does not fit."""
        return self._checker.check(sign, relation, row)

    def update(
        self, sign: str, relation: str, row: Sequence[Any] | Mapping[str, Any]
    ) -> tuple[Timestamp, list[tuple[int, Dispatch]]]:
        """The update's timestamp and its messages; a bad row raises (nothing is stamped)."""
        values = self.check(sign, relation, row)
        trigger = self._triggers.get((sign, relation))
        if trigger is None:  # check() refuses these; kept for a program without the trigger
            raise errors.InvalidArgument(f"no trigger ON {sign} {relation}")
        ts = self.stamp()
        return ts, self.dispatch(ts, trigger, values)

    def dispatch(
        self, ts: Timestamp, trigger: int, values: tuple[Any, ...]
    ) -> list[tuple[int, Dispatch]]:
        # The routes depend on the values only through the guards and the home node of the
        # arguments that are first keys: the messages' parts are planned once per such
        # signature and reused (``_routed``).
        routes = self._plans[trigger]
        guarded = self._guarded[trigger]
        passed: tuple[bool, ...] = ()
        if guarded:
            env = dict(zip(self.placement.program.triggers[trigger].args, values, strict=True))
            oks = []
            for i in guarded:
                ok = True
                for guard in routes[i].guards:
                    if not guard(env):
                        ok = False
                        break
                oks.append(ok)
            passed = tuple(oks)
        nodes = self.placement.nodes
        at_homes = self._homes[trigger]  # none on one node: nothing to hash
        homes = tuple([stable_hash(values[at]) % nodes for at in at_homes]) if at_homes else ()
        cache = self._routed[trigger]
        parts = cache.get((passed, homes))
        if parts is None:
            if len(cache) >= ROUTED:
                cache.clear()
            parts = cache[(passed, homes)] = self._route(trigger, values, passed)
        out = []
        counts = self.clock.puts
        for node, puts, fetches in parts:
            before = counts[node]
            if puts:
                counts[node] = before + 1
            out.append((node, Dispatch(ts, trigger, values, puts, fetches, before)))
        return out

    def _route(
        self, trigger: int, values: tuple[Any, ...], passed: tuple[bool, ...]
    ) -> list[tuple[int, tuple[tuple[int, int], ...], tuple[Fetch, ...]]]:
        """Per node, in node order: the update's PUTs (statement, PUSHes to wait for) and
        FETCHes, for the routes whose guards passed. A replicated map is read where the
        statement writes: by each writer from its own copy where the statement reads nothing
        else (``at_writer``), else at its one writer; with several writers, by a node that
        reads for all of them anyway (a writer if one does), so that it adds no PUSH."""
        failed = {i for i, ok in zip(self._guarded[trigger], passed, strict=True) if not ok}
        puts: dict[int, list[tuple[int, int]]] = defaultdict(list)
        fetches: dict[int, list[Fetch]] = defaultdict(list)
        for i, route in enumerate(self._plans[trigger]):
            if i in failed:
                continue
            writers = route.writers(values)
            if route.at_writer is not None:
                for writer in writers:
                    if route.at_writer:
                        fetches[writer].append(Fetch(route.number, route.at_writer, (writer,)))
                    puts[writer].append((route.number, 1 if route.at_writer else 0))
                continue
            by_node: dict[int, list[int]] = {}
            for factor, nodes_of in route.reads:
                for node in nodes_of(values):
                    by_node.setdefault(node, []).append(factor)
            if route.local:  # with what a writer reads, else with what some node reads
                home = writers[0]
                if len(writers) > 1 and home not in by_node:
                    home = next((w for w in writers if w in by_node), next(iter(by_node)))
                by_node.setdefault(home, []).extend(route.local)
            for node, factors in by_node.items():
                fetches[node].append(Fetch(route.number, tuple(factors), writers))
            for writer in writers:
                puts[writer].append((route.number, len(by_node)))
        return [
            (node, tuple(puts[node]), tuple(fetches[node]))
            for node in sorted(set(puts) | set(fetches))
        ]
