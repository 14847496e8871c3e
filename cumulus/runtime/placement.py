"""Where every map entry lives, and which nodes an update's statements write and read.

Maps are hash-partitioned on their first key over the DW nodes (a map without keys lives on
one node, chosen by its name), so a statement whose target's first key is a trigger argument
has one writer, and a read whose first key is a trigger argument has one read node; a loop
variable in that position makes it every node (seed 001, Trigger Dispatch: the region of
partitions the loop variables' projection intersects).

A map that only the triggers of replicated relations write (dimensions: ``Source.replicated``)
is kept whole on every node: its statements are written at every node, and a statement
reading it reads the copy where it writes (``cumulus.runtime.switch``), so the updates of the
facts, which are most updates, read their dimensions' maps without a message (seed 003 §4's
co-clustering by data flow, bought with space: each dimension's maps once per node). Not
where partitioning finds it in place anyway: where every statement reading it writes a
partitioned map at the read's first key, or writes a partial map (below) reading nothing
else partitioned, it is partitioned like the others, and a dimension's update writes it at
one node.

The relations a program reads directly (bounded ``--depth``) are kept as maps too, named
``@relation``, keyed by the whole row with its multiplicity, and maintained by one more
statement on each of the relation's triggers: the runtime knows only maps.

A map no statement reads (what only views read: the view's own aggregates), or one only
dimensions' triggers read that some statement writes at an open first key, is **partial**
(unless its values are FLOAT, whose sums must add up in the updates' order)
(``Placement.partial``): every node keeps the sum of what it wrote, and a read adds the
nodes' parts up (``gather``; a PUSHed slice is added to the others, ``Node``). Its
statements run where their reads are, not where its keys are: at one node where they read
a partitioned map at a bound key or nothing partitioned, and, reading one map by an open
first key or a partial one (linearly), at each node holding a part of it, each over its own
part. A statement writing a partitioned map at an open first key and reading partitioned
maps only at that key runs so too (co-partitioned). A fact's update then computes the
view's deltas once, at one node, and a dimension's update reads no slice from another node.
Every statement is ``+=``, so the parts add up to the map.
"""

from __future__ import annotations

import datetime
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from cumulus.expressions import add
from cumulus.m3.exprs import vars_of
from cumulus.m3.program import Factor, Guard, MapRef, Program, Rel, Statement, Value
from cumulus.runtime.messages import WILD, Key


def relation_map(relation: str) -> str:
    return "@" + relation


def stable_hash(value: Any) -> int:
    """The same number in every process for equal values (Python salts str hashes per
    process; numbers hash by value, 1 == 1.0 == Decimal(1) alike)."""
    if isinstance(value, bool | int | float | Decimal):
        return hash(value)
    if isinstance(value, datetime.date):
        return value.toordinal()
    return zlib.crc32(str(value).encode())


@dataclass(frozen=True)
class Read:
    """A factor that reads a map: its position in the body, the map and its key variables."""

    factor: int
    map: str
    keys: tuple[str, ...]


@dataclass(frozen=True)
class Step:
    """One statement of a trigger as the runtime runs it."""

    number: int
    target: str
    target_keys: tuple[str, ...]
    body: tuple[Factor, ...]
    reads: tuple[Read, ...]
    switch_guards: tuple[Guard, ...]  # guards on trigger arguments only: checked at the switch


