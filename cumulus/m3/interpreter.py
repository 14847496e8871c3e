"""The reference interpreter: runs an M3 program over a stream of inserts and deletes, one
update at a time, exactly as the seeds define it. It is the oracle the distributed runtime is
tested against, so it favours plain rules over cleverness:

- every statement of a trigger reads the maps as they were before the trigger began (all
  deltas are computed first, then applied; seed 000 §2, seed 002 Example 4);
- a loop variable ranges over the slice of the right-hand map it indexes (secondary indexes
  per partial-key pattern, as seed 003 §3.1 describes), never over the left-hand map;
- a missing entry is zero, and an entry whose value returns to zero is removed;
- INT and DECIMAL arithmetic is exact; FLOAT only where a FLOAT column brings it in;
- a relation a statement or query reads directly (bounded ``--depth``) is kept as a multiset,
  updated after the trigger's statements ran.

A stream row is checked against its relation's columns before anything changes; a bad row
raises an ``aggview.errors`` exception that names it and leaves every map as it was.
"""

from __future__ import annotations

import datetime
import functools
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from aggview import errors
from aggview.schema import INT_MAX, INT_MIN, Column, from_storage, to_storage
from cumulus.expressions import add, mul
from cumulus.m3.codegen import TriggerStatement, compile_trigger
from cumulus.m3.exprs import Env, compile_guard, compile_value, extreme_of
from cumulus.m3.order import plan_order, produced
from cumulus.m3.program import (
    AggSum,
    Factor,
    Guard,
    Lift,
    MapExtreme,
    MapLift,
    MapRef,
    Part,
    PartSum,
    Program,
    Rel,
    Source,
    Statement,
    Value,
    part_refs,
    view_parts,
)
from cumulus.m3.value_kinds import typing_of

Key = tuple[Any, ...]
Step = Callable[[Env, Any], None]


class Store:
    """One map (or a relation as a multiset): key tuple -> nonzero value, with secondary
    indexes {bound positions: {partial key: {full key: None}}} built on first use."""

    __slots__ = ("data", "indexes")

    def __init__(self) -> None:
        self.data: dict[Key, Any] = {}
        self.indexes: dict[tuple[int, ...], dict[Key, dict[Key, None]]] = {}

    def index(self, positions: tuple[int, ...]) -> dict[Key, dict[Key, None]]:
        found = self.indexes.get(positions)
        if found is None:
            found = self.indexes[positions] = {}
            for key in self.data:
                found.setdefault(tuple(key[i] for i in positions), {})[key] = None
        return found

    def add(self, key: Key, delta: Any) -> None:
        old = self.data.get(key)
        if old is None:
            if delta == 0:
                return
            self.data[key] = delta
            for positions, index in self.indexes.items():
                index.setdefault(tuple(key[i] for i in positions), {})[key] = None
            return
        new = add(old, delta)
        if new != 0:
            self.data[key] = new
            return
        del self.data[key]
        for positions, index in self.indexes.items():
            partial = tuple(key[i] for i in positions)
            bucket = index[partial]
            del bucket[key]
            if not bucket:
                del index[partial]


def key_getter(names: Sequence[str]) -> Callable[[Env], Key]:
    if not names:
        return lambda env: ()
    if len(names) == 1:
        only = names[0]
        return lambda env: (env[only],)
    return operator.itemgetter(*names)  # type: ignore[return-value]


