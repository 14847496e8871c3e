"""Expressions of M3 programs: plan trees (``cumulus.plan``) over variables.

Evaluation goes through ``cumulus.expressions`` (the one evaluator, exact for INT and DECIMAL),
with variables read from the statement's environment; types follow the view compiler's rules
(``cumulus.typerules``). Also: turning a SUM's argument into a polynomial, so
each monomial's variables can go to the map of their own relation (seed 003's constants
"pulled out" and factorization need products, not sums).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Mapping
from decimal import Decimal
from typing import Any

from sqlglot import exp

from aggview.errors import InvalidArgument
from aggview.schema import ColumnType
from cumulus.aggregates import Kind, finish_sum
from cumulus.expressions import STRICT, compile_expr, compile_predicate, literal_value
from cumulus.m3.program import Expr
from cumulus.typerules import FLOAT, INT, TEXT, arithmetic_type

Env = dict[str, Any]
PREDICATE_KEYS = ("cmp", "in", "between", "not", "and", "or", "like", "notnull")
ONE: Expr = {"lit": 1, "type": "INT"}
MINUS_ONE: Expr = {"lit": -1, "type": "INT"}


def var(name: str) -> Expr:
    return {"var": name}


def is_predicate(expr: Expr) -> bool:
    return any(key in expr for key in PREDICATE_KEYS)


def vars_of(expr: object) -> list[str]:
    """Variables an expression reads, in order of first appearance."""
    found: dict[str, None] = {}

    def walk(node: object) -> None:
        if isinstance(node, Mapping):
            if "var" in node:
                found[node["var"]] = None
                return
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(expr)
    return list(found)


def rename(expr: Expr, mapping: Mapping[str, str]) -> Expr:
    """A copy with variables renamed (those not in ``mapping`` kept)."""
    return substitute_vars(expr, {old: var(new) for old, new in mapping.items()})


def substitute_vars(expr: Expr, values: Mapping[str, Expr]) -> Expr:
    """A copy with the variables in ``values`` replaced by their expressions (others kept)."""

    def walk(node: Any) -> Any:
        if isinstance(node, Mapping):
            if "var" in node:
                return values.get(node["var"], {"var": node["var"]})
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(item) for item in node]
        return node

    return walk(expr)


def from_plan(expr: Expr, column_var: Callable[[str, str], str]) -> Expr:
    """A plan tree with its columns (and HAVING's view columns) as variables."""

    def walk(node: Any) -> Any:
        if isinstance(node, Mapping):
            if "col" in node:
                return {"var": column_var(node["col"][0], node["col"][1])}
            if "out" in node:
                return {"var": node["out"]}
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(item) for item in node]
        return copy.deepcopy(node)

    return walk(expr)


def to_plan(expr: Expr) -> Expr:
    """Variables as columns of the empty alias, which is how the evaluator reads them here."""

    def walk(node: Any) -> Any:
        if isinstance(node, Mapping):
            if "var" in node:
                return {"col": ["", node["var"]]}
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(item) for item in node]
        return node

    return walk(expr)


# --- evaluation ----------------------------------------------------------------------------------


def compile_value(expr: Expr) -> Callable[[Env], Any]:
    """A value term as a function of the environment (None for NULL)."""
    if "var" in expr:
        name = expr["var"]
        return lambda env: env[name]
    if "lit" in expr:
        value = literal_value(expr)
        return lambda env: value
    if is_predicate(expr):
        raise InvalidArgument(f"a value term cannot be a condition: {expr!r}")
    if "finish" in expr:
        return _finish(expr)
    evaluate = compile_expr(to_plan(expr))
    return lambda env: evaluate(lambda _alias, name: env[name])


def _finish(expr: Expr) -> Callable[[Env], Any]:
    """SUM or AVG of a nested aggregate from its sum and count, as a view's column is read
    (``cumulus.aggregates.finish_sum``: NULL over no value); only at a lift's top."""
    kind, result = Kind(expr["finish"]), ColumnType.parse(expr["type"])
    total, count = (compile_value(a) for a in expr["args"])
    return lambda env: finish_sum(kind, total(env), count(env), result)


def extreme_of(
    entries: Iterable[tuple[tuple[Any, ...], Any]], kind: str, adjusted: tuple[Any, Any] | None
) -> Any:
    """MIN or MAX of the last key over a count map's slice (entries with a positive count),
    one entry's count changed by ``adjusted`` (value, delta), or, where the value is a slice
    (``SLICE``'s ((value, count), ...): a write changing many entries of one slice, as over a
    join), each of its entries' counts times delta; NULL over none. ``kind`` "slice": the
    slice itself, as ((value, count), ...)."""
    counts = {key[-1]: count for key, count in entries}
    if kind == "slice":
        return tuple(counts.items())
    if adjusted is not None and adjusted[1]:
        value, delta = adjusted
        for each, count in value if isinstance(value, tuple) else ((value, 1),):
            counts[each] = counts.get(each, 0) + delta * count
    present = [v for v, count in counts.items() if count > 0 and v is not None]
    if not present:
        return None
    return min(present) if kind == "min" else max(present)


