"""Pass 4: resolve and type expressions and conditions into plan expression trees. Columns and
aggregates go through hooks, so WHERE, GROUP BY, SELECT and HAVING share one set of type rules
while each decides what a column or an aggregate means in it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from sqlglot import exp

from aggview import errors
from aggview.schema import ColumnType
from cumulus.passes.check_support import (
    AGGREGATES,
    ARITHMETIC,
    COMPARISONS,
    refuse,
    unsupported_node,
)
from cumulus.plan import Expr
from cumulus.sqltext import Typed, date_literal, literal, negated_literal
from cumulus.typerules import BOOL, DATE, INT, NUMERIC, TEXT, arithmetic_type, common_type

ColumnHook = Callable[[exp.Column], Typed]
AggregateHook = Callable[[exp.Expression], Typed]


def no_aggregates(node: exp.Expression) -> Typed:
    raise errors.InvalidArgument(f"aggregate {node.sql()} is not allowed here")


def typed(node: exp.Expression, column: ColumnHook, aggregate: AggregateHook) -> Typed:
    """Resolve and type a value expression; columns and aggregates go through the hooks."""
    if isinstance(node, exp.Paren):
        return typed(node.this, column, aggregate)
    if isinstance(node, exp.Column):
        return column(node)
    if isinstance(node, exp.Literal | exp.Boolean | exp.Cast | exp.Null):
        return literal(node)
    if isinstance(node, AGGREGATES):
        return aggregate(node)
    if isinstance(node, exp.Case | exp.If):
        return _case(node, column, aggregate)
    if isinstance(node, exp.Coalesce):
        args = [_or_null(a, column, aggregate) for a in [node.this, *node.expressions]]
        type_ = _result_type("COALESCE", [t for _, t in args], node)
        return {"coalesce": [e for e, _ in args], "type": str(type_)}, type_
    if isinstance(node, _FUNCTIONS):
        return _function(node, column, aggregate)
    if isinstance(node, exp.Neg):
        inner, type_ = typed(node.this, column, aggregate)
        if type_.kind not in NUMERIC:
            raise errors.TypeMismatch(f"unary minus on {type_}: {node.sql()}")
        if "lit" in inner:
            return negated_literal(inner, type_), type_
        return {"neg": inner}, type_
    op = ARITHMETIC.get(type(node))
    if op is not None:
        left, lt = typed(node.this, column, aggregate)
        right, rt = typed(node.expression, column, aggregate)
        return {"op": op, "args": [left, right]}, arithmetic_type(op, lt, rt, node)
    if isinstance(node, _CONDITIONS):
        raise errors.InvalidArgument(f"a condition cannot be used as a value: {node.sql()}")
    raise unsupported_node(node)


_CONDITIONS = (*COMPARISONS, exp.In, exp.Between, exp.Not, exp.And, exp.Or, exp.Like, exp.Is)


def _or_null(
    node: exp.Expression, column: ColumnHook, aggregate: AggregateHook
) -> tuple[Expr, ColumnType | None]:
    """A CASE result or COALESCE argument: a value, or NULL (no type of its own)."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Null):
        return {"null": True}, None
    return typed(node, column, aggregate)


def _result_type(what: str, types: list[ColumnType | None], node: exp.Expression) -> ColumnType:
    known = [t for t in types if t is not None]
    if not known:
        raise errors.InvalidArgument(f"{what} whose every result is NULL: {node.sql()}")
    return common_type(known, node)


def _case(node: exp.Case | exp.If, column: ColumnHook, aggregate: AggregateHook) -> Typed:
    """CASE [x] WHEN ... THEN ... [ELSE ...] END, or IF(c, a, b): branches in order."""
    if isinstance(node, exp.If):
        ifs, default, operand = [node], node.args.get("false"), None
    else:
        ifs, default, operand = node.args.get("ifs") or [], node.args.get("default"), node.this
    whens: list[Expr] = []
    results: list[tuple[Expr, ColumnType | None]] = []
    for branch in ifs:
        condition = branch.this
        if operand is not None:  # CASE x WHEN v: x = v
            condition = exp.EQ(this=operand.copy(), expression=condition.copy())
        whens.append(predicate(condition, column, aggregate))
        results.append(_or_null(branch.args["true"], column, aggregate))
    otherwise = _or_null(default, column, aggregate) if default is not None else None
    types = [t for _, t in results] + ([otherwise[1]] if otherwise is not None else [])
    type_ = _result_type("CASE", types, node)
    case: Expr = {"case": [[w, r] for w, (r, _) in zip(whens, results, strict=True)]}
    if otherwise is not None and "null" not in otherwise[0]:
        case["else"] = otherwise[0]
    case["type"] = str(type_)
    return case, type_


