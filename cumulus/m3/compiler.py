"""View plans -> an M3 program by recursive delta compilation (seed 003 §3.1).

1. *Translation*: a plan's join becomes one product of relation atoms, one variable per class
   of columns the join edges equate; WHERE filters become guards; every aggregate becomes the
   maps a view reads (``translate``): COUNT(*) (the rows of a group), COUNT(e), SUM(e) as one map
   per monomial of e plus COUNT(e) (SUM over nothing is NULL), AVG as the same sum and count,
   MIN/MAX/COUNT(DISTINCT e) as a per-group count map keyed by the value, ``cnt[g, v]``.
2. *Recursion*: every map's definition gets, for an insert and a delete into each relation it
   reads, the delta of ``cumulus.m3.delta``; each component of a delta is materialized as a map
   (or found among the maps already made: *map sharing* by canonical form, across all views of
   the program) and compiled in turn, until deltas have degree 0.
3. ``depth`` bounds the recursion (seed 003's work-space trade-off): 0 maintains no map (a view is
   an aggregate over the relations, evaluated when read), 1 maintains the view maps with deltas
   evaluated over the relations (first-order IVM), None materializes every level.

An UPDATE is a delete and an insert; a delete is the insert negated (a -1 in front; a self-join
term that replaces two occurrences counts +1).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from aggview import errors
from aggview.schema import ColumnType, TableSchema
from cumulus.aggregates import RULES, Kind
from cumulus.compiler import (
    CUMULUS_REFUSAL,
    CreateView,
    compile_views,
    parse_view_statement,
)
from cumulus.m3.canonical import canonical
from cumulus.m3.delta import Types, delta_terms, fresh, substitute
from cumulus.m3.exprs import (
    expr_type,
    from_plan,
    monomials,
    nullable_parts,
    product_type,
    rename,
    strict_vars,
)
from cumulus.m3.printer import statement_text
from cumulus.m3.program import (
    AggSum,
    Expr,
    Factor,
    Guard,
    Lift,
    MapDecl,
    MapRef,
    Part,
    PartSum,
    Program,
    Rel,
    Source,
    Statement,
    Trigger,
    Value,
    View,
    ViewColumn,
)
from cumulus.passes.union_plans import NOTHING
from cumulus.plan import MULTIPLICITY, OUTER_REFUSAL, Aggregate, ViewPlan

TableLookup = Callable[[str], TableSchema]
INT_TYPE = ColumnType("INT")


@dataclass
class _Query:
    """A view's join as one product, with its variables' names, types and nullability."""

    body: list[Factor]
    var_of: dict[tuple[str, str], str]
    types: Types
    nullable: dict[str, bool]


def _join(plan: ViewPlan, table: TableLookup) -> _Query:
    parent: dict[tuple[str, str], tuple[str, str]] = {}

    def find(x: tuple[str, str]) -> tuple[str, str]:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    schemas = {t.alias: table(t.table) for t in plan.tables}
    for edge in plan.edges:
        parent[find((edge.left.alias, edge.left.column))] = find(
            (edge.right.alias, edge.right.column)
        )
    var_of: dict[tuple[str, str], str] = {}
    names: dict[tuple[str, str], str] = {}
    taken: set[str] = set()
    types: Types = {}
    members: dict[str, list[bool]] = {}
    for ref in plan.tables:
        for column in schemas[ref.alias].columns:
            root = find((ref.alias, column.name))
            if root not in names:
                base = column.name if column.name not in taken else f"{column.name}_{ref.alias}"
                names[root] = fresh(base, taken)
                types[names[root]] = column.type
            var = var_of[(ref.alias, column.name)] = names[root]
            members.setdefault(var, []).append(column.nullable)
    body: list[Factor] = [
        Rel(ref.table, tuple(var_of[(ref.alias, c.name)] for c in schemas[ref.alias].columns))
        for ref in plan.tables
    ]
    nullable = {var: all(flags) for var, flags in members.items()}
    for var, flags in members.items():
        if len(flags) > 1 and all(flags):  # a joined column: SQL never matches NULL
            body.append(Guard({"notnull": {"var": var}}))
    for pred in plan.filters:
        body.append(Guard(from_plan(pred, lambda a, c: var_of[(a, c)])))
    return _Query(body, var_of, types, nullable)


def _not_null(expr: Expr, query: _Query) -> list[Factor]:
    """Guards that skip the tuples where an aggregate's argument is NULL."""
    guards: list[Factor] = [
        Guard({"notnull": {"var": v}}) for v in strict_vars(expr) if query.nullable.get(v, True)
    ]
    guards += [Guard({"notnull": part}) for part in nullable_parts(expr)]
    return guards


