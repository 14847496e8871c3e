"""Passes 1-2: parse a view's SELECT and refuse, naming it, every construct a view cannot
maintain, before any name is resolved (so the error names the construct, not a symptom).
"""

from __future__ import annotations

from sqlglot import exp

from aggview import errors
from cumulus.expressions import EXTRACT_UNITS
from cumulus.sqltext import parse_sql

AGGREGATES: tuple[type[exp.Expression], ...] = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)
COMPARISONS: dict[type[exp.Expression], str] = {
    exp.EQ: "=",
    exp.NEQ: "<>",
    exp.LT: "<",
    exp.LTE: "<=",
    exp.GT: ">",
    exp.GTE: ">=",
}
ARITHMETIC: dict[type[exp.Expression], str] = {
    exp.Add: "+",
    exp.Sub: "-",
    exp.Mul: "*",
    exp.Div: "/",
}
_ALLOWED = (
    exp.Select, exp.From, exp.Join, exp.Table, exp.TableAlias, exp.Identifier, exp.Column,
    exp.Alias, exp.Where, exp.Group, exp.Having, exp.Literal, exp.Boolean, exp.Neg, exp.Paren,
    exp.Not, exp.And, exp.In, exp.Between, exp.Distinct, exp.Cast, exp.DataType, exp.Null,
    exp.Or, exp.Case, exp.If, exp.Coalesce, exp.Like, exp.Is, exp.Abs, exp.Extract, exp.Year,
    exp.Month, exp.Day, exp.Substring, exp.Greatest, exp.Least,
    *COMPARISONS, *ARITHMETIC, *AGGREGATES,
)  # fmt: skip
_SELECT_CLAUSES = frozenset(
    {"expressions", "from_", "joins", "where", "group", "having", "distinct"}
)
_CLAUSE_NAMES = {
    "with_": "WITH (common table expressions)",
    "order": "ORDER BY",
    "limit": "LIMIT",
    "offset": "OFFSET",
    "qualify": "QUALIFY",
    "windows": "WINDOW",
    "laterals": "LATERAL",
}
_NAMED_NODES: dict[type[exp.Expression], str] = {
    exp.Subquery: "subquery",
    exp.Exists: "EXISTS subquery",
    exp.Window: "window function",
    exp.Star: "SELECT *",
    exp.ILike: "ILIKE (LIKE is supported)",
    exp.Escape: "LIKE ... ESCAPE",
    exp.Mod: "operator %",
    exp.DPipe: "operator ||",
    exp.Filter: "aggregate FILTER",
    exp.Lateral: "LATERAL",
    exp.Union: "UNION",
    exp.Intersect: "INTERSECT",
    exp.Except: "EXCEPT",
    exp.Xor: "XOR",
}


def refuse(construct: str, node: exp.Expression | None = None) -> errors.InvalidArgument:
    where = f": {node.sql()}" if node is not None else ""
    return errors.InvalidArgument(f"{construct} is not supported in a materialized view{where}")


def refuse_row_limits(statement: exp.Expression) -> None:
    """LIMIT, OFFSET or FETCH anywhere, a subquery's too, is refused by name: the rows they
    keep depend on an order a view does not keep (dropped, they would change the answer)."""
    for node in statement.find_all(exp.Limit, exp.Offset, exp.Fetch):
        name = {exp.Limit: "LIMIT", exp.Offset: "OFFSET"}.get(type(node), "FETCH")
        raise refuse(name, node.parent if isinstance(node.parent, exp.Query) else node)


def parse_select(select_sql: str) -> exp.Select:
    statement = parse_sql(select_sql)
    if isinstance(statement, exp.SetOperation):
        raise refuse(statement.key.upper())
    if not isinstance(statement, exp.Select):
        raise errors.InvalidArgument(f"a materialized view needs a SELECT, not {statement.key}")
    return null_safe_comparisons(dbtoaster_functions(filters_as_cases(statement)))