_DATE_PARTS: dict[type[exp.Expression], str] = {
    exp.Year: "year",
    exp.Month: "month",
    exp.Day: "day",
}
_FUNCTIONS = (exp.Abs, exp.Extract, exp.Substring, exp.Greatest, exp.Least, *_DATE_PARTS)


def _function(node: exp.Func, column: ColumnHook, aggregate: AggregateHook) -> Typed:
    """ABS, EXTRACT(YEAR|MONTH|DAY FROM d) (or YEAR(d) ...), SUBSTRING and GREATEST/LEAST as
    ``{"fn": name, "args": [...]}``; GREATEST and LEAST carry their arguments' common type."""
    if isinstance(node, exp.Greatest | exp.Least):
        args = [_or_null(a, column, aggregate) for a in [node.this, *node.expressions]]
        if len(args) < 2:
            raise errors.InvalidArgument(
                f"{node.key.upper()} needs two arguments or more: {node.sql()}"
            )
        type_ = _result_type(node.key.upper(), [t for _, t in args], node)
        return {"fn": node.key, "args": [e for e, _ in args], "type": str(type_)}, type_
    if isinstance(node, exp.Substring):
        return _substring(node, column, aggregate)
    if isinstance(node, exp.Abs):
        value, type_ = typed(node.this, column, aggregate)
        if type_.kind not in NUMERIC:
            raise errors.TypeMismatch(f"ABS of {type_}, not a number: {node.sql()}")
        return {"fn": "abs", "args": [value]}, type_
    if isinstance(node, exp.Extract):  # check_support let through YEAR, MONTH and DAY only
        part, subject = node.this.name.lower(), node.expression
    else:
        part, subject = _DATE_PARTS[type(node)], node.this
    value, type_ = typed(subject, column, aggregate)
    if type_ != DATE:
        raise errors.TypeMismatch(
            f"EXTRACT({part.upper()} FROM ...) of {type_}, not DATE: {node.sql()}"
        )
    return {"fn": part, "args": [value]}, INT


def _substring(node: exp.Substring, column: ColumnHook, aggregate: AggregateHook) -> Typed:
    """SUBSTRING(t FROM a [FOR b]) with constants a >= 1 and b >= 0: where PostgreSQL, duckdb
    and Spark agree (a start below 1 counts positions before the string in PostgreSQL, from its
    end in duckdb and Spark; a negative length is an error in PostgreSQL only)."""
    value, type_ = typed(node.this, column, aggregate)
    if type_ != TEXT:
        raise errors.TypeMismatch(f"SUBSTRING of {type_}, not TEXT: {node.sql()}")
    bounds: list[Expr] = []
    for key in ("start", "length"):
        bound = node.args.get(key)
        if bound is None:
            continue
        lit, bound_type = typed(bound, column, aggregate)
        if "lit" not in lit or bound_type != INT:
            raise refuse("SUBSTRING with a start or length that is not an integer constant", node)
        bounds.append(lit)
    if bounds[0]["lit"] < 1:
        raise refuse(
            "SUBSTRING with a start below 1 (PostgreSQL counts it before the string, "
            "duckdb and Spark from its end)",
            node,
        )
    if len(bounds) == 2 and bounds[1]["lit"] < 0:
        raise refuse(
            "SUBSTRING with a negative length (an error in PostgreSQL, not in duckdb)", node
        )
    return {"fn": "substring", "args": [value, *bounds]}, TEXT