@dataclass
class _Compiler:
    table: TableLookup
    depth: int | None
    maps: dict[str, MapDecl] = field(default_factory=dict)
    map_types: dict[str, Types] = field(default_factory=dict)
    levels: dict[str, int] = field(default_factory=dict)
    shared: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    sources: dict[str, Source] = field(default_factory=dict)
    statements: dict[tuple[str, str], list[Statement]] = field(default_factory=dict)
    queue: list[str] = field(default_factory=list)

    # --- maps --------------------------------------------------------------------------------

    def materialize(
        self, definition: AggSum, types: Types, lookup: tuple[str, ...], hint: str, level: int
    ) -> MapRef:
        """The map for ``definition`` read at ``lookup``: an equivalent one if it exists."""
        definition, types = _pretty(definition, types)
        canon = canonical(definition)
        found = self.shared.get(canon.text)
        if found is not None:
            name, canon_keys = found
            back = {c: v for v, c in canon.names.items()}
            caller = dict(zip(definition.keys, lookup, strict=True))
            return MapRef(name, tuple(caller[back[c]] for c in canon_keys))
        name = fresh(hint, set(self.maps) | set(self.sources))
        values = [f.expr for f in definition.body if isinstance(f, Value)]
        decl = MapDecl(
            name,
            product_type(values, types),
            tuple((k, types[k]) for k in definition.keys),
            definition,
        )
        self.maps[name] = decl
        self.map_types[name] = types
        self.levels[name] = level
        self.shared[canon.text] = (name, tuple(canon.names[k] for k in definition.keys))
        self.queue.append(name)
        return MapRef(name, lookup)

    def deeper(self, level: int) -> bool:
        return self.depth is None or level <= self.depth

    # --- views ---------------------------------------------------------------------------------

    def view(self, plan: ViewPlan) -> View:
        """A view's columns over its maps; a UNION ALL's over each branch's, added up."""
        if any(b.outer for b in plan.branch_plans()):  # a NULL row is no product of maps
            raise errors.InvalidArgument(OUTER_REFUSAL)
        branches = [self.branch(b) for b in plan.branch_plans()]
        rows = _sum([b[0] for b in branches])
        columns: dict[str, ViewColumn] = {}
        for i, aggregate in enumerate(plan.aggregates):
            made = [b[1][i] for b in branches if b[1][i] is not None]
            columns[aggregate.name] = _added(made, rows)
        for derived in plan.derived:
            columns[derived.name] = ViewColumn(
                derived.name,
                type=ColumnType.parse(derived.type),
                expr=from_plan(derived.expr, lambda a, c: c),
            )
        ordered = [columns[name] if name in columns else ViewColumn(name) for name in plan.output]
        ordered += [columns[a.name] for a in plan.aggregates if a.hidden]
        if plan.shape == "bag":  # the multiplicity: a row is read as often as it counts
            ordered.append(ViewColumn(MULTIPLICITY, Kind.COUNT, (rows,), None, INT_TYPE))
        having = from_plan(plan.having, lambda a, c: c) if plan.having else None
        keys = tuple((g.name, ColumnType.parse(g.type)) for g in plan.group_by)
        return View(plan.name, keys, rows, tuple(ordered), having)

    def branch(self, plan: ViewPlan) -> tuple[Part, list[ViewColumn | None]]:
        """One SELECT's rows map and each aggregate's column over its maps (None: an argument
        that is NULL in this branch, a union's aggregate another branch feeds)."""
        for ref in plan.tables:
            if ref.table not in self.sources:
                schema = self.table(ref.table)
                self.sources[ref.table] = Source(schema.name, schema.columns)
        query = _join(plan, self.table)
        group_names = [g.name for g in plan.group_by]
        value_name = fresh("v", set(group_names))

        def part(hint: str, extra: list[Factor], value: Expr | None = None) -> Part:
            return self.part(plan, query, hint, extra, value, value_name)

        rows = part(f"{plan.name}_rows", [])
        columns = [
            None if a.arg == NOTHING else self.aggregate(plan, query, a, rows, part)
            for a in plan.aggregates
        ]
        return rows, columns

    def aggregate(
        self,
        plan: ViewPlan,
        query: _Query,
        aggregate: Aggregate,
        rows: Part,
        part: Callable[..., Part],
    ) -> ViewColumn:
        result = ColumnType.parse(aggregate.result_type)
        base = f"{plan.name}_{aggregate.name.lstrip('_')}"
        kind = aggregate.kind
        if kind is Kind.COUNT_STAR:
            return ViewColumn(aggregate.name, Kind.COUNT, (rows,), None, result, aggregate.hidden)
        assert aggregate.arg is not None
        arg = from_plan(aggregate.arg, lambda a, c: query.var_of[(a, c)])
        present = _not_null(arg, query)
        rule = RULES[kind]
        if rule.keeps_sum:
            terms = monomials(arg)
            sums = tuple(
                part(base if len(terms) == 1 else f"{base}_{i}", [*present, *(Value(f) for f in m)])
                for i, m in enumerate(terms, 1)
            )
            count = part(f"{base}_n", present)
            return ViewColumn(aggregate.name, kind, sums, count, result, aggregate.hidden)
        if rule.keeps_values:
            counts = part(f"{base}_cnt", present, arg)
            return ViewColumn(aggregate.name, kind, (counts,), None, result, aggregate.hidden)
        counted = part(base, present)  # COUNT(e)
        return ViewColumn(aggregate.name, kind, (counted,), None, result, aggregate.hidden)

    def part(
        self,
        plan: ViewPlan,
        query: _Query,
        hint: str,
        extra: list[Factor],
        value: Expr | None,
        value_name: str,
    ) -> Part:
        """A root map (or, at depth 0, an aggregate over the relations) keyed by the view's
        group names (and the value for a count map). A variable standing for two keys (two
        joined group columns, or MIN(x) grouped by x) is lifted into a second key."""
        wanted: list[tuple[str, Expr]] = [
            (g.name, from_plan(g.source(), lambda a, c: query.var_of[(a, c)]))
            for g in plan.group_by
        ]
        if value is not None:
            wanted.append((value_name, value))
        keys = [name for name, _ in wanted]
        taken = set(keys) | set(query.types)
        apart = {v: fresh(v, taken) for v in query.types if v in keys}
        current = {v: apart.get(v, v) for v in query.types}  # original -> name in the body
        types = {current[v]: t for v, t in query.types.items()}
        lifted: list[tuple[str, Expr]] = []
        for name, expr in wanted:
            source = rename(expr, current).get("var")
            if source is not None and source not in keys:
                current = {v: (name if now == source else now) for v, now in current.items()}
                types[name] = types.pop(source)
            else:
                lifted.append((name, expr))
        lifts: list[Factor] = []
        for name, expr in lifted:  # after every renaming: a lift sees each group's name
            expr = rename(expr, current)
            lifts.append(Lift(name, expr))
            types[name] = expr_type(expr, types)
        body = [substitute(f, current) for f in [*query.body, *extra]] + lifts
        definition = AggSum(tuple(keys), tuple(body))
        if not self.deeper(1):
            return definition
        return self.materialize(definition, types, definition.keys, hint, 1)

    # --- recursion -------------------------------------------------------------------------------

    def run(self) -> None:
        while self.queue:
            name = self.queue.pop(0)
            decl = self.maps[name]
            assert decl.definition is not None
            relations = dict.fromkeys(
                f.relation for f in decl.definition.body if isinstance(f, Rel)
            )
            for relation in relations:
                for sign in ("+", "-"):
                    self.deltas(decl, relation, sign)

    def deltas(self, decl: MapDecl, relation: str, sign: str) -> None:
        source = self.sources[relation]
        args = source.column_names()
        level = self.levels[decl.name] + 1
        assert decl.definition is not None
        terms = delta_terms(
            decl.definition,
            self.map_types[decl.name],
            relation,
            sign,
            args,
            tuple(c.type for c in source.columns),
        )
        out = self.statements.setdefault((sign, relation), [])
        for term in terms:
            body: list[Factor] = []
            if term.coef != 1:
                body.append(Value({"lit": term.coef, "type": "INT"}))
            body += term.head
            for n, component in enumerate(term.components, 1):
                if self.deeper(level):
                    hint = f"{decl.name}_{relation}" + (f"{n}" if len(term.components) > 1 else "")
                    body.append(
                        self.materialize(
                            component.definition,
                            component.types,
                            component.lookup,
                            hint,
                            level,
                        )
                    )
                else:
                    body += component.inline
            body += term.tail
            out.append(Statement(MapRef(decl.name, term.target), tuple(body)))

    def program(self, views: list[View]) -> Program:
        types = {m.name: m.value_type for m in self.maps.values()}
        triggers = []
        for relation, source in self.sources.items():
            for sign in ("+", "-"):
                merged = _merge(self.statements.get((sign, relation), []), types)
                triggers.append(Trigger(sign, relation, source.column_names(), tuple(merged)))
        return Program(
            tuple(self.sources.values()),
            tuple(self.maps.values()),
            (),
            tuple(views),
            tuple(triggers),
        )