def null_safe_comparisons(select: exp.Select) -> exp.Select:
    """``a IS NOT DISTINCT FROM b`` is ``(a IS NULL AND b IS NULL) OR (a IS NOT NULL AND b IS
    NOT NULL AND a = b)`` and ``IS DISTINCT FROM`` its negation: conditions that are TRUE or
    FALSE, never NULL (so NOT keeps them so), made of what every back end maintains."""
    for node in list(select.find_all(exp.NullSafeEQ, exp.NullSafeNEQ)):
        a, b = node.this, node.expression
        null_a, null_b = (exp.Is(this=x.copy(), expression=exp.Null()) for x in (a, b))
        same = exp.paren(
            exp.or_(
                exp.and_(null_a, null_b),
                exp.and_(
                    exp.not_(null_a.copy()),
                    exp.not_(null_b.copy()),
                    exp.EQ(this=a.copy(), expression=b.copy()),
                ),
            )
        )
        node.replace(same if isinstance(node, exp.NullSafeEQ) else exp.not_(same))
    return select


# DBToaster's names for GREATEST and LEAST of two values (its queries write them)
_DBTOASTER_EXTREMES = {"LISTMAX": exp.Greatest, "LISTMIN": exp.Least}


def dbtoaster_functions(select: exp.Select) -> exp.Select:
    """``LISTMAX(a, b)`` and ``LISTMIN(a, b)``, as DBToaster's queries write them, are
    ``GREATEST(a, b)`` and ``LEAST(a, b)`` (which every back end maintains); other arities
    stay refused by name."""
    for node in list(select.find_all(exp.Anonymous)):
        kind = _DBTOASTER_EXTREMES.get(node.name.upper())
        if kind is not None and len(node.expressions) == 2:
            first, second = (e.copy() for e in node.expressions)
            node.replace(kind(this=first, expressions=[second], ignore_nulls=True))
    return select


def filters_as_cases(select: exp.Select) -> exp.Select:
    """``AGG(x) FILTER (WHERE c)`` is ``AGG(CASE WHEN c THEN x END)``: the rows the condition
    does not keep give NULL, which every aggregate skips (``COUNT(*)`` counts ``CASE WHEN c THEN
    1 END``; ``COUNT(DISTINCT x)`` the distinct kept values), so every back end maintains it as
    the CASE it already takes. A FILTER on anything but an aggregate stays, refused by name."""
    for node in list(select.find_all(exp.Filter)):
        aggregate, where = node.this, node.expression
        if not isinstance(aggregate, AGGREGATES) or not isinstance(where, exp.Where):
            continue
        condition = where.this

        def kept(value: exp.Expression, condition: exp.Expression = condition) -> exp.Case:
            return exp.Case(ifs=[exp.If(this=condition.copy(), true=value)])

        argument = aggregate.this
        if isinstance(argument, exp.Star):
            aggregate.set("this", kept(exp.Literal.number(1)))
        elif isinstance(argument, exp.Distinct):
            argument.set("expressions", [kept(e.copy()) for e in argument.expressions])
        elif argument is not None:
            aggregate.set("this", kept(argument.copy()))
        node.replace(aggregate)
    return select


def unsupported_node(node: exp.Expression) -> errors.InvalidArgument:
    for kind, name in _NAMED_NODES.items():
        if isinstance(node, kind):
            if isinstance(node, exp.Star) and isinstance(node.parent, exp.Column):
                name = f"SELECT {node.parent.sql()}"
            return refuse(name, None if isinstance(node, exp.Star) else node)
    if isinstance(node, exp.Select):
        return refuse("subquery", node)
    if isinstance(node, exp.Func):
        name = node.name if isinstance(node, exp.Anonymous) else node.sql_name()
        return errors.InvalidArgument(f"unsupported function {name.upper()} in {node.sql()}")
    return refuse(node.key.upper(), node)


def _check_join(join: exp.Join) -> None:
    side, kind = join.side.upper(), join.kind.upper()
    if side in ("LEFT", "RIGHT") and kind in ("", "OUTER"):
        if join.method or join.args.get("using"):
            raise refuse(f"{side} JOIN ... USING or NATURAL {side} JOIN (write {side} JOIN ... ON)")
        if not join.args.get("on"):
            raise errors.InvalidArgument(f"a {side} JOIN needs ON: {join.sql()}")
        return
    if side:
        raise refuse(f"{side} OUTER JOIN (only inner joins, LEFT, RIGHT and FULL JOIN)")
    if kind not in ("", "INNER", "CROSS"):
        raise refuse(f"{kind} JOIN")
    if join.method and join.method.upper() != "NATURAL":
        raise refuse(f"{join.method.upper()} JOIN")
    if kind == "CROSS" and (join.method or join.args.get("using") or join.args.get("on")):
        raise errors.InvalidArgument(f"CROSS JOIN takes no ON or USING: {join.sql()}")
    if join.method and (join.args.get("using") or join.args.get("on")):
        raise errors.InvalidArgument(f"NATURAL JOIN takes no ON or USING: {join.sql()}")
    if join.args.get("using") and join.args.get("on"):
        raise errors.InvalidArgument(f"a join takes ON or USING, not both: {join.sql()}")


