"""The view compiler: a view's SELECT -> ``ViewPlan``, as a pipeline of passes (after sqlglot's
optimizer), one module each in ``cumulus.passes`` and each a function testable on its own;
the DDL around the SELECT is parsed by ``cumulus.ddl``.

``inline_from.inline_ctes`` (WITH -> subqueries) -> ``unions.split`` (a UNION ALL, a
SELECT without FROM or a FULL JOIN (``full_joins``) -> branches, each compiled as a view,
joined by ``union_plans`` into one plan, ``compile_views``) ->
``preaggregate.preaggregate_left_join`` (in cumulus: a per-row aggregate of a LEFT JOIN
first in FROM -> a LEFT JOIN with the joined table pre-aggregated) ->
``inline_from.merge_first_subquery`` (a simple subquery first in FROM merged into the view) ->
``lift_subqueries.lift_subqueries`` (subqueries -> hidden views, ``compile_views``; in
refresh = 'cumulus' their plans are the view's ``nested``, read by its M3 program) ->
``check_support.parse_select`` -> ``check_support.check_supported`` ->
``resolve_tables.resolve_tables`` -> ``expand_stars.expand_stars`` (``*`` and ``alias.*``) ->
``plan_joins.plan_where`` (resolve and type every column, split the conjunction into join edges
and filters; a filter over several tables is a theta join predicate, and tables no equality
connects are a cross product) -> ``plan_groups.view_shape`` (aggregate, bag or
distinct) -> ``plan_groups.plan_group_by`` (a bag or SELECT DISTINCT:
``plan_groups.projected_groups``, every item) -> ``plan_select.plan_select`` (aggregates and
output names) -> ``plan_having.plan_derived`` and ``plan_having.plan_having`` (hidden
aggregates); expressions are resolved and typed by ``typecheck``. Anything outside the supported
subset is refused at CREATE with an ``InvalidArgument`` that names the construct; type errors
are ``TypeMismatch``.

Type rules (view maintenance, M3 and Spark must agree with them): arithmetic, SUM and AVG in
``cumulus.typerules``, every aggregate's result type in ``cumulus.aggregates``; and

- Literals: 12 is INT (DECIMAL(38,0) past 64 bits); 1.50 is DECIMAL(38,2); 1e3 is FLOAT; 'x' is
  TEXT, or DATE when compared with a DATE and in ISO form; DATE '2024-01-01' is DATE.
- Comparisons: numbers with numbers, otherwise the same kind only. Join edges need the same kind
  (and, for DECIMAL, the same scale), because index keys are encoded per type.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

from sqlglot import exp

from aggview import errors
from aggview.schema import TableSchema
from cumulus.ddl import CreateView, parse_view_statement
from cumulus.passes import union_plans, unions
from cumulus.passes.check_support import check_supported, parse_select, refuse_row_limits
from cumulus.passes.expand_stars import expand_stars
from cumulus.passes.extreme_domains import extreme_domains
from cumulus.passes.inline_from import (
    inline_ctes,
    merge_first_subquery,
    qualify_correlations,
    refuse_skipped_levels,
)
from cumulus.passes.lift_subqueries import Lifter, lift_subqueries, scalar_column
from cumulus.passes.outer_filters import push_outer_filters
from cumulus.passes.plan_groups import plan_group_by, projected_groups, view_shape
from cumulus.passes.plan_having import plan_derived, plan_having
from cumulus.passes.plan_joins import mirror_right_join, outer_joins, plan_where
from cumulus.passes.plan_select import plan_select
from cumulus.passes.preaggregate import preaggregate_left_join
from cumulus.passes.resolve_tables import resolve_tables
from cumulus.passes.semi_joins import grouped_semi_joins
from cumulus.plan import ViewPlan
from cumulus.sqltext import parse_sql
from cumulus.view_rows import is_view_rows, row_schema, rows_id

CUMULUS_REFUSAL = "views over views are maintained in refresh = 'sync' or 'async', not 'cumulus'"
UNION_SUBQUERY_REFUSAL = (
    "a subquery in a UNION ALL's branch is maintained in refresh = 'sync' or 'async', not 'cumulus'"
)


def compile_view(
    create: CreateView, table: Callable[[str], TableSchema], nested: frozenset[str] = frozenset()
) -> ViewPlan:
    """Compile a CREATE MATERIALIZED VIEW; ``table(name)`` returns a schema or raises
    ``UnknownTable`` (a KeyError or None is taken to mean the same). ``nested``: the hidden
    views a cumulus view reads as nested aggregates (not views over views)."""
    select = parse_select(create.select_sql)
    check_supported(select)
    select = mirror_right_join(select)
    tables, scope, ons = resolve_tables(select, table)
    if create.mode == "cumulus" and any(
        is_view_rows(t) and t.name not in nested for t in scope.tables.values()
    ):
        raise errors.InvalidArgument(CUMULUS_REFUSAL)
    outer = outer_joins(select)  # before expand_stars: ``ons`` are this tree's nodes
    select = expand_stars(select, tables, scope)
    edges, filters = plan_where(select, scope, ons, outer)
    shape = view_shape(select)
    if shape == "aggregate" or select.args.get("group") is not None:
        groups = plan_group_by(select, scope)
    else:  # a bag, or SELECT DISTINCT: grouped by every item
        groups = projected_groups(select, scope)
    columns, aggregates, output, names, pending = plan_select(select, scope, groups)
    derived, aggregates = plan_derived(pending, scope, columns, aggregates, names)
    unjoined = sorted(nested - {t.name for t in scope.tables.values()})
    scalars = {  # hidden one-row views HAVING reads unjoined (``lift_subqueries.scalar_column``)
        scalar_column(name, c.name): c.type
        for name in (unjoined if select.args.get("having") is not None else [])
        for c in table(name).columns
    }
    having, aggregates = plan_having(select, scope, columns, aggregates, names, derived, scalars)
    if shape == "aggregate" and select.args.get("distinct") is not None:
        hidden = [c.name for c in columns if c.name not in output]
        if hidden or not columns:
            raise errors.InvalidArgument(
                "SELECT DISTINCT over aggregates is supported only when the SELECT shows every "
                "GROUP BY column (each row is distinct then); "
                + (f"{', '.join(hidden)} is not shown" if hidden else "there is no GROUP BY")
            )
    plan = ViewPlan(
        name=create.name,
        sql=create.select_sql,
        mode=create.mode,
        interval_ms=create.interval_ms,
        nodes=create.nodes,
        speculation=create.speculation,
        host=create.host,
        feed_ms=create.feed_ms,
        depth=create.depth,
        tables=tables,
        edges=edges,
        filters=filters,
        group_by=tuple(columns),
        aggregates=tuple(agg for agg, _ in aggregates),
        having=having,
        output=tuple(output),
        derived=tuple(derived),
        shape=shape,
        outer=tuple(outer.values()),
    )
    if create.mode == "cumulus" and plan.outer and not nested:  # (with nested: compile_views)
        _check_nested(plan, table)  # a LEFT JOIN: refused at CREATE where M3 cannot keep it
    return plan


def compile_views(
    create: CreateView,
    table: Callable[[str], TableSchema],
    numbers: Iterator[int] | None = None,
    root: str = "",
    nest: bool = False,
) -> list[ViewPlan]:
    """A view and the hidden sync views its subqueries become (``lift_subqueries``), each
        after the hidden views it reads and the view itself last; ``table(name)`` as for
        ``compile_view``. The view's plan keeps its SELECT as written and names its hidden views
        (``__sub_<root>_<n>``, n counted over the tree of them: ``numbers``). In refresh =
    'cumulus' (or ``nest``: M3 of any view) the hidden views' plans are the view's ``nested``."""
    numbers = itertools.count(1) if numbers is None else numbers
    root = root or create.name
    written = create.select_sql
    statement = parse_sql(written)
    refuse_row_limits(statement)
    if statement.args.get("with_") is not None:
        create = replace(create, select_sql=_rewritten_sql(inline_ctes(statement)))
    shape = unions.split(create.select_sql)
    if shape is not None:

        def branch(select_sql: str) -> list[ViewPlan]:
            plans = compile_views(
                replace(create, select_sql=select_sql), table, numbers, root, nest
            )
            if any(p.nested for p in plans):
                raise errors.InvalidArgument(UNION_SUBQUERY_REFUSAL)
            return plans

        if isinstance(shape, unions.Union):
            plans = union_plans.union_plan(shape.branches, shape.tagged, branch)
        else:
            plans = union_plans.scalars(shape, branch)
        return [*plans[:-1], replace(plans[-1], sql=written)]
    lifter = Lifter(root, numbers)
    in_m3 = create.mode == "cumulus" or nest  # an M3 program maintains it (and its subqueries)
    written_select = parsed = parse_select(create.select_sql)
    if in_m3:  # a per-row aggregate of a LEFT JOIN, MIN/MAX over a grouped one: one nesting
        parsed = extreme_domains(preaggregate_left_join(parsed, table), table)
    parsed = push_outer_filters(parsed, table)  # (M3: its table, filtered, ``m3.outer``)
    # IN over a subquery over a subquery: a join grouped by the view's keys (in sync and
    # async only where the inner subquery reads the view's tables, which hidden views cannot)
    qualified = grouped_semi_joins(
        qualify_correlations(parsed, table), table, only_reaching_out=not in_m3
    )
    merged = merge_first_subquery(qualified, table)
    refuse_skipped_levels(merged)
    select = lift_subqueries(merged, lifter, read_scalars=in_m3)
    if not lifter.hidden:
        if merged is not written_select:
            create = replace(create, select_sql=_rewritten_sql(merged))
        return [replace(compile_view(create, table), sql=written)]
    plans: list[ViewPlan] = []
    known: dict[str, ViewPlan] = {}

    def resolve(name: str) -> TableSchema:
        plan = known.get(name)
        return row_schema(plan, rows_id(0, name)) if plan is not None else table(name)

    for hidden in lifter.hidden:
        sub = CreateView(hidden.name, False, "sync", 0, hidden.select.sql())
        for plan in compile_views(sub, resolve, numbers, root):
            plans.append(plan)
            known[plan.name] = plan
    if in_m3:  # its M3 program maintains them: nested aggregates
        hidden = frozenset(known)
        outer = compile_view(replace(create, select_sql=select.sql()), resolve, hidden)
        _one_row_alone(outer, known)
        plan = replace(outer, sql=written, nested=tuple(plans))
        _check_nested(plan, table)
        return [plan]
    outer = compile_view(replace(create, select_sql=select.sql()), resolve)
    hidden_names = tuple(h.name for h in lifter.hidden)
    return [*plans, replace(outer, sql=written, hidden=hidden_names)]


def _one_row_alone(plan: ViewPlan, nested: Mapping[str, ViewPlan]) -> None:
    """A cumulus view whose FROM holds only subqueries of one row (an aggregate without GROUP
    BY) is refused: SQL gives it its row even over no rows, which an M3 program, whose maps
    start empty and change only by its triggers, never counts (found 2026-12-03). Sync and
    async take it: a view is initialized from the hidden view's rows, which have that row.
    Beside a table, the row is read by a lookup that has it always."""
    one_row = [t.table in nested and not nested[t.table].group_by for t in plan.tables]
    if all(one_row) and not plan.branches:
        raise errors.InvalidArgument(
            "a view over subqueries of one row alone (an aggregate without GROUP BY in FROM, "
            "with no table beside it) is maintained in refresh = 'sync' or 'async', not "
            "'cumulus' (its row is there over no rows, where M3's maps start empty)"
        )


def _check_nested(plan: ViewPlan, table: Callable[[str], TableSchema]) -> None:
    """A view with nested aggregates is refused at CREATE, naming the construct, where its
    M3 program cannot maintain them (``cumulus.m3.compiler.nested_refusal``)."""
    from cumulus.m3.compiler import compile_program  # (that module compiles plans with this)

    compile_program([plan], table, plan.program_depth)


def _rewritten_sql(rewritten: exp.Expression) -> str:
    """A rewritten SELECT as the text the passes parse again; refused if that text would mean
    something else (a construct sqlglot cannot write back, such as BETWEEN SYMMETRIC)."""
    sql = rewritten.sql()
    if parse_sql(sql) != rewritten:
        raise errors.InvalidArgument(
            f"this view cannot be rewritten without its CTEs or subqueries: {rewritten.sql()}"
        )
    return sql


def compile_sql(sql: str, table: Callable[[str], TableSchema]) -> ViewPlan:
    """``CREATE MATERIALIZED VIEW ...`` text straight to a plan (tests, tools); its hidden
    views' plans are ``compile_sql_views``'s."""
    return compile_sql_views(sql, table)[-1]


def compile_sql_views(sql: str, table: Callable[[str], TableSchema]) -> list[ViewPlan]:
    """A view's plan and its hidden views' (``compile_views``) from its DDL text."""
    statement = parse_view_statement(sql)
    if not isinstance(statement, CreateView):
        raise errors.InvalidArgument("expected CREATE MATERIALIZED VIEW ... AS SELECT ...")
    return compile_views(statement, table)