def _sum(parts: list[Part]) -> Part:
    """One part, or a union's branches' parts added up."""
    flat = [q for p in parts for q in (p.parts if isinstance(p, PartSum) else (p,))]
    return flat[0] if len(flat) == 1 else PartSum(tuple(flat))  # type: ignore[arg-type]


def _added(made: list[ViewColumn], rows: Part) -> ViewColumn:
    """A union's aggregate: each branch's parts added up (a SUM's monomials side by side);
    COUNT(*) reads the union's rows."""
    first = made[0]
    if len(made) == 1:
        return first
    if RULES[first.kind].keeps_sum:  # type: ignore[index]
        parts = tuple(p for c in made for p in c.parts)
        count = _sum([c.count for c in made])  # type: ignore[misc]
        return replace(first, parts=parts, count=count)
    return replace(first, parts=(_sum([c.parts[0] for c in made]),))


def _pretty(definition: AggSum, types: Types) -> tuple[AggSum, Types]:
    """Variables renamed apart during compilation (``ordkey_2``) get their plain name back
    where no other variable of the definition has it."""
    names: dict[str, str] = {}
    taken = set(types)
    for var in list(types):
        base = re.sub(r"_[0-9]+$", "", var)
        if base != var and base not in taken:
            names[var] = base
            taken.add(base)
    if not names:
        return definition, types
    keys = tuple(names.get(k, k) for k in definition.keys)
    body = tuple(substitute(f, names) for f in definition.body)
    return AggSum(keys, body), {names.get(v, v): t for v, t in types.items()}