def check_supported(select: exp.Select) -> None:
    """Refuse, naming it, every construct outside the supported subset, before any resolution."""
    for key, value in select.args.items():
        if value and key not in _SELECT_CLAUSES:
            raise refuse(_CLAUSE_NAMES.get(key, key.upper()))
    if not select.args.get("from_"):
        raise errors.InvalidArgument("a materialized view needs a FROM clause")
    distinct = select.args.get("distinct")
    if distinct is not None and distinct.args.get("on") is not None:
        raise refuse("SELECT DISTINCT ON")
    for node in select.walk():
        if isinstance(node, exp.Join):
            _check_join(node)
        elif isinstance(node, exp.Var) and isinstance(node.parent, exp.Extract):
            continue  # EXTRACT's unit, checked with it
        elif isinstance(node, exp.Star) and (
            isinstance(node.parent, exp.Count) or _star_item(node) is not None
        ):
            continue
        elif isinstance(node, exp.Select) and node is not select:
            raise unsupported_node(node)
        elif not isinstance(node, _ALLOWED):
            raise unsupported_node(node)
        elif isinstance(node, exp.Cast) and not (
            node.to.is_type(exp.DataType.Type.DATE)
            and isinstance(node.this, exp.Literal)
            and node.this.is_string
        ):
            raise refuse("CAST (only DATE 'YYYY-MM-DD' literals)", node)
        elif isinstance(node, AGGREGATES):
            _check_aggregate(node)
        elif isinstance(node, exp.Extract) and node.this.name.upper() not in EXTRACT_UNITS:
            raise errors.InvalidArgument(
                f"unsupported function EXTRACT({node.this.name.upper()} FROM ...) in "
                f"{node.sql()} (EXTRACT takes {', '.join(EXTRACT_UNITS)})"
            )
        elif isinstance(node, exp.Between) and node.args.get("symmetric"):
            raise refuse("BETWEEN SYMMETRIC")
        elif isinstance(node, exp.In) and not node.expressions and not node.args.get("query"):
            raise refuse("IN without a list of values", node)
    group = select.args.get("group")
    if group is not None:
        extra = [k for k, v in group.args.items() if v and k != "expressions"]
        if extra:
            raise refuse(f"GROUP BY {extra[0].upper().replace('_', ' ')}")


def _star_item(node: exp.Star) -> exp.Expression | None:
    """The SELECT item a ``*`` is (``*`` or ``alias.*``), or None where it is anything else."""
    item = node.parent if isinstance(node.parent, exp.Column) else node
    return item if isinstance(item.parent, exp.Select) and item.arg_key == "expressions" else None


def _check_aggregate(node: exp.Expression) -> None:
    outer = node.find_ancestor(*AGGREGATES)
    if outer is not None:
        raise errors.InvalidArgument(f"aggregate nested in an aggregate: {outer.sql()}")
    clause = node.find_ancestor(exp.Where, exp.Join, exp.Group)
    if clause is not None:
        where = {"where": "WHERE", "join": "JOIN ... ON", "group": "GROUP BY"}[clause.key]
        raise errors.InvalidArgument(
            f"aggregate {node.sql()} in {where} is not allowed (use HAVING for conditions)"
        )
    arg = node.this
    if arg is None:
        raise errors.InvalidArgument(f"{node.sql()} needs an argument")
    if isinstance(arg, exp.Distinct):
        if len(arg.expressions) != 1:
            raise refuse(f"{node.key.upper()}(DISTINCT with several arguments)", node)
        if isinstance(node, exp.Sum | exp.Avg):
            raise refuse(f"{node.key.upper()}(DISTINCT ...)", node)