def comparable(left: Typed, right: Typed, node: exp.Expression) -> tuple[Expr, Expr]:
    """Check two sides can be compared, reading a TEXT literal as a DATE opposite a DATE."""
    (lj, lt), (rj, rt) = left, right
    if lt == DATE and rt == TEXT and "lit" in rj:
        rj, rt = date_literal(rj["lit"], node), DATE
    elif rt == DATE and lt == TEXT and "lit" in lj:
        lj, lt = date_literal(lj["lit"], node), DATE
    if lt.kind != rt.kind and not (lt.kind in NUMERIC and rt.kind in NUMERIC):
        raise errors.TypeMismatch(f"cannot compare {lt} with {rt}: {node.sql()}")
    return lj, rj


def predicate(node: exp.Expression, column: ColumnHook, aggregate: AggregateHook) -> Expr:
    """Resolve and type one condition (no AND/OR: conjunctions are split before)."""
    if isinstance(node, exp.Paren):
        return predicate(node.this, column, aggregate)
    op = COMPARISONS.get(type(node))
    if op is not None:
        left = typed(node.this, column, aggregate)
        right = typed(node.expression, column, aggregate)
        return {"cmp": op, "args": list(comparable(left, right, node))}
    if isinstance(node, exp.In):
        subject = typed(node.this, column, aggregate)
        values: list[Expr] = []
        for item in node.expressions:
            while isinstance(item, exp.Paren):
                item = item.this
            if isinstance(item, exp.Null):  # x IN (1, NULL): TRUE or NULL, never FALSE
                values.append({"null": True})
            else:
                subject_expr, value = comparable(subject, typed(item, column, aggregate), node)
                subject = subject_expr, subject[1]
                values.append(value)
        return {"in": subject[0], "values": values}
    if isinstance(node, exp.Between):
        subject = typed(node.this, column, aggregate)
        low = comparable(subject, typed(node.args["low"], column, aggregate), node)
        high = comparable(subject, typed(node.args["high"], column, aggregate), node)
        return {"between": low[0], "low": low[1], "high": high[1]}
    if isinstance(node, exp.Not):
        inner = predicate(node.this, column, aggregate)
        return inner["not"] if "not" in inner else {"not": inner}  # NOT NOT p is p, NULL too
    if isinstance(node, exp.And):
        return {"and": [predicate(t, column, aggregate) for t in conjuncts(node)]}
    if isinstance(node, exp.Or):
        return {"or": [predicate(t, column, aggregate) for t in disjuncts(node)]}
    if isinstance(node, exp.Like):
        return _like(node, column, aggregate)
    if isinstance(node, exp.Is):
        if not isinstance(node.expression, exp.Null):
            raise refuse("IS other than IS [NOT] NULL", node)
        value, _ = typed(node.this, column, aggregate)
        return {"not": {"notnull": value}}
    value, type_ = typed(node, column, aggregate)
    if type_ != BOOL:
        raise errors.TypeMismatch(f"condition {node.sql()} is {type_}, not BOOL")
    return {"cmp": "=", "args": [value, {"lit": True, "type": "BOOL"}]}


def _like(node: exp.Like, column: ColumnHook, aggregate: AggregateHook) -> Expr:
    value, type_ = typed(node.this, column, aggregate)
    if type_ != TEXT:
        raise errors.TypeMismatch(f"LIKE on {type_}, not TEXT: {node.sql()}")
    pattern = node.expression
    while isinstance(pattern, exp.Paren):
        pattern = pattern.this
    if not (isinstance(pattern, exp.Literal) and pattern.is_string):
        raise refuse("LIKE with a pattern that is not a constant string", node)
    if "\\" in pattern.this:
        raise refuse(
            "a backslash in a LIKE pattern (an escape in PostgreSQL, a plain character in duckdb)",
            node,
        )
    like = {"like": value, "pattern": pattern.this}
    return {"not": like} if node.args.get("negate") else like  # sqlglot's NOT LIKE


def disjuncts(node: exp.Expression) -> Iterator[exp.Expression]:
    """The terms of an OR chain, through parentheses."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Or):
        yield from disjuncts(node.this)
        yield from disjuncts(node.expression)
    else:
        yield node


def conjuncts(node: exp.Expression | None) -> Iterator[exp.Expression]:
    """The terms of an AND chain, through parentheses."""
    while isinstance(node, exp.Paren):
        node = node.this
    if node is None:
        return
    if isinstance(node, exp.And):
        yield from conjuncts(node.this)
        yield from conjuncts(node.expression)
    else:
        yield node
