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
from collections.abc import Callable, Collection, Sequence
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
from cumulus.m3.delta import (
    Component,
    DeltaTerm,
    Types,
    delta_terms,
    factor_vars,
    fresh,
    nested_vars,
    substitute,
)
from cumulus.m3.exprs import (
    expr_type,
    from_plan,
    monomials,
    nullable_parts,
    product_type,
    rename,
    strict_vars,
    substitute_vars,
    vars_of,
)
from cumulus.m3.outer import split_outer
from cumulus.m3.printer import statement_text
from cumulus.m3.program import (
    AggSum,
    Expr,
    Factor,
    Guard,
    Lift,
    MapDecl,
    MapExtreme,
    MapLift,
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
    lift_keys,
)
from cumulus.passes.lift_subqueries import scalar_column
from cumulus.passes.union_plans import NOTHING
from cumulus.plan import MULTIPLICITY, OUTER_REFUSAL, Aggregate, TableRef, ViewPlan, expr_columns
from cumulus.view_rows import row_schema, rows_id

TableLookup = Callable[[str], TableSchema]
INT_TYPE = ColumnType("INT")


@dataclass
class _Query:
    """A view's join as one product, with its variables' names, types and nullability."""

    body: list[Factor]
    var_of: dict[tuple[str, str], str]
    types: Types
    nullable: dict[str, bool]
    # a looked-up alias's (``_join``) columns in WHERE: (alias, column) -> a variable that is
    # NULL where none of its rows matched
    optional: dict[tuple[str, str], str] = field(default_factory=dict)

    def column(self, alias: str, column: str) -> str:
        """The variable a column is read as: a looked-up alias's own, else the join's."""
        return self.optional.get((alias, column)) or self.var_of[(alias, column)]