class Interpreter:
    """Sequential execution of one program. ``keep_relations`` keeps every relation's rows
    (needed to evaluate map definitions, ``verify``), not only those statements read."""

    def __init__(
        self, program: Program, keep_relations: bool = False, *, compiled: bool = True
    ) -> None:
        self.program = program
        self.sources = {s.name: s for s in program.sources}
        self.maps = {m.name: Store() for m in program.maps}
        read = {r.relation for _, s in program.statements() for r in s.body if isinstance(r, Rel)}
        for part in [q.part for q in program.queries] + [
            p for v in program.views for p in view_parts(v)
        ]:
            read |= {r.relation for r in part_refs(part) if isinstance(r, Rel)}
        if keep_relations:
            read |= set(self.sources)
        self.relations = {name: Store() for name in sorted(read)}
        self.counter = [0]  # map entries read by triggers (a measure of per-update work)
        self._checkers = {name: _row_checker(source) for name, source in self.sources.items()}
        self._triggers: dict[tuple[str, str], Callable[[Key], None]] = {}
        build = self._generate_trigger if compiled else self._compile_trigger
        for trigger in program.triggers:
            self._triggers[(trigger.sign, trigger.relation)] = build(
                trigger.sign, trigger.relation, trigger.args, trigger.statements
            )
        self._parts: dict[AggSum, Callable[[], dict[Key, Any]]] = {}

    # --- the stream --------------------------------------------------------------------------

    def insert(self, relation: str, row: Sequence[Any] | Mapping[str, Any]) -> None:
        self.apply("+", relation, row)

    def delete(self, relation: str, row: Sequence[Any] | Mapping[str, Any]) -> None:
        self.apply("-", relation, row)

    def update(
        self,
        relation: str,
        old: Sequence[Any] | Mapping[str, Any],
        new: Sequence[Any] | Mapping[str, Any],
    ) -> None:
        """An UPDATE is a delete and an insert (seed 000 §2); both rows are checked first."""
        self.check("-", relation, old)
        self.check("+", relation, new)
        self.apply("-", relation, old)
        self.apply("+", relation, new)

    def check(self, sign: str, relation: str, row: Sequence[Any] | Mapping[str, Any]) -> Key:
        """The row's values, converted; an ``errors`` exception naming the row if it is bad."""
        checker = self._checkers.get(relation)
        if checker is not None and (sign, relation) in self._triggers:
            return checker(row, lambda: f"stream row {sign}{relation}{_shown(row)}")
        shown = f"stream row {sign}{relation}{_shown(row)}"
        if sign not in ("+", "-"):
            raise errors.InvalidArgument(f"{shown}: the sign must be + or -")
        if checker is None:
            raise errors.UnknownTable(f"{shown}: the program has no relation {relation!r}")
        raise errors.InvalidArgument(f"{shown}: the program has no trigger ON {sign} {relation}")

    def apply(self, sign: str, relation: str, row: Sequence[Any] | Mapping[str, Any]) -> None:
        values = self.check(sign, relation, row)
        self._triggers[(sign, relation)](values)
        store = self.relations.get(relation)
        if store is not None:
            store.add(values, 1 if sign == "+" else -1)

    # --- compilation of triggers and products --------------------------------------------------

    def _generate_trigger(
        self, sign: str, relation: str, args: tuple[str, ...], statements: tuple[Statement, ...]
    ) -> Callable[[Key], None]:
        """The trigger as generated Python (``cumulus.m3.codegen``); the closures of
        ``_compile_trigger`` where Python cannot compile it (nested past its limits)."""
        parts = []
        for number, statement in enumerate(statements, 1):
            where = f"statement {number} of ON {sign} {relation}"
            _check_target(statement, args, where)
            target = self.maps[statement.target.name]
            parts.append(TriggerStatement(statement.body, statement.target.keys, target, where))
        try:
            typing = typing_of(self.program, self.program.trigger(sign, relation))
            return compile_trigger(args, parts, self._store_of, self.counter, typing)
        except (SyntaxError, RecursionError):
            return self._compile_trigger(sign, relation, args, statements)

    def _store_of(self, factor: MapRef | Rel) -> Store:
        if isinstance(factor, MapRef):
            return self.maps[factor.name]
        return self.relations[factor.relation]

    def _compile_trigger(
        self, sign: str, relation: str, args: tuple[str, ...], statements: tuple[Statement, ...]
    ) -> Callable[[Key], None]:
        compiled: list[tuple[Step, dict[Key, Any], Store]] = []
        for number, statement in enumerate(statements, 1):
            out: dict[Key, Any] = {}
            getkey = key_getter(statement.target.keys)

            def emit(env: Env, acc: Any, out: dict[Key, Any] = out, getkey=getkey) -> None:  # type: ignore[no-untyped-def]
                key = getkey(env)
                old = out.get(key)
                out[key] = acc if old is None else add(old, acc)

            where = f"statement {number} of ON {sign} {relation}"
            run = self._chain(statement.body, set(args), emit, where)
            _check_target(statement, args, where)
            compiled.append((run, out, self.maps[statement.target.name]))
        names = list(args)

        def fire(values: Key) -> None:
            env = dict(zip(names, values, strict=True))
            for run, _, _ in compiled:
                run(env, 1)
            for _, out, store in compiled:
                if out:
                    for key, delta in out.items():
                        store.add(key, delta)
                    out.clear()

        return fire

    def _chain(self, body: Sequence[Factor], bound: set[str], last: Step, where: str) -> Step:
        order = plan_order(body, bound, where)
        befores, seen = [], set(bound)
        for factor in order:
            befores.append(frozenset(seen))
            seen |= produced(factor)
        step = last
        for factor, before in reversed(list(zip(order, befores, strict=True))):
            step = self._step(factor, before, step)
        return step

    def _step(self, factor: Factor, before: frozenset[str], nxt: Step) -> Step:
        if isinstance(factor, Guard):
            check = compile_guard(factor.pred)

            def guard(env: Env, acc: Any) -> None:
                if check(env):
                    nxt(env, acc)

            return guard
        if isinstance(factor, Value):
            value = compile_value(factor.expr)

            def multiply(env: Env, acc: Any) -> None:
                v = value(env)
                if v is not None and v != 0:
                    nxt(env, mul(acc, v))

            return multiply
        if isinstance(factor, Lift):
            return _lift(factor, compile_value(factor.expr), factor.var in before, nxt)
        if isinstance(factor, MapExtreme):
            return self._extreme(factor, before, nxt)
        if isinstance(factor, MapLift):
            return self._map_lift(factor, before, nxt)
        if isinstance(factor, MapRef):
            store, keys = self.maps[factor.name], factor.keys
        else:
            store, keys = self.relations[factor.relation], factor.args
        return self._lookup(store, keys, before, nxt)

    def _map_lift(self, factor: MapLift, before: frozenset[str], nxt: Step) -> Step:
        """``(v ^= M[k])``: the entry's value, 0 where there is none (an empty nested
        aggregate), bound to v (or compared with it, if bound)."""
        data, counter, getkey = self.maps[factor.name].data, self.counter, key_getter(factor.keys)

        def value(env: Env) -> Any:
            counter[0] += 1
            return data.get(getkey(env), 0)

        return _lift(factor, value, factor.var in before, nxt)

    def _extreme(self, factor: MapExtreme, before: frozenset[str], nxt: Step) -> Step:
        """``(v ^= MIN(cnt[g, *]))``: the slice's extreme value (``extreme_of``)."""
        store, counter = self.maps[factor.name], self.counter
        data, prefix = store.data, factor.keys[:-1]
        index = store.index(tuple(range(len(prefix))))
        getprefix = key_getter(prefix)
        adjust = [compile_value(e) for e in factor.adjust] if factor.adjust else None
        kind = factor.extreme

        def value(env: Env) -> Any:
            bucket = index.get(getprefix(env), {})
            counter[0] += len(bucket)
            adjusted = (adjust[0](env), adjust[1](env)) if adjust else None
            return extreme_of(((k, data[k]) for k in bucket), kind, adjusted)

        return _lift(factor, value, factor.var in before, nxt)

    def _lookup(
        self, store: Store, keys: tuple[str, ...], before: frozenset[str], nxt: Step
    ) -> Step:
        data, counter = store.data, self.counter
        bound = tuple(i for i, k in enumerate(keys) if k in before)
        if len(bound) == len(keys):
            getkey = key_getter(keys)

            def point(env: Env, acc: Any) -> None:
                v = data.get(getkey(env))
                if v is not None:
                    counter[0] += 1
                    nxt(env, mul(acc, v))

            return point
        index = store.index(bound)
        getpartial = key_getter([keys[i] for i in bound])
        first: dict[str, int] = {}
        assigns: list[tuple[int, str]] = []
        repeats: list[tuple[int, int]] = []
        for i, k in enumerate(keys):
            if k in before:
                continue
            if k in first:
                repeats.append((first[k], i))
            else:
                first[k] = i
                assigns.append((i, k))

        def scan(env: Env, acc: Any) -> None:
            bucket = index.get(getpartial(env))
            if not bucket:
                return
            for full in bucket:
                if repeats and any(full[i] != full[j] for i, j in repeats):
                    continue
                for i, k in assigns:
                    env[k] = full[i]
                counter[0] += 1
                nxt(env, mul(acc, data[full]))

        return scan

    # --- reads -------------------------------------------------------------------------------

    def evaluate(self, part: Part) -> dict[Key, Any]:
        """A map's entries (keyed in the reference's key order) or an aggregate's groups."""
        if isinstance(part, MapRef):
            return dict(self.maps[part.name].data)
        if isinstance(part, PartSum):  # a union's branches, keyed alike
            return sum_of(self.evaluate(each) for each in part.parts)
        run = self._parts.get(part)
        if run is None:
            run = self._parts[part] = self._aggregate(part)
        return run()

    def _aggregate(self, aggsum: AggSum) -> Callable[[], dict[Key, Any]]:
        out: dict[Key, Any] = {}
        getkey = key_getter(aggsum.keys)

        def emit(env: Env, acc: Any) -> None:
            key = getkey(env)
            old = out.get(key)
            out[key] = acc if old is None else add(old, acc)

        missing = {r.relation for r in part_refs(aggsum) if isinstance(r, Rel)} - set(
            self.relations
        )
        if missing:
            raise errors.FailedPrecondition(
                f"relation {sorted(missing)[0]} is not kept (use keep_relations=True)"
            )
        run = self._chain(aggsum.body, set(), emit, "an aggregate read")

        def evaluate() -> dict[Key, Any]:
            out.clear()
            run({}, 1)
            return {k: v for k, v in out.items() if v != 0}

        return evaluate

    def query(self, name: str) -> dict[Key, Any]:
        for query in self.program.queries:
            if query.name == name:
                return self.evaluate(query.part)
        raise errors.InvalidArgument(f"the program has no query {name!r}")

    def view(self, name: str) -> list[dict[str, Any]]:
        from cumulus.m3.readout import read_view

        for view in self.program.views:
            if view.name == name:
                return read_view(self, view)
        raise errors.InvalidArgument(f"the program has no view {name!r}")

    def definition(self, name: str) -> dict[Key, Any]:
        """A map's definition evaluated over the relations (``keep_relations=True``)."""
        decl = self.program.map(name)
        if decl.definition is None:
            raise errors.FailedPrecondition(f"map {name} has no definition")
        return self.evaluate(decl.definition)

    def load(
        self,
        maps: Mapping[str, Mapping[Key, Any]],
        relations: Mapping[str, Iterable[Sequence[Any]]] = {},
    ) -> None:
        """Start from given contents (bulk initialization): maps as {key: value}, relations as
        rows (kept only where the program reads them)."""
        for name, entries in maps.items():
            store = self.maps[name]
            for key, value in entries.items():
                store.add(tuple(key), value)
        for relation, rows in relations.items():
            store = self.relations.get(relation)
            if store is None:
                continue
            checker = self._checkers[relation]
            for row in rows:
                shown_by = functools.partial(_named, relation, row)
                store.add(checker(row, shown_by), 1)

    def sizes(self) -> dict[str, int]:
        return {name: len(store.data) for name, store in self.maps.items()}


