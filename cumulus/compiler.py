"""The view compiler: a view's SELECT -> ``ViewPlan``, as a pipeline of passes (after sqlglot's
optimizer), one module each in ``cumulus.passes`` and each a function testable on its own;
the DDL around the SELECT is parsed by ``cumulus.ddl``.

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

from collections.abc import Callable

from aggview import errors
from aggview.schema import TableSchema
from cumulus.ddl import CreateView, parse_view_statement
from cumulus.passes.check_support import check_supported, parse_select
from cumulus.passes.expand_stars import expand_stars
from cumulus.passes.plan_groups import plan_group_by, projected_groups, view_shape
from cumulus.passes.plan_having import plan_derived, plan_having
from cumulus.passes.plan_joins import plan_where
from cumulus.passes.plan_select import plan_select
from cumulus.passes.resolve_tables import resolve_tables
from cumulus.plan import ViewPlan
from cumulus.view_rows import is_view_rows

CUMULUS_REFUSAL = (
    "subqueries and views over views are maintained in refresh = 'sync' or 'async', not 'cumulus'"
)


def compile_view(create: CreateView, table: Callable[[str], TableSchema]) -> ViewPlan:
    """Compile a CREATE MATERIALIZED VIEW; ``table(name)`` returns a schema or raises
    ``UnknownTable`` (a KeyError or None is taken to mean the same)."""
    select = parse_select(create.select_sql)
    check_supported(select)
    tables, scope, ons = resolve_tables(select, table)
    if create.mode == "cumulus" and any(map(is_view_rows, scope.tables.values())):
        raise errors.InvalidArgument(CUMULUS_REFUSAL)
    select = expand_stars(select, tables, scope)
    edges, filters = plan_where(select, scope, ons)
    shape = view_shape(select)
    if shape == "aggregate" or select.args.get("group") is not None:
        groups = plan_group_by(select, scope)
    else:  # a bag, or SELECT DISTINCT: grouped by every item
        groups = projected_groups(select, scope)
    columns, aggregates, output, names, pending = plan_select(select, scope, groups)
    derived, aggregates = plan_derived(pending, scope, columns, aggregates, names)
    having, aggregates = plan_having(select, scope, columns, aggregates, names, derived)
    if shape == "aggregate" and select.args.get("distinct") is not None:
        hidden = [c.name for c in columns if c.name not in output]
        if hidden or not columns:
            raise errors.InvalidArgument(
                "SELECT DISTINCT over aggregates is supported only when the SELECT shows every "
                "GROUP BY column (each row is distinct then); "
                + (f"{', '.join(hidden)} is not shown" if hidden else "there is no GROUP BY")
            )
    return ViewPlan(
        name=create.name,
        sql=create.select_sql,
        mode=create.mode,
        interval_ms=create.interval_ms,
        nodes=create.nodes,
        speculation=create.speculation,
        host=create.host,
        feed_ms=create.feed_ms,
        tables=tables,
        edges=edges,
        filters=filters,
        group_by=tuple(columns),
        aggregates=tuple(agg for agg, _ in aggregates),
        having=having,
        output=tuple(output),
        derived=tuple(derived),
        shape=shape,
    )


def compile_sql(sql: str, table: Callable[[str], TableSchema]) -> ViewPlan:
    """``CREATE MATERIALIZED VIEW ...`` text straight to a plan (tests, tools)."""
    statement = parse_view_statement(sql)
    if not isinstance(statement, CreateView):
        raise errors.InvalidArgument("expected CREATE MATERIALIZED VIEW ... AS SELECT ...")
    return compile_view(statement, table)
