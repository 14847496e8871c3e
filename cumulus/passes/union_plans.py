"""A union's branch plans -> one view plan (``ViewPlan.branches``): the first branch's columns,
every branch's tables, edges, filters, group sources and aggregate arguments. The view's state
is the sum of the branches' contributions, so sync and async maintenance (``cumulus.delta``)
and M3 (``cumulus.m3.compiler``) add the branches' deltas and nothing else changes.

``scalars``: a SELECT without FROM whose items are uncorrelated scalar subqueries (aggregates
without GROUP BY) and constants is one row: each subquery a branch, its aggregates the view's
hidden aggregates, NULL (no contribution) in the other branches; each item a derived column.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from sqlglot import exp

from aggview import errors
from aggview.schema import ColumnType
from cumulus.aggregates import Kind
from cumulus.passes.check_support import AGGREGATES, refuse
from cumulus.passes.plan_select import OutputNames
from cumulus.passes.typecheck import no_aggregates, typed
from cumulus.plan import Aggregate, Derived, Expr, GroupColumn, ViewPlan
from cumulus.sqltext import identifier
from cumulus.typerules import decimal_type

BRANCH = "__branch"  # the hidden group column that keeps a top-level union's branches apart
NOTHING: Expr = {"null": True}  # an aggregate's argument in a branch it takes nothing from
# compiles one branch SELECT (text) into its hidden views' plans and its own, last
CompileBranch = Callable[[str], list[ViewPlan]]


def _neutral(branch: ViewPlan, first: ViewPlan) -> ViewPlan:
    """A branch as stored in its view: the view's columns, no mode of its own."""
    return replace(
        branch,
        name=first.name,
        mode="sync",
        interval_ms=0,
        nodes=0,
        speculation="",
        host="",
        feed_ms=0,
        depth=0,
        output=first.output,
        derived=first.derived,
        having=first.having,
        hidden=(),
        branches=(),
    )


def _aligned(first: ViewPlan, other: ViewPlan, number: int) -> ViewPlan:
    """``other``'s columns renamed and ordered as ``first``'s (SQL names a union's columns
    after its first branch), refused naming the column where they are not the same."""
    if len(other.output) != len(first.output):
        raise errors.InvalidArgument(
            f"UNION ALL branches have {len(first.output)} and {len(other.output)} columns "
            f"(branch {number})"
        )
    names = dict(zip(other.output, first.output, strict=True))
    own = [g.name for g in other.group_by if g.name not in names]
    names.update(
        zip(own, [g.name for g in first.group_by if g.name not in first.output], strict=False)
    )
    own = [a.name for a in other.aggregates if a.name not in names]
    names.update(
        zip(own, [a.name for a in first.aggregates if a.name not in first.output], strict=False)
    )
    groups = {
        names.get(g.name, g.name): replace(g, name=names.get(g.name, g.name))
        for g in other.group_by
    }
    aggs = {
        names.get(a.name, a.name): replace(a, name=names.get(a.name, a.name))
        for a in other.aggregates
    }
    for group in first.group_by:
        mine = groups.get(group.name)
        if mine is None or not _alike(mine.type, group.type):
            raise _differs(group.name, group.type, mine.type if mine else "not grouped", number)
    for agg in first.aggregates:
        mine_agg = aggs.get(agg.name)
        if (
            mine_agg is None
            or mine_agg.kind != agg.kind
            or not _alike(mine_agg.arg_type, agg.arg_type)
        ):
            theirs = f"{mine_agg.kind.name}({mine_agg.arg_type})" if mine_agg else "missing"
            raise _differs(agg.name, f"{agg.kind.name}({agg.arg_type})", theirs, number)
    if len(groups) != len(first.group_by) or len(aggs) != len(first.aggregates):
        raise errors.InvalidArgument(f"UNION ALL branch {number} has other columns than the first")
    return replace(
        other,
        group_by=tuple(groups[g.name] for g in first.group_by),
        aggregates=tuple(aggs[a.name] for a in first.aggregates),
        output=first.output,
        derived=first.derived,
        having=first.having,
    )