def _check_target(statement: Statement, args: tuple[str, ...], where: str) -> None:
    bound = set(args) | set().union(*(produced(f) for f in statement.body))
    unbound = [k for k in statement.target.keys if k not in bound]
    if unbound:
        raise errors.InvalidArgument(
            f"{where}: key {unbound[0]} of {statement.target.name} is bound by no "
            "trigger argument or map on the right"
        )


def _lift(factor: Lift | MapLift, value: Callable[[Env], Any], bound: bool, nxt: Step) -> Step:
    name = factor.var
    if bound:

        def test(env: Env, acc: Any) -> None:
            v = value(env)
            if v == env[name]:  # NULL is a key like any other (SQL's one NULL group)
                nxt(env, acc)

        return test

    def bind(env: Env, acc: Any) -> None:
        env[name] = value(env)  # NULL too: a group key may be NULL (values are guarded)
        nxt(env, acc)

    return bind


def _named(relation: str, row: object) -> str:
    return f"row {relation}{_shown(row)}"


def _shown(row: object) -> str:
    text = repr(tuple(row) if isinstance(row, list) else row)
    return text if len(text) <= 200 else text[:197] + "..."


def _row_checker(
    source: Source,
) -> Callable[[Sequence[Any] | Mapping[str, Any], Callable[[], str]], Key]:
    """Checks and converts a row: arity, NOT NULL, types (exact DECIMAL scale, 64-bit INT)."""
    columns = source.columns
    names = source.column_names()
    known = frozenset(names)
    converters = [_converter(source.name, column) for column in columns]

    def check(row: Sequence[Any] | Mapping[str, Any], shown_by: Callable[[], str]) -> Key:
        """``shown_by()`` names the row in an error (written only when there is one)."""
        if isinstance(row, Mapping):
            unknown = [k for k in row if k not in known]
            if unknown:
                raise errors.UnknownColumn(
                    f"{shown_by()}: {source.name} has no column {unknown[0]!r}"
                )
            values = [row.get(n) for n in names]
        elif isinstance(row, list | tuple):
            if len(row) != len(columns):
                raise errors.InvalidArgument(
                    f"{shown_by()}: {source.name} has {len(columns)} columns, the row {len(row)}"
                )
            values = list(row)
        else:
            raise errors.InvalidArgument(f"{shown_by()}: a row is a tuple or a dict")
        try:
            return tuple([convert(v) for convert, v in zip(converters, values, strict=True)])
        except errors.TypeMismatch as exc:
            raise errors.TypeMismatch(f"{shown_by()}: {exc}") from None

    return check