def _merge(statements: list[Statement], types: dict[str, ColumnType]) -> list[Statement]:
    """Statements equal but for their integer coefficient become one (or none, at 0)."""
    merged: dict[str, tuple[int, Statement]] = {}
    for statement in statements:
        body = list(statement.body)
        coef = 1
        if body and isinstance(body[0], Value) and body[0].expr.get("type") == "INT":
            if type(body[0].expr.get("lit")) is int:
                coef = body.pop(0).expr["lit"]
        plain = Statement(statement.target, tuple(body))
        text = statement_text(plain, types)
        old = merged.get(text)
        merged[text] = ((old[0] if old else 0) + coef, plain)
    out = []
    for coef, plain in merged.values():
        if coef == 0:
            continue
        if coef != 1 or not plain.body:  # a statement adds at least a constant
            plain = Statement(plain.target, (Value({"lit": coef, "type": "INT"}), *plain.body))
        out.append(plain)
    return out


def compile_program(
    plans: Sequence[ViewPlan], table: TableLookup, depth: int | None = None
) -> Program:
    """One program maintaining every view of ``plans`` (maps shared across them)."""
    if depth is not None and depth < 0:
        raise errors.InvalidArgument(f"--depth must be 0 or more; got {depth}")
    names = [p.name for p in plans]
    if len(set(names)) != len(names):
        raise errors.InvalidArgument("two views of one program have the same name")
    compiler = _Compiler(table, depth)
    views = [compiler.view(plan) for plan in plans]
    compiler.run()
    return compiler.program(views)


def plan_of(sql: str, name: str, table: TableLookup) -> ViewPlan:
    """A SELECT (named ``name``) or a whole CREATE MATERIALIZED VIEW, through the view compiler."""
    statement = parse_view_statement(sql)
    if statement is None:
        statement = CreateView(name, False, "sync", 0, sql.strip().rstrip(";"))
    if not isinstance(statement, CreateView):
        raise errors.InvalidArgument("expected a SELECT or CREATE MATERIALIZED VIEW ... AS SELECT")
    *hidden, plan = compile_views(statement, table)
    if hidden:
        raise errors.InvalidArgument(CUMULUS_REFUSAL)
    return plan