def _alike(mine: str | None, first: str | None) -> bool:
    """The same type, or DECIMALs of one scale (stored alike: the scaled integer)."""
    if mine is None or first is None or mine == first:
        return mine == first
    a, b = ColumnType.parse(mine), ColumnType.parse(first)
    return a.kind == b.kind == "DECIMAL" and a.scale == b.scale


def _widened(plans: list[ViewPlan]) -> list[ViewPlan]:
    """Columns whose DECIMAL types differ in precision only become DECIMAL(38, s) in every
    branch, SQL's common type (their values are stored alike either way)."""

    def wide(types: list[str | None]) -> str | None:
        if len(set(types)) == 1 or types[0] is None:
            return types[0]
        return str(decimal_type(ColumnType.parse(types[0]).scale or 0))

    width = range(len(plans[0].aggregates))
    groups = [wide([p.group_by[i].type for p in plans]) for i in range(len(plans[0].group_by))]
    args = [wide([p.aggregates[i].arg_type for p in plans]) for i in width]
    results = [wide([p.aggregates[i].result_type for p in plans]) for i in width]
    return [
        replace(
            plan,
            group_by=tuple(replace(g, type=t) for g, t in zip(plan.group_by, groups, strict=True)),
            aggregates=tuple(
                replace(a, arg_type=t, result_type=r)
                for a, t, r in zip(plan.aggregates, args, results, strict=True)
            ),
        )
        for plan in plans
    ]


def _differs(column: str, first: str, theirs: str, number: int) -> errors.InvalidArgument:
    return errors.InvalidArgument(
        f"UNION ALL branches differ in column {column}: {first} in the first, {theirs} in "
        f"branch {number} (a union's columns need the same aggregate of the same type)"
    )


def _tag(plan: ViewPlan, number: int) -> ViewPlan:
    tag = GroupColumn(BRANCH, None, "INT", {"lit": number, "type": "INT"})
    return replace(plan, group_by=(*plan.group_by, tag))


def union_plan(
    branches: list[exp.Select], tagged: bool, compile_branch: CompileBranch
) -> list[ViewPlan]:
    """The hidden views' plans of every branch, then the union's plan."""
    hidden: list[ViewPlan] = []
    plans: list[ViewPlan] = []
    names: list[str] = []
    for number, branch in enumerate(branches, 1):
        *inner, plan = compile_branch(branch.sql())
        hidden += inner
        names += plan.hidden
        for part in plan.branch_plans():  # a branch that is a union: its branches, flattened
            plans.append(_tag(part, number) if tagged else part)
    aligned = [_aligned(plans[0], p, n) for n, p in enumerate(plans[1:], 2)]
    first, *others = _widened([plans[0], *aligned])
    union = replace(first, hidden=tuple(names), branches=tuple(_neutral(o, first) for o in others))
    return [*hidden, union]


def _scalar_select(node: exp.Subquery) -> exp.Select:
    sub = node.this
    if not isinstance(sub, exp.Select):
        raise refuse(f"{sub.key.upper()} as a scalar subquery", node)
    if sub.args.get("group") or sub.args.get("having"):
        raise refuse(
            "a scalar subquery with GROUP BY or HAVING (it may give more than one row)", node
        )
    if len(sub.expressions) != 1 or not sub.expressions[0].find(*AGGREGATES):
        raise refuse(
            "a scalar subquery without one aggregate item (it may give several rows)", node
        )
    sub = sub.copy()
    item = sub.expressions[0]
    sub.set("expressions", [exp.alias_(item.unalias(), "v0", quoted=True)])
    return sub