def _join(
    plan: ViewPlan,
    table: TableLookup,
    anti: dict[str, Expr] | None = None,
    looked_up: Collection[str] = (),
) -> _Query:
    """The join as one product; ``anti``: the aliases of NOT EXISTS's hidden views and their
    IS NULL filters (left out: the nested factors say it, NULLs included); ``looked_up``: other
    LEFT JOINed hidden views (NOT IN's, ``<>`` correlations'), whose columns WHERE reads as
    variables of their own (``_Query.optional``), NULL where no row of theirs matched."""
    anti = anti or {}
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
            if ref.alias not in anti and ref.alias not in looked_up:  # an outer row whose key
                members.setdefault(var, []).append(column.nullable)  # is NULL is kept
    body: list[Factor] = [
        Rel(ref.table, tuple(var_of[(ref.alias, c.name)] for c in schemas[ref.alias].columns))
        for ref in plan.tables
    ]
    nullable = {var: all(flags) for var, flags in members.items()}
    for var, flags in members.items():
        if len(flags) > 1 and all(flags):  # a joined column: SQL never matches NULL
            body.append(Guard({"notnull": {"var": var}}))
    optional: dict[tuple[str, str], str] = {}

    def column_var(alias: str, column: str) -> str:
        if alias not in looked_up:
            return var_of[(alias, column)]
        if (alias, column) not in optional:
            name = optional[(alias, column)] = fresh(f"{column}_or_null", taken)
            types[name] = schemas[alias].column(column).type
        return optional[(alias, column)]

    for pred in plan.filters:
        if any(pred is p for p in anti.values()):
            continue
        body.append(Guard(from_plan(pred, column_var)))
    for expr in [g.source() for g in plan.group_by] + [a.arg for a in plan.aggregates if a.arg]:
        from_plan(expr, column_var)  # a looked-up column read as a group key or summed
    return _Query(body, var_of, types, nullable, optional)


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
    nested: dict[str, ViewPlan] = field(default_factory=dict)  # hidden views, by name
    extremes: set[str] = field(default_factory=set)  # count maps a nested MIN or MAX reads
    taken: set[str] = field(default_factory=set)  # the variables of the statement being made
    # relations some FROM joins on their whole primary key, and those some FROM does not
    looked_up_by_key: set[str] = field(default_factory=set)
    not_by_key: set[str] = field(default_factory=set)

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
        plan = split_outer(plan, self.table, self.nested, self.depth)  # LEFT JOIN: 2 branches
        for branch in plan.branch_plans():  # a NULL row is no product of maps
            self.looked_up(branch)
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
        having = from_plan(plan.having, lambda a, c: c) if plan.having else None
        ordered += self.scalars(plan, set(vars_of(having)) if having is not None else set())
        if plan.shape == "bag":  # the multiplicity: a row is read as often as it counts
            ordered.append(ViewColumn(MULTIPLICITY, Kind.COUNT, (rows,), None, INT_TYPE))
        keys = tuple((g.name, ColumnType.parse(g.type)) for g in plan.group_by)
        return View(plan.name, keys, rows, tuple(ordered), having)

    def scalars(self, plan: ViewPlan, wanted: set[str]) -> list[ViewColumn]:
        """The columns of the hidden one-row views HAVING reads unjoined (uncorrelated scalar
        subqueries, ``lift_subqueries.scalar_column``; ``wanted``: the names HAVING reads),
        hidden, named as HAVING reads them: keyless maps, read once and the same for every
        group (``readout``)."""
        out: list[ViewColumn] = []
        for hidden in plan.nested:
            if scalar_column(hidden.name, "v0") not in wanted:
                continue
            shape = self.view(hidden)
            names = {c.name: scalar_column(hidden.name, c.name) for c in shape.columns}
            for column in shape.columns:
                expr = rename(column.expr, names) if column.expr is not None else None
                out.append(replace(column, name=names[column.name], hidden=True, expr=expr))
        return out

    def branch(self, plan: ViewPlan) -> tuple[Part, list[ViewColumn | None]]:
        """One SELECT's rows map and each aggregate's column over its maps (None: an argument
        that is NULL in this branch, a union's aggregate another branch feeds)."""
        for ref in plan.tables:
            if ref.table in self.nested:
                continue
            schema = self.table(ref.table)
            if ref.table not in self.sources:
                self.sources[ref.table] = Source(schema.name, schema.columns)
            by_key = _joined_on_key(plan, ref, schema.primary_key)
            (self.looked_up_by_key if by_key else self.not_by_key).add(ref.table)
        looked_up = self.looked_up(plan)
        anti = {a: f for a in plan.outer if (f := self.anti_join(plan, a)) is not None}
        query = _join(plan, self.schema, anti, looked_up)
        if any(isinstance(f, Rel) and f.relation in self.nested for f in query.body):
            by_table = {plan.table_of(a): a for a in looked_up}
            self.read_nested(query, {plan.table_of(a) for a in anti}, by_table)
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
        arg = from_plan(aggregate.arg, query.column)
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
            (g.name, from_plan(g.source(), query.column)) for g in plan.group_by
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

    # --- nested aggregates (subqueries' hidden views) -----------------------------------------

    def schema(self, name: str) -> TableSchema:
        """A table's schema; a hidden view's rows as a table (``__count``, its columns)."""
        plan = self.nested.get(name)
        return row_schema(plan, rows_id(0, name)) if plan is not None else self.table(name)

    def anti_join(self, plan: ViewPlan, alias: str) -> Expr | None:
        """A LEFT JOIN that is a correlated NOT EXISTS (``lift_subqueries``: a hidden DISTINCT
        view kept where none matched, ``c0 IS NULL``): its filter, else None."""
        hidden = self.nested.get(plan.table_of(alias))
        if hidden is None or hidden.shape != "distinct" or self.distinct_groups(hidden):
            return None
        empty = {"not": {"notnull": {"col": [alias, "c0"]}}}
        found = [f for f in plan.filters if f == empty]
        others = [
            f for f in plan.filters if f != empty and any(a == alias for a, _ in expr_columns(f))
        ]
        return found[0] if found and not others else None

    def looked_up(self, plan: ViewPlan) -> list[str]:
        """The outer aliases that are no anti-join: LEFT JOINs with a hidden view (NOT IN's,
        a ``<>`` correlation's, a user's grouped subquery) read at the outer query's values,
        one row or none, whose columns are lifted values, NULL where none matched: read by
        WHERE, as group keys (the view grouped by a nested value) or in aggregates."""
        found = [a for a in plan.outer if self.anti_join(plan, a) is None]
        if any(plan.table_of(alias) not in self.nested for alias in found):
            raise errors.InvalidArgument(OUTER_REFUSAL)
        return found

    def read_nested(
        self,
        query: _Query,
        anti: Collection[str] = (),
        looked_up: dict[str, str] | None = None,
    ) -> None:
        """Each hidden view's atom -> lifts of its maps at the outer query's variables
        (DBToaster's ``(n ^= N[k])``): a grouped or DISTINCT view's group is there while its
        COUNT(*) is positive (a semi-join, or an inner join with the groups); a view without
        GROUP BY has its one row always."""
        if self.depth is not None:
            raise errors.InvalidArgument(
                nested_refusal("a subquery at a bounded --depth", "its maps are every level")
            )
        outer_vars = {
            v
            for f in query.body
            if isinstance(f, Rel) and f.relation not in self.nested
            for v in f.args
        }
        body: list[Factor] = []
        for factor in query.body:
            if not isinstance(factor, Rel) or factor.relation not in self.nested:
                body.append(factor)
                continue
            hidden = self.nested[factor.relation]
            names = [c.name for c in self.schema(hidden.name).columns]
            var_of = dict(zip(names, factor.args, strict=True))
            alias = (looked_up or {}).get(factor.relation)
            optional = None
            if alias is not None:  # its columns WHERE reads, NULL where no row matched
                optional = {c: v for (a, c), v in query.optional.items() if a == alias}
            made = self.nested_factors(hidden, var_of, outer_vars, query.types, optional)
            if factor.relation in anti:  # NOT EXISTS: no match, or a NULL key (matches none)
                found, _ = made
                assert isinstance(found, MapLift)
                none = {"cmp": "=", "args": [{"var": found.var}, {"lit": 0, "type": "INT"}]}
                nulls = [{"not": {"notnull": {"var": k}}} for k in found.keys]
                made = [found, Guard({"or": [none, *nulls]})]
            body += made
        query.body[:] = body

    def nested_factors(
        self,
        hidden: ViewPlan,
        var_of: dict[str, str],
        outer_vars: set[str],
        types: Types,
        optional: dict[str, str] | None = None,
    ) -> list[Factor]:
        """The hidden view's row at the outer variables ``var_of`` (its columns') as lifts of
        its maps: its group's count (> 0), each column read the way a view reads it (SUM and
        AVG finished from sum and count, COUNT its map, derived columns over them), HAVING.
        Its group keys must be outer variables: a point read, never a loop. ``optional``
        (a LEFT JOIN with it): no guard, but its columns' variables (column -> variable) lifted
        as the column where its row matched (the count positive, no key NULL, HAVING TRUE),
        else NULL."""
        if optional is not None and (self.distinct_groups(hidden) or hidden.shape == "bag"):
            raise errors.InvalidArgument(OUTER_REFUSAL)
        inner = self.distinct_groups(hidden)
        if inner is not None:  # IN over a grouped subquery (Q18): its groups are distinct
            names = {g.name: g.source()["col"][1] for g in hidden.group_by}
            inner_var = {names[k]: v for k, v in var_of.items() if k in names}
            return self.nested_factors(inner, inner_var, outer_vars, types)
        if any(t.table in self.nested for t in hidden.tables) or hidden.branches:
            raise errors.InvalidArgument(nested_refusal("a subquery over a subquery or a union"))
        if hidden.shape == "bag":  # its rows count: a join with a view, not a nested value
            raise errors.InvalidArgument(nested_refusal("a subquery in FROM without aggregates"))
        shape = self.view(hidden)
        keys = [k for k, _ in shape.keys]
        if any(var_of[k] not in outer_vars for k in keys):
            raise errors.InvalidArgument(
                nested_refusal("a subquery whose columns the outer query does not equate")
            )
        if optional is not None and (
            not keys or any(var_of[c] in outer_vars for c in var_of if c not in keys)
        ):  # matched by its values, or by nothing: more than a lookup's row
            raise errors.InvalidArgument(OUTER_REFUSAL)
        taken = set(types) | set(var_of.values())

        def lift(part: Part, var: str | None = None) -> tuple[MapLift, str]:
            if not isinstance(part, MapRef):
                raise errors.InvalidArgument(nested_refusal("a subquery over a union"))
            var = var or fresh(f"{part.name}_v", taken)
            types[var] = self.maps[part.name].value_type
            lookup = tuple(var_of[k] for k in part.keys)
            return MapLift(part.name, lookup, var), var

        out: list[Factor] = []
        matched: list[Expr] = []
        if keys:  # a group (a DISTINCT value) is there while it counts rows
            found, count = lift(shape.rows)
            out.append(found)
            matched.append({"cmp": ">", "args": [{"var": count}, {"lit": 0, "type": "INT"}]})
            if optional is None:
                out.append(Guard(matched[0]))
            else:  # a NULL key matches nothing
                matched += [{"notnull": {"var": var_of[k]}} for k in keys]
        column_var = dict(var_of)
        for column in shape.columns:
            wanted = column.name in var_of or column.hidden or hidden.having is not None
            if column.name in keys or not wanted:
                continue
            if column.name not in column_var:
                column_var[column.name] = fresh(column.name, taken)
            var = column_var[column.name]
            if column.expr is not None:
                continue
            assert column.kind is not None and column.type is not None
            if column.kind in (Kind.MIN, Kind.MAX):  # the extreme of its count map's slice
                part = column.parts[0]
                assert isinstance(part, MapRef)
                prefix = tuple(var_of[k] for k in part.keys[:-1])
                placeholder = fresh(f"{part.name}_any", taken)
                extreme = "min" if column.kind is Kind.MIN else "max"
                out.append(MapExtreme(part.name, (*prefix, placeholder), var, extreme))
                self.extremes.add(part.name)
                types[var] = column.type
                continue
            if RULES[column.kind].keeps_values:
                raise errors.InvalidArgument(
                    nested_refusal(f"a {_SHOWN[column.kind]} subquery", "its value is a multiset's")
                )
            if not RULES[column.kind].keeps_sum:  # COUNT: its map's value
                if keys and column.parts[0] == shape.rows:  # COUNT(*): the count read above
                    out.append(Lift(var, {"var": count}))
                    types[var] = column.type
                else:
                    out.append(lift(column.parts[0], var)[0])
                continue
            sums = [lift(p) for p in column.parts]
            assert column.count is not None
            counted = lift(column.count)
            out += [f for f, _ in sums] + [counted[0]]
            total: Expr = {"var": sums[0][1]}
            for _, each in sums[1:]:
                total = {"op": "+", "args": [total, {"var": each}]}
            finish = {"finish": column.kind.value, "type": str(column.type)}
            out.append(Lift(var, {**finish, "args": [total, {"var": counted[1]}]}))
            types[var] = column.type
        for column in shape.columns:  # derived columns, over the others
            if column.expr is not None and column.name in column_var:
                expr = rename(column.expr, column_var)
                out.append(Lift(column_var[column.name], expr))
                types[column_var[column.name]] = expr_type(expr, types)
        if hidden.having is not None:  # a group is there while HAVING holds
            having = rename(from_plan(hidden.having, lambda a, c: c), column_var)
            if optional is None:
                out.append(Guard(having))
            else:
                matched.append(having)
        for column_name, var in (optional or {}).items():
            kind = str(self.schema(hidden.name).column(column_name).type)
            when = {"and": matched} if len(matched) > 1 else matched[0]
            value = {"var": column_var[column_name]}  # (no ELSE: NULL)
            out.append(Lift(var, {"case": [[when, value]], "type": kind}))
        return out

    def distinct_groups(self, hidden: ViewPlan) -> ViewPlan | None:
        """The grouped hidden view a DISTINCT hidden view only reads every group column of
        (``x IN (SELECT c FROM ... GROUP BY c HAVING ...)``), else None."""
        if hidden.shape != "distinct" or len(hidden.tables) != 1 or hidden.filters:
            return None
        inner = self.nested.get(hidden.tables[0].table)
        if inner is None or hidden.edges or hidden.having is not None:
            return None
        sources = [g.source() for g in hidden.group_by]
        if not all(set(s) == {"col"} for s in sources):
            return None
        read = sorted(s["col"][1] for s in sources)
        keys = sorted(g.name for g in inner.group_by)
        return inner if read == keys and inner.group_by else None

    def point_delta(
        self, name: str, relation: str, sign: str, args: tuple[str, ...], taken: set[str]
    ) -> tuple[Expr, list[Factor]]:
        """A nested map's change at its lookup keys for one tuple, as an expression over the
        trigger's arguments (``CASE WHEN keys = target AND ... THEN value ELSE 0 END``): its
        new value is the old plus this (a statement reads maps as they were before). Over a
        join the change is the delta's components read at the lookup keys (returned, lifts to
        place before it): a key a component exports is that component's, one the update fixes
        a condition, so the change at any key is point reads (none where a component would
        loop: a condition mixing the update with the other tables)."""
        decl = self.maps[name]
        terms = self.inner_delta(name, relation, sign, args)
        zero: Expr = {"lit": 0, "type": "INT"}
        total: Expr | None = None
        reads: list[Factor] = []
        for term in terms:
            if term.tail:
                raise errors.InvalidArgument(
                    nested_refusal(
                        "a subquery over a join with a condition across its tables",
                        "its change at a key is no product of lookups",
                    )
                )
            inline, conds, value, exported = _term_head(term, args, term.target)
            for component in term.components:
                if any(k not in args and k not in exported for k in component.lookup):
                    raise errors.InvalidArgument(
                        nested_refusal("a subquery over a join", "its change is not one entry")
                    )
                ref = self.materialize(
                    component.definition,
                    component.types,
                    component.lookup,
                    f"{name}_{relation}",
                    self.levels[name] + 1,
                )
                var = fresh(f"{ref.name}_d", taken)
                reads.append(MapLift(ref.name, tuple(exported.get(k, k) for k in ref.keys), var))
                value = {"op": "*", "args": [value, {"var": var}]}
            case = _when(conds, value, str(decl.value_type))
            total = case if total is None else {"op": "+", "args": [total, case]}
        return (total if total is not None else zero), reads

    def inner_delta(
        self, name: str, relation: str, sign: str, args: tuple[str, ...]
    ) -> list[DeltaTerm]:
        """The delta terms of a nested map for one tuple of ``relation``."""
        decl = self.maps[name]
        assert decl.definition is not None
        return delta_terms(
            decl.definition,
            self.map_types[name],
            relation,
            sign,
            args,
            tuple(c.type for c in self.sources[relation].columns),
        )

    def renewed(
        self,
        factors: list[Factor],
        relation: str,
        sign: str,
        args: tuple[str, ...],
        taken: set[str],
    ) -> list[Factor]:
        """``factors`` with each nested map the update changes read as old + its change."""
        out: list[Factor] = []
        for factor in factors:
            if not isinstance(factor, MapLift) or not self.changes(factor.name, relation):
                out.append(factor)
                continue
            if isinstance(factor, MapExtreme):  # the slice with the updated entry's change
                value, delta, reads = self.entry_change(factor, relation, sign, args, taken)
                out += reads
                out.append(replace(factor, adjust=(value, delta)))
                continue
            old = fresh(f"{factor.var}_old", taken)
            delta, reads = self.point_delta(factor.name, relation, sign, args, taken)
            at = {f"#key{i}": k for i, k in enumerate(factor.keys)}
            out += [substitute(f, at) for f in reads]
            out.append(MapLift(factor.name, factor.keys, old))
            out.append(Lift(factor.var, {"op": "+", "args": [{"var": old}, rename(delta, at)]}))
        return out

    def entry_change(
        self,
        factor: MapExtreme,
        relation: str,
        sign: str,
        args: tuple[str, ...],
        taken: set[str],
    ) -> tuple[Expr, Expr, list[Factor]]:
        """A count map's change for one tuple as (its value key, its count change at the
        lookup's slice): both over the trigger's arguments, and the lifts they read (over a
        join, the delta's components at the updated entry). Where the update fixes no value
        (a write of a joined table without the aggregated column: many entries of a slice),
        the value is the changed entries, ``SLICE`` of the one component that exports the
        value, and the change the rest of the delta's product (``slice_change``)."""
        target = self.point_target(factor.name, relation, sign, args)
        if target is None or set(vars_of(target[-1])) - set(args):
            terms = self.inner_delta(factor.name, relation, sign, args)
            self.taken = taken
            return self.slice_change(factor, terms, args, f"{factor.name}_{relation}")
        at = {f"#key{i}": k for i, k in enumerate(factor.keys[:-1])}
        delta, reads = self.point_delta(factor.name, relation, sign, args, taken)
        last = f"#key{len(factor.keys) - 1}"
        delta = substitute_vars(rename(delta, at), {last: target[-1]})
        return target[-1], delta, [substitute(f, at) for f in reads]

    def slice_change(
        self, factor: MapExtreme, terms: list[DeltaTerm], args: tuple[str, ...], hint: str
    ) -> tuple[Expr, Expr, list[Factor]]:
        """A count map's change at the lookup's slice for a write that changes many of its
        entries (its delta ``terms``): one term whose value key only one component exports
        (its slice at the lookup, read by ``SLICE``), times the other components' point
        reads (``hint``: their maps' names). Its variables: ``self.taken``'s."""
        taken = self.taken
        refusal = nested_refusal(
            f"a {factor.extreme.upper()} subquery over a join", "its change is not one slice's"
        )
        if len(terms) != 1 or terms[0].tail:
            raise errors.InvalidArgument(refusal)
        term = terms[0]
        value_key = term.target[-1]
        inline, conds, scale, exported = _term_head(term, args, term.target[:-1])
        if value_key in args or value_key in inline or value_key in exported:
            raise errors.InvalidArgument(refusal)
        sliced = [c for c in term.components if value_key in c.lookup]
        if len(sliced) != 1:
            raise errors.InvalidArgument(refusal)
        reads: list[Factor] = []
        entries = fresh(f"{factor.var}_changed", taken)
        for component in term.components:
            known = set(args) | set(exported) | ({value_key} if component is sliced[0] else set())
            if any(k not in known for k in component.lookup):
                raise errors.InvalidArgument(refusal)
            component = _value_last(component, value_key)
            ref = self.materialize(
                component.definition,
                component.types,
                component.lookup,
                hint,
                self.levels[factor.name] + 1,
            )
            keys = tuple(exported.get(k, k) for k in ref.keys)
            if value_key in component.lookup:
                if ref.keys[-1] != value_key or value_key in ref.keys[:-1]:
                    raise errors.InvalidArgument(refusal)  # (its slice is by its last key)
                reads.append(MapExtreme(ref.name, keys, entries, "slice"))
                continue
            var = fresh(f"{ref.name}_d", taken)
            reads.append(MapLift(ref.name, keys, var))
            scale = {"op": "*", "args": [scale, {"var": var}]}
        at = {f"#key{i}": k for i, k in enumerate(factor.keys[:-1])}
        delta = rename(_when(conds, scale, str(self.maps[factor.name].value_type)), at)
        return {"var": entries}, delta, [substitute(f, at) for f in reads]

    def changes(self, name: str, relation: str) -> bool:
        decl = self.maps[name]
        assert decl.definition is not None
        return any(isinstance(f, Rel) and f.relation == relation for f in decl.definition.body)

    def domain_terms(self, decl: MapDecl, relation: str, sign: str) -> list[Statement]:
        """rest_old * (g(E_new) - g(E_old)): the outer relations' part (the *domain*) as a map
        keyed by what the nested part g reads, re-derived where the nested maps change (only
        the updated tuple's group where the lookups' keys are its columns; every entry for an
        uncorrelated one)."""
        assert decl.definition is not None
        args = self.sources[relation].column_names()
        taken = set(args)
        apart = {v: fresh(v, taken) for v in self.map_types[decl.name]}
        body = [substitute(f, apart) for f in decl.definition.body]
        keys = tuple(apart[k] for k in decl.definition.keys)
        types = {apart[v]: t for v, t in self.map_types[decl.name].items()}
        nested = nested_vars(body)
        g = [
            f
            for f in body
            if isinstance(f, MapLift) or not isinstance(f, Rel) and set(factor_vars(f)) & nested
        ]
        rest = [f for f in body if not any(f is h for h in g)]
        # a key that is a nested value (a view grouped by a subquery's value) is no key of the
        # domain: the lifts bind it, old and new, so a changed value moves the group's entry
        reads = dict.fromkeys(k for k in keys if k not in nested)
        for factor in g:
            reads.update(dict.fromkeys(v for v in factor_vars(factor) if v not in nested))
        domain = AggSum(tuple(reads), tuple(rest))
        level = self.levels[decl.name] + 1
        hint = f"{decl.name}_dom"
        ref = self.materialize(domain, {v: types[v] for v in types}, domain.keys, hint, level)
        # the keys every changed lookup reads where the update fixes them, the same for all,
        # are bound (elsewhere no lookup changes); a lookup it changes at every key, or
        # elsewhere, binds none: the whole domain
        each: list[dict[str, Expr]] = []
        for factor in g:
            if not isinstance(factor, MapLift) or not self.changes(factor.name, relation):
                continue
            target = self.point_target(factor.name, relation, sign, args)
            if target is None or len(target) != len(factor.keys):
                target = ()  # pins nothing: the whole domain
            mapping = dict(zip(lift_keys(factor), target, strict=False))
            # (a key a join's component exports changes at many values: not pinned)
            each.append({k: e for k, e in mapping.items() if set(vars_of(e)) <= set(args)})
        pins = {
            k: e
            for k, e in (each[0] if each else {}).items()
            if all(k in m and repr(m[k]) == repr(e) for m in each)
        }
        # a key pinned to an argument is that argument (its reads are slices of one key);
        # to an expression of them, a lift
        same = {k: e["var"] for k, e in pins.items() if set(e) == {"var"} and e["var"] in args}
        pinned = [Lift(k, e) for k, e in pins.items() if k not in same]
        new = self.renewed(g, relation, sign, args, taken)
        minus: Value = Value({"lit": -1, "type": "INT"})
        target = MapRef(decl.name, tuple(same.get(k, k) for k in keys))
        return [
            Statement(target, tuple(substitute(f, same) for f in (*pinned, ref, *new))),
            Statement(target, tuple(substitute(f, same) for f in (minus, *pinned, ref, *g))),
        ]

    def point_target(
        self, name: str, relation: str, sign: str, args: tuple[str, ...]
    ) -> tuple[Expr, ...] | None:
        """The one key a nested map's change for an update is at (as expressions over the
        trigger's arguments), None where its terms differ."""
        terms = self.inner_delta(name, relation, sign, args)
        found: set[str] = set()
        target: tuple[Expr, ...] | None = None
        for term in terms:
            inline: dict[str, Expr] = {}
            for factor in term.head:
                if isinstance(factor, Lift) and factor.var not in args:
                    inline.setdefault(factor.var, substitute_vars(factor.expr, inline))
            target = tuple(substitute_vars({"var": k}, inline) for k in term.target)
            found.add(repr(target))
        return target if len(found) == 1 else None

    # --- recursion -------------------------------------------------------------------------------

    def run(self) -> None:
        while self.queue:
            name = self.queue.pop(0)
            decl = self.maps[name]
            assert decl.definition is not None
            relations = dict.fromkeys(
                f.relation for f in decl.definition.body if isinstance(f, Rel)
            )
            for factor in decl.definition.body:  # a nested aggregate's relations change it too
                if isinstance(factor, MapLift):
                    inner = self.maps[factor.name].definition
                    assert inner is not None
                    relations.update(
                        dict.fromkeys(f.relation for f in inner.body if isinstance(f, Rel))
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
                if decl.name in self.extremes:  # its slice read by value: ``slice_change``
                    component = _value_last(component, term.target[-1])
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
            if any(isinstance(f, MapLift) for f in body):  # Δrest * g(E_new)
                taken = set(args) | {v for f in body for v in factor_vars(f)}
                body = self.renewed(body, relation, sign, args, taken)
            out.append(Statement(MapRef(decl.name, term.target), tuple(body)))
        if any(
            isinstance(f, MapLift) and self.changes(f.name, relation) for f in decl.definition.body
        ):
            out += self.domain_terms(decl, relation, sign)

    def program(self, views: list[View]) -> Program:
        types = {m.name: m.value_type for m in self.maps.values()}
        triggers = []
        for relation, source in self.sources.items():
            for sign in ("+", "-"):
                merged = _merge(self.statements.get((sign, relation), []), types)
                triggers.append(Trigger(sign, relation, source.column_names(), tuple(merged)))
        dimensions = self.looked_up_by_key - self.not_by_key
        sources = [replace(s, replicated=s.name in dimensions) for s in self.sources.values()]
        return Program(
            tuple(sources),
            tuple(self.maps.values()),
            (),
            tuple(views),
            tuple(triggers),
        )


def _joined_on_key(plan: ViewPlan, ref: TableRef, key: tuple[str, ...]) -> bool:
    """Whether ``plan`` equates every primary key column of ``ref`` with another alias's column:
    a lookup, each of its rows meeting the rows that carry its key (a dimension)."""
    joined = set()
    for edge in plan.edges:
        for mine, other in ((edge.left, edge.right), (edge.right, edge.left)):
            if mine.alias == ref.alias and other.alias != ref.alias:
                joined.add(mine.column)
    return bool(key) and set(key) <= joined


_SHOWN = {Kind.MIN: "MIN", Kind.MAX: "MAX", Kind.COUNT_DISTINCT: "COUNT(DISTINCT ...)"}


def nested_refusal(construct: str, why: str = "") -> str:
    """One line naming a subquery construct cumulus does not take and the modes that do."""
    because = f" ({why})" if why else ""
    return (
        f"{construct} is maintained in refresh = 'sync' or 'async', not 'cumulus'{because}; "
        "cumulus takes SUM, AVG, COUNT, MIN and MAX scalars, IN (also over GROUP BY ... "
        "HAVING), NOT IN, EXISTS and NOT EXISTS (also correlated by one <>), over a table or a "
        "join (MIN and MAX: not over a self-join)"
    )


def _term_head(
    term: DeltaTerm, args: tuple[str, ...], target: tuple[str, ...]
) -> tuple[dict[str, Expr], list[Expr], Expr, dict[str, str]]:
    """A nested map's delta term at the lookup keys ``#key0, ...`` (``target``, its keys):
    the head's lifts of non-arguments (inlined), its conditions (guards, equalities, the keys
    the update fixes equal to the lookup's), its coefficient times its values, and the keys a
    component exports (key -> the lookup key it is read at)."""
    inline: dict[str, Expr] = {}
    conds: list[Expr] = []
    value: Expr = {"lit": term.coef, "type": "INT"}
    for factor in term.head:
        if isinstance(factor, Lift) and factor.var not in args and factor.var not in inline:
            inline[factor.var] = substitute_vars(factor.expr, inline)
        elif isinstance(factor, Lift):
            expr = substitute_vars(factor.expr, inline)
            conds.append({"cmp": "=", "args": [substitute_vars({"var": factor.var}, inline), expr]})
        elif isinstance(factor, Guard):
            conds.append(substitute_vars(factor.pred, inline))
        elif isinstance(factor, Value):
            value = {"op": "*", "args": [value, substitute_vars(factor.expr, inline)]}
        else:
            raise errors.InvalidArgument(nested_refusal("a subquery over a join"))
    exported: dict[str, str] = {}
    for i, key in enumerate(target):
        if key in args or key in inline or key in exported:
            known = exported.get(key)
            at = {"var": known} if known else substitute_vars({"var": key}, inline)
            conds.append({"cmp": "=", "args": [{"var": f"#key{i}"}, at]})
        else:
            exported[key] = f"#key{i}"
    return inline, conds, value, exported


def _value_last(component: Component, value_key: str) -> Component:
    """The component keyed with ``value_key`` (a count map's value) last where it has it: a
    ``SLICE`` reads a slice by its last key, and a map made first keeps its key order."""
    if value_key not in component.lookup or component.lookup[-1] == value_key:
        return component
    order = [i for i, k in enumerate(component.lookup) if k != value_key]
    order.append(component.lookup.index(value_key))
    keys = tuple(component.definition.keys[i] for i in order)
    return replace(
        component,
        definition=AggSum(keys, component.definition.body),
        lookup=tuple(component.lookup[i] for i in order),
    )


def _when(conds: list[Expr], value: Expr, kind: str) -> Expr:
    """``CASE WHEN conds THEN value ELSE 0 END`` (of type ``kind``)."""
    true: Expr = {"lit": True, "type": "BOOL"}
    when = {"and": conds} if len(conds) > 1 else conds[0] if conds else true
    return {"case": [[when, value]], "else": {"lit": 0, "type": "INT"}, "type": kind}


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
    compiler.nested = {n.name: n for plan in plans for n in plan.nested}
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
    *hidden, plan = compile_views(statement, table, nest=True)
    if hidden:
        raise errors.InvalidArgument(CUMULUS_REFUSAL)
    return plan