class Placement:
    def __init__(self, program: Program, nodes: int) -> None:
        if nodes < 1:
            raise ValueError("a Cumulus runtime needs at least one DW node")
        self.program = program
        self.nodes = nodes
        read = {f.relation for _, s in program.statements() for f in s.body if isinstance(f, Rel)}
        self.steps: list[tuple[Step, ...]] = []
        for trigger in program.triggers:
            statements = list(trigger.statements)
            if trigger.relation in read:
                sign = {"lit": 1 if trigger.sign == "+" else -1, "type": "INT"}
                statements.append(
                    Statement(MapRef(relation_map(trigger.relation), trigger.args), (Value(sign),))
                )
            args = set(trigger.args)
            self.steps.append(tuple(_step(number, s, args) for number, s in enumerate(statements)))
        self.key_counts = {m.name: len(m.keys) for m in program.maps}
        for source in program.sources:
            self.key_counts[relation_map(source.name)] = len(source.columns)
        self.replicated, self.partial = frozenset(), frozenset()
        if nodes > 1:
            self.replicated, self.partial = _kinds(program, self.steps, self.key_counts)
        self.whole = self.replicated | self.partial  # a writer keeps all of its result of these
        self._everywhere = tuple(range(nodes))
        # per trigger: the argument positions whose home node routes its update (a first key
        # of a partitioned map it writes or reads, or the one a partial map's writer is
        # chosen by), and per step the position its writer is chosen by if it is one
        self.homes: list[tuple[int, ...]] = []
        self._chosen_by: list[int] = []
        for trigger, steps in zip(program.triggers, self.steps, strict=True):
            keyed = [(s.target, s.target_keys) for s in steps]
            keyed += [(r.map, r.keys) for s in steps for r in s.reads]
            homes = {
                trigger.args.index(keys[0])
                for name, keys in keyed
                if nodes > 1
                and self.key_counts.get(name)
                and name not in self.whole
                and keys[0] in trigger.args
            }
            chosen = min(homes, default=0)
            if nodes > 1 and any(self._by_home(s, trigger.args) for s in steps):
                homes.add(chosen)
            self.homes.append(tuple(sorted(homes)))
            self._chosen_by.append(chosen)

    def holders(self, map_name: str, key: Key) -> tuple[int, ...]:
        """The nodes holding the entry at ``key``: every node for a replicated map."""
        if map_name in self.replicated:
            return self._everywhere
        return (self.node_of(map_name, key),)

    def parts(self, map_name: str, entries: Mapping[Key, Any]) -> dict[int, dict[Key, Any]]:
        """``entries`` by the nodes holding them (a preload's messages)."""
        by_node: dict[int, dict[Key, Any]] = {}
        for key, value in entries.items():
            for holder in self.holders(map_name, key):
                by_node.setdefault(holder, {})[key] = value
        return by_node

    def read_from(self, map_name: str) -> tuple[int, ...]:
        """The nodes whose entries together are the whole map: node 0's copy of a replicated
        one, every node's part of the others."""
        return self._everywhere[:1] if map_name in self.replicated else self._everywhere

    def gather(self, map_name: str, parts: Iterable[Mapping[Key, Any]]) -> dict[Key, Any]:
        """The whole map from the parts of the nodes ``read_from`` names: a partial map's
        added up key by key (a zero sum is no entry), the others' disjoint parts together."""
        found: dict[Key, Any] = {}
        if map_name not in self.partial:
            for part in parts:
                found.update(part)
            return found
        for part in parts:
            for key, value in part.items():
                total = add(found.get(key, 0), value)
                if total != 0:
                    found[key] = total
                else:
                    found.pop(key, None)
        return found

    def writers(self, trigger: int, step: Step) -> tuple[Callable[[Key], tuple[int, ...]], bool]:
        """The nodes writing ``step`` as a function of the update's values, and whether each
        reads all the step reads at itself: where it reads replicated maps only (its own
        copies), where it is co-partitioned, and for a partial target, whose writers are
        chosen by where its reads are (``partial`` in the module's docstring)."""
        args = self.program.triggers[trigger].args
        spread = [r for r in step.reads if r.map not in self.replicated]
        if step.target not in self.partial:
            route = self.route(step.target, step.target_keys, args)
            return route, not spread or self._co_partitioned(step, args)
        if self._by_home(step, args):
            at, nodes = self._chosen_by[trigger], self.nodes
            return (lambda values: (stable_hash(values[at]) % nodes,)), not spread
        one = spread[0] if len(spread) == 1 else next(r for r in spread if self._bound(r, args))
        return self.route(one.map, one.keys, args), len(spread) == 1

    def _bound(self, read: Read, args: tuple[str, ...]) -> bool:
        """Whether one node holds what ``read`` reads, whatever the update."""
        if read.map in self.partial:
            return False  # a part on every node
        return not self.key_counts.get(read.map) or read.keys[0] in args

    def _co_partitioned(self, step: Step, args: tuple[str, ...]) -> bool:
        """Whether each writer of a statement writing a partitioned map at an open first key
        finds all it needs at itself: every partitioned map it reads is read at that same
        key, so the entries its keys are computed from are where those keys are."""
        if step.target in self.whole or not step.target_keys or step.target_keys[0] in args:
            return False
        first = step.target_keys[0]
        spread = [r for r in step.reads if r.map not in self.replicated]
        return bool(spread) and all(
            r.map not in self.partial and self.key_counts.get(r.map) and r.keys[0] == first
            for r in spread
        )

    def _by_home(self, step: Step, args: tuple[str, ...]) -> bool:
        """Whether a partial target's one writer is chosen by an argument's home: the step
        reads no partitioned map, or several, none of them where one node holds it, or one
        that neither one node holds nor is read linearly (a map lift's value)."""
        if step.target not in self.partial:
            return False
        spread = [r for r in step.reads if r.map not in self.replicated]
        if len(spread) == 1:
            read = spread[0]
            linear = type(step.body[read.factor]) in (MapRef, Rel)
            return not (linear or self._bound(read, args))
        return not any(self._bound(r, args) for r in spread)

    def node_of(self, map_name: str, key: Key) -> int:
        """The node holding the entry at ``key`` of a map that is not replicated."""
        if not self.key_counts.get(map_name):
            return zlib.crc32(map_name.encode()) % self.nodes
        return stable_hash(key[0]) % self.nodes

    def nodes_for(self, map_name: str, pattern: Key) -> tuple[int, ...]:
        """The nodes holding entries that match ``pattern`` (WILD where a key is open)."""
        if map_name in self.whole:
            return self._everywhere  # a copy or a part on every node
        if not self.key_counts.get(map_name) or pattern[0] is not WILD:
            return (self.node_of(map_name, pattern),)
        return tuple(range(self.nodes))

    @staticmethod
    def pattern(keys: tuple[str, ...], env: dict[str, Any]) -> Key:
        return tuple(env[k] if k in env else WILD for k in keys)

    @staticmethod
    def pattern_of(keys: tuple[str, ...], args: tuple[str, ...]) -> Callable[[Key], Key]:
        """``pattern`` as a function of the trigger's argument values, planned once."""
        parts = [f"values[{args.index(k)}]" if k in args else "WILD" for k in keys]
        code = f"lambda values: ({''.join(part + ', ' for part in parts)})"
        return eval(code, {"WILD": WILD})  # noqa: S307 (generated: one tuple display)

    def route(
        self, map_name: str, keys: tuple[str, ...], args: tuple[str, ...]
    ) -> Callable[[Key], tuple[int, ...]]:
        """``nodes_for`` the map's entries an update can touch, as a function of the trigger's
        argument values, planned once: a constant unless the first key is an argument."""
        if (
            not self.key_counts.get(map_name)
            or self.nodes == 1
            or map_name in self.whole
            or keys[0] not in args
        ):
            fixed = self.nodes_for(map_name, (WILD,) * len(keys) if keys else ())
            return lambda values: fixed
        at = args.index(keys[0])
        return lambda values: (self.node_of(map_name, (values[at],)),)