def _hidden_aggregates(plan: ViewPlan, number: int, counted: bool) -> tuple[Aggregate, ...]:
    """A subquery's aggregates as the view's hidden ones; COUNT(*) as COUNT(1) where other
    branches add rows to the view (their rows are not this subquery's)."""
    out = []
    for agg in plan.aggregates:
        agg = replace(agg, name=f"_q{number}_{agg.name}", hidden=True)
        if counted and agg.kind is Kind.COUNT_STAR:
            agg = replace(agg, kind=Kind.COUNT, arg={"lit": 1, "type": "INT"}, arg_type="INT")
        out.append(agg)
    return tuple(out)


def _value(plan: ViewPlan, number: int) -> tuple[Expr, ColumnType]:
    """A subquery's value (its one column, ``v0``) over the view's hidden aggregates."""
    renamed = {a.name: f"_q{number}_{a.name}" for a in plan.aggregates}
    if "v0" in renamed:
        return {"out": renamed["v0"]}, ColumnType.parse(plan.column_type("v0"))
    derived = next(d for d in plan.derived if d.name == "v0")

    def rename(node: object) -> object:
        if isinstance(node, dict):
            if "out" in node:
                return {"out": renamed[node["out"]]}
            return {k: rename(v) for k, v in node.items()}
        if isinstance(node, list):
            return [rename(v) for v in node]
        return node

    return rename(derived.expr), ColumnType.parse(derived.type)  # type: ignore[return-value]


def scalars(select: exp.Select, compile_branch: CompileBranch) -> list[ViewPlan]:
    """A SELECT without FROM -> its subqueries' hidden views' plans, then its one-row plan."""
    for clause in ("where", "group", "having", "distinct"):
        if select.args.get(clause):
            raise refuse(f"{clause.upper()} in a SELECT without FROM")
    select = select.copy()
    nodes = [n for n in select.find_all(exp.Subquery) if n.find_ancestor(exp.Select) is select]
    if not nodes:
        raise refuse(
            "a SELECT without FROM and without a subquery (its constants never change: "
            "select them where the view is read)"
        )
    hidden: list[ViewPlan] = []
    plans: list[ViewPlan] = []
    values: dict[str, tuple[Expr, ColumnType]] = {}
    for number, node in enumerate(nodes, 1):
        *inner, plan = compile_branch(_scalar_select(node).sql())
        hidden += inner
        plans.append(plan)
        values[f"__q{number}"] = _value(plan, number)
        node.replace(exp.column(f"__q{number}", quoted=True))
    derived = _items(select, values)
    counted = len(plans) > 1
    own = [_hidden_aggregates(p, n, counted) for n, p in enumerate(plans, 1)]
    branches = []
    for number, plan in enumerate(plans, 1):
        aggregates = tuple(
            a if n == number else replace(a, arg=NOTHING)
            for n, aggs in enumerate(own, 1)
            for a in aggs
        )
        branches.append(
            replace(
                plan,
                aggregates=aggregates,
                derived=tuple(derived),
                output=tuple(d.name for d in derived),
                having=None,
                hidden=(),
            )
        )
    first = branches[0]
    names = tuple(h for p in plans for h in p.hidden)
    rest = tuple(_neutral(b, first) for b in branches[1:])
    return [*hidden, replace(first, hidden=names, branches=rest)]


def _items(select: exp.Select, values: dict[str, tuple[Expr, ColumnType]]) -> list[Derived]:
    """The SELECT items (constants and expressions over the subqueries' values), named."""
    aliases = [
        identifier(i.args["alias"], "alias") for i in select.expressions if isinstance(i, exp.Alias)
    ]
    names = OutputNames(aliases)

    def column(node: exp.Column) -> tuple[Expr, ColumnType]:
        found = values.get(node.name) if not node.table else None
        if found is None:
            raise errors.UnknownColumn(f"unknown column {node.sql()} (a SELECT without FROM)")
        return found

    out = []
    for item in select.expressions:
        alias = identifier(item.args["alias"], "alias") if isinstance(item, exp.Alias) else None
        expr, type_ = typed(item.unalias(), column, no_aggregates)
        out.append(Derived(alias or names.derive("expr"), expr, str(type_)))
    return out
