"""The M3 program model: sources, maps with their definitions, queries and views, triggers.

A statement is ``target[keys] += f1 * f2 * ...``; its factors are map lookups, relation atoms
(the relation's current contents: only programs compiled with a bounded ``--depth`` read them),
value terms (a variable, a constant, an arithmetic term), 0/1 guards and lifts (``(v ^= e)``
binds v to the value of e). A key of a lookup that no earlier factor binds is a *loop
variable*: the statement ranges over the slice of that map (seed 001's "cross-section update").

Expressions are the view plan's JSON trees (``cumulus.plan``) with ``{"var": name}`` in place of
column references, plus the guard ``{"notnull": e}`` (SQL skips NULL arguments and NULL join
keys; DBToaster's calculus has no NULL, so the guard says it explicitly).

A map's *definition* ``AggSum([keys], body)`` is its meaning over the base relations: what bulk
initialization computes and what verification compares with.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from aggview.errors import InvalidArgument
from aggview.schema import Column, ColumnType
from cumulus.aggregates import Kind

Expr = dict[str, Any]
# the kinds a view column may be, by name (COUNT(*) is a COUNT of the rows map)
VIEW_KINDS = tuple(k for k in Kind if k is not Kind.COUNT_STAR)


@dataclass(frozen=True)
class MapRef:
    """``name[keys]``: a lookup (or a slice, where a key is a loop variable)."""

    name: str
    keys: tuple[str, ...]


@dataclass(frozen=True)
class Rel:
    """``R(args)``: the rows of a base relation as they were before the trigger."""

    relation: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class Value:
    """A number to multiply by: a variable, a constant or an arithmetic term."""

    expr: Expr = field(hash=False)


@dataclass(frozen=True)
class Guard:
    """1 if the predicate is true, else 0 (NULL is false, as in SQL's WHERE)."""

    pred: Expr = field(hash=False)


@dataclass(frozen=True)
class Lift:
    """``(var ^= expr)``: binds var to expr's value (or tests equality if var is bound)."""

    var: str
    expr: Expr = field(hash=False)


@dataclass(frozen=True)
class MapLift(MapRef):
    """``(var ^= name[keys])``: binds var to the map's value at keys (all bound), 0 where it
    has no entry. A nested aggregate read as a value (DBToaster's ``(n ^= N[k])``): unlike a
    lookup it does not multiply, so a statement reading it is not linear in the map; the
    runtime reads it as it reads any map (a slice pushed, corrected when revised)."""

    var: str = ""


@dataclass(frozen=True)
class MapExtreme(MapLift):
    """``(var ^= MIN(cnt[g, v]))``: the least (greatest) v of the slice at g whose count is
    positive, NULL where none is: a nested MIN or MAX read from its count map. The last key
    is a placeholder, never bound. ``adjust`` (value, delta): that entry's count as changed
    by the update (the new extreme, read before the update is applied); a value bound by a
    ``SLICE`` (``extreme`` "slice": the slice's entries as ((v, count), ...), no extreme) is
    many entries' change, each count times delta."""

    extreme: str = "min"
    adjust: tuple[Expr, Expr] | None = field(default=None, hash=False)


def lift_keys(factor: MapLift) -> tuple[str, ...]:
    """The keys a map lift reads at (bound first): a MIN/MAX's slice prefix."""
    return factor.keys[:-1] if isinstance(factor, MapExtreme) else factor.keys


Factor = MapRef | Rel | Value | Guard | Lift


@dataclass(frozen=True)
class AggSum:
    """``AggSum([keys], f1 * f2 * ...)``: the body summed over every variable but the keys."""

    keys: tuple[str, ...]
    body: tuple[Factor, ...]


@dataclass(frozen=True)
class Source:
    """A base relation the program's triggers fire on (``CREATE STREAM``). ``replicated``
    (``CREATE TABLE``): a dimension, which every view joins on its whole primary key, so
    each of its rows meets many of the facts' and its updates are the rare ones; the maps only
    its triggers write are kept whole on every DW node (``Placement``), so that a fact's
    update reads them where it writes."""

    name: str
    columns: tuple[Column, ...]
    replicated: bool = False

    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


@dataclass(frozen=True)
class MapDecl:
    name: str
    value_type: ColumnType
    keys: tuple[tuple[str, ColumnType], ...]
    definition: AggSum | None = None


@dataclass(frozen=True)
class Statement:
    target: MapRef
    body: tuple[Factor, ...]


@dataclass(frozen=True)
class Trigger:
    """``ON + R(args) { ... }`` (sign "+") or ``ON - R(args)`` (sign "-")."""

    sign: str
    relation: str
    args: tuple[str, ...]
    statements: tuple[Statement, ...]


@dataclass(frozen=True)
class PartSum:
    """``(p1 + p2 + ...)``: a UNION ALL's branches read as one part (each keyed alike)."""

    parts: tuple[MapRef | AggSum, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return self.parts[0].keys


# what a query reads: a map, (depth 0) an aggregate over relations, or a union's sum of them
Part = MapRef | AggSum | PartSum


@dataclass(frozen=True)
class Query:
    """DBToaster's ``DECLARE QUERY name := part;``: a map (or aggregate) a user reads."""

    name: str
    part: Part


@dataclass(frozen=True)
class ViewColumn:
    """One column of a view: a group key (kind None), an aggregate read from parts, or a
    derived column (kind None, ``expr`` over the group keys and aggregates, finished when read).

    SUM and AVG add their ``parts`` (one per monomial of the argument) and read ``count`` (the
    non-NULL arguments: SUM over none is NULL); COUNT reads one part; MIN, MAX and
    COUNT_DISTINCT read one count map whose last key is the value (``cnt[g, v]``).
    """

    name: str
    kind: Kind | None = None
    parts: tuple[Part, ...] = ()
    count: Part | None = None
    type: ColumnType | None = None
    hidden: bool = False
    expr: Expr | None = field(default=None, hash=False)  # derived: over the other columns


@dataclass(frozen=True)
class View:
    """A user's view over the maps: groups are the entries of ``rows`` (COUNT(*) > 0); HAVING
    is applied when read, over the view's columns (as variables)."""

    name: str
    keys: tuple[tuple[str, ColumnType], ...]
    rows: Part
    columns: tuple[ViewColumn, ...]
    having: Expr | None = field(default=None, hash=False)


@dataclass(frozen=True)
class Program:
    sources: tuple[Source, ...]
    maps: tuple[MapDecl, ...]
    queries: tuple[Query, ...] = ()
    views: tuple[View, ...] = ()
    triggers: tuple[Trigger, ...] = ()

    def source(self, name: str) -> Source:
        for source in self.sources:
            if source.name == name:
                return source
        raise InvalidArgument(f"the program has no relation {name!r}")

    def map(self, name: str) -> MapDecl:
        for decl in self.maps:
            if decl.name == name:
                return decl
        raise InvalidArgument(f"the program has no map {name!r}")

    def trigger(self, sign: str, relation: str) -> Trigger | None:
        for trigger in self.triggers:
            if trigger.sign == sign and trigger.relation == relation:
                return trigger
        return None

    def statements(self) -> Iterator[tuple[Trigger, Statement]]:
        for trigger in self.triggers:
            for statement in trigger.statements:
                yield trigger, statement

    def restricted_to(self, roots: list[str]) -> Program:
        """The maps ``roots`` read, transitively, and only the statements that write them: the
        sub-program that maintains some maps (e.g. one aggregate of a view)."""
        keep: set[str] = set()
        todo = list(roots)
        while todo:
            name = todo.pop()
            if name in keep:
                continue
            keep.add(name)
            for _, statement in self.statements():
                if statement.target.name == name:
                    todo += [f.name for f in statement.body if isinstance(f, MapRef)]
        triggers = tuple(
            Trigger(
                t.sign,
                t.relation,
                t.args,
                tuple(s for s in t.statements if s.target.name in keep),
            )
            for t in self.triggers
        )
        return Program(
            self.sources,
            tuple(m for m in self.maps if m.name in keep),
            (),
            (),
            tuple(t for t in triggers if t.statements),
        )


def part_refs(part: Part) -> Iterator[MapRef | Rel]:
    """The maps and relations a query part reads."""
    if isinstance(part, MapRef):
        yield part
    elif isinstance(part, PartSum):
        for each in part.parts:
            yield from part_refs(each)
    else:
        yield from (f for f in part.body if isinstance(f, MapRef | Rel))


def view_parts(view: View) -> Iterator[Part]:
    yield view.rows
    for column in view.columns:
        yield from column.parts
        if column.count is not None:
            yield column.count