def _as_stored(value: Decimal, precision: int | None, scale: int | None) -> bool:
    """Whether a DECIMAL value is already as a stored one reads back: finite, at the column's
    scale, within its precision, and not a negative zero (which reads back as 0)."""
    if scale is None or precision is None or not value.is_finite():
        return False
    sign, _, exponent = value.as_tuple()
    return exponent == -scale and (not sign or bool(value)) and value.adjusted() < precision - scale


def _converter(table: str, column: Column) -> Callable[[Any], Any]:
    kind, nullable = column.type.kind, column.nullable
    scale, precision = column.type.scale, column.type.precision

    def convert(value: Any) -> Any:
        if value is None:
            if not nullable:
                raise errors.TypeMismatch(f"column {table}.{column.name} is NOT NULL")
            return None
        if kind == "INT" and type(value) is int and INT_MIN <= value <= INT_MAX:
            return value
        if kind == "TEXT" and type(value) is str:
            return value
        if kind == "FLOAT" and type(value) is float and value == value:
            return value + 0.0  # -0.0 and 0.0 are one key
        if kind == "DECIMAL" and type(value) is Decimal and _as_stored(value, precision, scale):
            return value
        if kind == "DATE" and type(value) is datetime.date:
            return value
        return from_storage(column.type, to_storage(column, value, table=table))

    return convert


def sum_of(branches: Iterable[Mapping[Key, Any]]) -> dict[Key, Any]:
    """A union's branches (``PartSum``), keyed alike, added entry by entry (zeros dropped)."""
    total: dict[Key, Any] = {}
    for entries in branches:
        for key, value in entries.items():
            total[key] = add(total[key], value) if key in total else value
    return {k: v for k, v in total.items() if v != 0}