def compile_guard(pred: Expr) -> Callable[[Env], bool]:
    """A guard as a function of the environment: True only for TRUE (NULL is false)."""
    if "notnull" in pred:
        inner = compile_value(pred["notnull"])
        return lambda env: inner(env) is not None
    if not is_predicate(pred):
        raise InvalidArgument(f"a guard must be a condition: {pred!r}")
    check = compile_predicate(to_plan(pred))
    return lambda env: check(lambda _alias, name: env[name])


def is_zero(value: Any) -> bool:
    return value == 0


# --- types ---------------------------------------------------------------------------------------


def expr_type(expr: Expr, types: Mapping[str, ColumnType]) -> ColumnType:
    """The type of a value term under the view compiler's rules."""
    if "var" in expr:
        found = types.get(expr["var"])
        if found is None:
            raise InvalidArgument(f"variable {expr['var']} has no known type")
        return found
    if "lit" in expr:
        return ColumnType.parse(expr["type"])
    if "neg" in expr:
        return expr_type(expr["neg"], types)
    if "op" in expr:
        left, right = (expr_type(a, types) for a in expr["args"])
        return arithmetic_type(expr["op"], left, right, exp.Var(this=str(expr)))
    if "case" in expr or "coalesce" in expr or "finish" in expr:
        return ColumnType.parse(expr["type"])
    if "fn" in expr:
        return _function_type(expr, types)
    if "null" in expr and "type" in expr:  # a LEFT JOIN's unmatched column (``outer``)
        return ColumnType.parse(expr["type"])
    raise InvalidArgument(f"not a value term: {expr!r}")


def _function_type(expr: Expr, types: Mapping[str, ColumnType]) -> ColumnType:
    """ABS keeps its argument's type; EXTRACT is INT, SUBSTRING TEXT; GREATEST and LEAST
    carry theirs (their arguments' common type, which the printer shows as a CAST)."""
    name = expr["fn"]
    if "type" in expr:
        return ColumnType.parse(expr["type"])
    if name == "abs":
        return expr_type(expr["args"][0], types)
    if name in ("year", "month", "day"):
        return INT
    if name == "substring":
        return TEXT
    raise InvalidArgument(f"function {name!r} has no known type")


def product_type(exprs: list[Expr], types: Mapping[str, ColumnType]) -> ColumnType:
    result = INT
    for expr in exprs:
        result = arithmetic_type("*", result, expr_type(expr, types), exp.Var(this=str(expr)))
    return result


# --- polynomials ---------------------------------------------------------------------------------


def monomials(expr: Expr) -> list[list[Expr]]:
    """``expr`` as a sum of products: each product a list of variables, constants and opaque
    terms (a division is not a polynomial: it stays one factor). ``a - b`` is ``a + -1 * b``."""
    if "op" in expr and expr["op"] in ("+", "-"):
        left, right = (monomials(a) for a in expr["args"])
        if expr["op"] == "-":
            right = [[MINUS_ONE, *m] for m in right]
        return left + right
    if "op" in expr and expr["op"] == "*":
        left, right = (monomials(a) for a in expr["args"])
        return [[*a, *b] for a in left for b in right]
    if "neg" in expr:
        return [[MINUS_ONE, *m] for m in monomials(expr["neg"])]
    return [[copy.deepcopy(expr)]]


def strict_vars(expr: Expr) -> list[str]:
    """The variables whose NULL makes ``expr`` NULL: those outside CASE, COALESCE, GREATEST and
    LEAST (through arithmetic and the functions NULL on a NULL argument)."""
    found: dict[str, None] = {}

    def walk(node: Expr) -> None:
        if "var" in node:
            found[node["var"]] = None
        elif "op" in node:
            for arg in node["args"]:
                walk(arg)
        elif "neg" in node:
            walk(node["neg"])
        elif node.get("fn") in STRICT:
            walk(node["args"][0])

    walk(expr)
    return list(found)


def nullable_parts(expr: Expr) -> Iterator[Expr]:
    """The sub-terms whose NULL makes ``expr`` NULL besides its strict variables: divisions
    (by zero), CASE, COALESCE, GREATEST and LEAST (NULL or not whatever their variables are)."""
    if "case" in expr or "coalesce" in expr or expr.get("fn") in ("greatest", "least"):
        yield expr
    elif expr.get("fn") in STRICT:
        yield from nullable_parts(expr["args"][0])
    elif "op" in expr:
        if expr["op"] == "/":
            yield expr
        for arg in expr["args"]:
            yield from nullable_parts(arg)
    elif "neg" in expr:
        yield from nullable_parts(expr["neg"])


def zero_of(column_type: ColumnType) -> Any:
    if column_type == FLOAT:
        return 0.0
    if column_type.kind == "DECIMAL":
        return Decimal(0)
    return 0