def _kinds(
    program: Program, steps: list[tuple[Step, ...]], key_counts: Mapping[str, int]
) -> tuple[frozenset[str], frozenset[str]]:
    """The replicated maps and the partial ones (the module's docstring).

    A map only dimensions' triggers write is replicated unless every statement reading it
    finds it where the statement runs anyway: one writing a partitioned map at the read's
    first key, or one writing a partial map with no other read of a map that is not
    replicated, read at a bound key or linearly (decided map by map, in name order until
    nothing changes, so such a statement keeps at most one). A map no statement reads is
    partial, and so is one only dimensions' triggers read that some statement writes at an
    open first key (partitioned, every node would write it), unless its values are FLOAT."""
    dimensions = {source.name for source in program.sources if source.replicated}
    writers: dict[str, set[str]] = {}
    fact_reads: set[str] = set()
    open_writes: set[str] = set()  # written at a first key no argument binds
    readers: dict[str, list[tuple[Step, Read, tuple[str, ...]]]] = {}
    for trigger, trigger_steps in zip(program.triggers, steps, strict=True):
        for step in trigger_steps:
            writers.setdefault(step.target, set()).add(trigger.relation)
            if step.target_keys and step.target_keys[0] not in trigger.args:
                open_writes.add(step.target)
            for read in step.reads:
                readers.setdefault(read.map, []).append((step, read, trigger.args))
                if trigger.relation not in dimensions:
                    fact_reads.add(read.map)
    replicated = {name for name, by in writers.items() if by <= dimensions}
    # FLOAT sums stay where their keys are: parts added up would round in another order
    # than the updates' (1e16 + 1 - 1e16 is 0 in order, 1 in parts)
    floats = {m.name for m in program.maps if m.value_type.kind == "FLOAT"}
    partial = frozenset(
        name
        for name in set(writers) - replicated - fact_reads - floats
        if name not in readers or name in open_writes
    )

    def found_in_place(step: Step, read: Read, args: tuple[str, ...]) -> bool:
        if step.target in partial:  # read at its writer if the only one, bound or linear
            linear = read.keys[0] in args or type(step.body[read.factor]) in (MapRef, Rel)
            others = [r for r in step.reads if r is not read]
            return linear and all(r.map in replicated and r.map != read.map for r in others)
        return (
            step.target not in replicated
            and bool(key_counts.get(step.target))
            and step.target_keys[0] == read.keys[0]
        )

    changed = True
    while changed:  # a map no longer replicated may be the target another is found with
        changed = False
        for name in sorted(replicated):
            if key_counts.get(name) and all(found_in_place(*use) for use in readers.get(name, [])):
                replicated.discard(name)
                changed = True
    return frozenset(replicated), partial


def _step(number: int, statement: Statement, args: set[str]) -> Step:
    reads = []
    for position, factor in enumerate(statement.body):
        if isinstance(factor, MapRef):
            reads.append(Read(position, factor.name, factor.keys))
        elif isinstance(factor, Rel):
            reads.append(Read(position, relation_map(factor.relation), factor.args))
    guards = tuple(
        f for f in statement.body if isinstance(f, Guard) and set(vars_of(f.pred)) <= args
    )
    return Step(
        number,
        statement.target.name,
        statement.target.keys,
        statement.body,
        tuple(reads),
        guards,
    )
