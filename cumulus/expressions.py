"""Run-time evaluation of plan expressions and predicates (see ``cumulus.plan`` for the trees).

View maintenance evaluates filters and aggregate arguments on every write, so a tree is compiled
once into nested closures; evaluating is then a few Python calls per node, with no dispatch on
the tree's shape. Values are the user-facing Python values (int, Decimal, float, str, date,
bool, None), read through a ``lookup(alias, column)`` callable.

Semantics, chosen to match SQL and to stay exact:

- any NULL operand makes an arithmetic result NULL (None); "/" by zero is NULL too;
- DECIMAL arithmetic (+ - * with any Decimal operand) is exact: a context with the largest
  precision, so Decimal results keep every digit (the type rules bound the scale at 38);
- "/" is FLOAT division always: both operands are converted to float, then divided (the
  compiler types it FLOAT; Spark reproduces it with explicit casts to DOUBLE);
- any FLOAT operand makes + - * float arithmetic;
- predicates are three-valued inside (NOT NULL is NULL; OR is TRUE if a part is, else NULL if a
  part is); ``compile_predicate`` answers True only for TRUE, so a row whose filter is NULL is
  filtered out, as in SQL; ``x IN (1, NULL)`` is TRUE or NULL, ``x NOT IN (1, NULL)`` never TRUE;
- CASE takes the first branch whose condition is TRUE (NULL is not), else its ELSE (NULL when
  absent); COALESCE its first non-NULL argument; both convert the result to their node's
  ``type`` (an INT branch of a DECIMAL CASE is a Decimal), so a value's Python type is its
  SQL type's whatever branch gave it;
- LIKE: ``%`` any run of characters, ``_`` one character, case-sensitive, no escape character
  (the compiler refuses a backslash, which PostgreSQL reads as one and duckdb does not);
- scalar functions (``{"fn": name, "args": [...]}``): ABS, YEAR/MONTH/DAY (EXTRACT from a
  DATE) and SUBSTRING are NULL on a NULL argument; SUBSTRING takes characters from a constant
  1-based start >= 1 for a constant length >= 0 (the forms PostgreSQL, duckdb and Spark agree
  on); GREATEST and LEAST skip NULL arguments (NULL only if all are, as in PostgreSQL and
  duckdb) and compare their arguments converted to the node's ``type``.

HAVING predicates read view columns with ``{"out": name}``: the lookup is then called as
``lookup("", name)``.
"""

from __future__ import annotations

import datetime
import decimal
import operator
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from aggview.errors import InvalidArgument
from aggview.schema import ColumnType

Lookup = Callable[[str, str], object]
Evaluator = Callable[[Lookup], Any]
Predicate = Callable[[Lookup], bool]

# Exact for + - *: the result never has more digits than the context allows, so nothing rounds.
# Inexact is trapped anyway, so a mistake here would raise rather than silently round.
EXACT = decimal.Context(
    prec=decimal.MAX_PREC,
    Emax=decimal.MAX_EMAX,
    Emin=decimal.MIN_EMIN,
    traps=[decimal.InvalidOperation, decimal.Overflow, decimal.Inexact, decimal.DivisionByZero],
)

_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def literal_value(node: Mapping[str, Any]) -> object:
    """A JSON literal as the Python value a column of its type would hold."""
    value, kind = node.get("lit"), node.get("type")
    try:
        if kind == "INT" and type(value) is int:
            return value
        if isinstance(kind, str) and kind.startswith("DECIMAL") and isinstance(value, str):
            number = Decimal(value)
            if number.is_finite():
                return number
        if kind == "FLOAT" and type(value) in (int, float):
            return float(value)
        if kind == "TEXT" and isinstance(value, str):
            return value
        if kind == "DATE" and isinstance(value, str):
            return datetime.date.fromisoformat(value)
        if kind == "BOOL" and type(value) is bool:
            return value
    except (ValueError, decimal.InvalidOperation):
        pass
    raise InvalidArgument(f"invalid literal {dict(node)!r}")


# --- arithmetic ---------------------------------------------------------------------------------


def add(a: Any, b: Any) -> Any:
    """Exact for int and Decimal (never rounds), float only if either side is a float."""
    if type(a) is int and type(b) is int:
        return a + b
    if type(a) is float or type(b) is float:
        return float(a) + float(b)
    return EXACT.add(a, b)


def _sub(a: Any, b: Any) -> Any:
    if type(a) is int and type(b) is int:
        return a - b
    if type(a) is float or type(b) is float:
        return float(a) - float(b)
    return EXACT.subtract(a, b)


def mul(a: Any, b: Any) -> Any:
    if type(a) is int and type(b) is int:
        return a * b
    if type(a) is float or type(b) is float:
        return float(a) * float(b)
    return EXACT.multiply(a, b)


def _div(a: Any, b: Any) -> float | None:
    divisor = float(b)
    if divisor == 0.0:
        return None
    return float(a) / divisor


def _neg(a: Any) -> Any:
    # Decimal's unary minus rounds to the thread's context; EXACT.minus never rounds.
    return EXACT.minus(a) if type(a) is Decimal else -a


_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {"+": add, "-": _sub, "*": mul, "/": _div}
# the operators by name, and negation, for code generated from plan trees (``cumulus.m3.codegen``):
# the same functions, so generated code computes what these closures compute
ARITHMETIC: Mapping[str, Callable[[Any, Any], Any]] = _ARITHMETIC
negate = _neg


def _binary(op: Callable[[Any, Any], Any], left: Evaluator, right: Evaluator) -> Evaluator:
    """``op`` on two operands, NULL if either is (arithmetic and comparisons alike)."""

    def evaluate(get: Lookup) -> Any:
        a = left(get)
        if a is None:
            return None
        b = right(get)
        if b is None:
            return None
        return op(a, b)

    return evaluate


def _args(node: Mapping[str, Any], count: int) -> list[Any]:
    args = node.get("args")
    if not isinstance(args, list) or len(args) != count:
        raise InvalidArgument(f"expression {dict(node)!r} needs {count} args")
    return args


def _operator_node(
    node: Mapping[str, Any], key: str, operators: Mapping[str, Callable[[Any, Any], Any]], what: str
) -> Evaluator:
    """An arithmetic (``op``) or comparison (``cmp``) node: the operator ``node[key]`` names in
    ``operators`` over its two operands, which are value expressions either way."""
    op = operators.get(node[key])
    if op is None:
        raise InvalidArgument(f"unknown {what} {node[key]!r}")
    left, right = (compile_expr(a) for a in _args(node, 2))
    return _binary(op, left, right)


def compile_expr(expr: Mapping[str, Any]) -> Evaluator:
    """Compile a value expression once; the result maps a lookup to a value (None for NULL)."""
    if not isinstance(expr, Mapping):
        raise InvalidArgument(f"expression must be an object; got {expr!r}")
    if "col" in expr:
        ref = expr["col"]
        if not (isinstance(ref, list) and len(ref) == 2 and all(isinstance(p, str) for p in ref)):
            raise InvalidArgument(f"column reference must be [alias, column]; got {ref!r}")
        alias, column = ref
        return lambda get: get(alias, column)
    if "out" in expr:
        name = expr["out"]
        if not isinstance(name, str):
            raise InvalidArgument(f"output reference must be a name; got {name!r}")
        return lambda get: get("", name)
    if "lit" in expr:
        value = literal_value(expr)
        return lambda get: value
    if "op" in expr:
        return _operator_node(expr, "op", _ARITHMETIC, "operator")
    if "neg" in expr:
        inner = compile_expr(expr["neg"])

        def negate(get: Lookup) -> Any:
            value = inner(get)
            return None if value is None else _neg(value)

        return negate
    if "null" in expr:
        return lambda get: None
    if "case" in expr:
        return _case(expr)
    if "coalesce" in expr:
        return _coalesce(expr)
    if "fn" in expr:
        return _function(expr)
    raise InvalidArgument(f"unknown expression {dict(expr)!r}")


def converter(type_text: object, scaled: bool = False) -> Callable[[Any], Any]:
    """A value of a CASE, COALESCE, GREATEST or LEAST argument as a value of the node's type
    (numbers only convert: INT -> DECIMAL -> FLOAT; None stays None). ``scaled``: a DECIMAL
    also gets the type's scale, as SQL casts each argument (GREATEST(x, 0) is 0.00, not 0);
    exact, as no argument has a larger scale than the common type's."""
    if not isinstance(type_text, str):
        raise InvalidArgument(f"CASE, COALESCE, GREATEST and LEAST need a type; got {type_text!r}")
    if type_text == "FLOAT":
        return lambda v: None if v is None else float(v)
    if type_text.startswith("DECIMAL") and scaled:
        quantum = Decimal(1).scaleb(-(ColumnType.parse(type_text).scale or 0))
        return lambda v: None if v is None else EXACT.quantize(Decimal(v), quantum)
    if type_text.startswith("DECIMAL"):
        return lambda v: Decimal(v) if type(v) is int else v
    return lambda v: v


def _case(expr: Mapping[str, Any]) -> Evaluator:
    branches = expr["case"]
    if not isinstance(branches, list) or not branches:
        raise InvalidArgument(f"CASE needs a non-empty list of [condition, value]; got {expr!r}")
    compiled = [(_predicate3(when), compile_expr(then)) for when, then in branches]
    otherwise = compile_expr(expr["else"]) if "else" in expr else (lambda get: None)
    convert = converter(expr.get("type"))

    def evaluate(get: Lookup) -> Any:
        for when, then in compiled:
            if when(get) is True:
                return convert(then(get))
        return convert(otherwise(get))

    return evaluate


def _coalesce(expr: Mapping[str, Any]) -> Evaluator:
    args = expr["coalesce"]
    if not isinstance(args, list) or not args:
        raise InvalidArgument(f"COALESCE needs a non-empty list; got {expr!r}")
    compiled = [compile_expr(a) for a in args]
    convert = converter(expr.get("type"))

    def evaluate(get: Lookup) -> Any:
        for arg in compiled:
            value = arg(get)
            if value is not None:
                return convert(value)
        return None

    return evaluate


# --- scalar functions ---------------------------------------------------------------------------


def _abs(a: Any) -> Any:
    # Decimal's abs() rounds to the thread's context; EXACT.abs never rounds.
    return EXACT.abs(a) if type(a) is Decimal else abs(a)


# the functions NULL on a NULL argument and of one value (SUBSTRING's bounds are constants),
# by plan name; generated code (``cumulus.m3.codegen``) calls these same functions
STRICT_FUNCTIONS: Mapping[str, Callable[[Any], Any]] = {
    "abs": _abs,
    "year": operator.attrgetter("year"),
    "month": operator.attrgetter("month"),
    "day": operator.attrgetter("day"),
}
# the functions NULL exactly when their first argument is (SUBSTRING's others are constants)
STRICT = frozenset({*STRICT_FUNCTIONS, "substring"})
FUNCTIONS = frozenset({*STRICT, "greatest", "least"})
EXTRACT_UNITS = ("YEAR", "MONTH", "DAY")  # EXTRACT's, each the function of its name in lower case


def substring_bounds(expr: Mapping[str, Any]) -> tuple[int, int | None]:
    """SUBSTRING's constant start and length (None: to the end), checked to be the forms every
    engine agrees on (start >= 1, length >= 0): as 0-based slice bounds."""
    args = expr.get("args")
    if not isinstance(args, list) or len(args) not in (2, 3):
        raise InvalidArgument(f"SUBSTRING needs a string, a start and maybe a length: {expr!r}")
    bounds: list[int] = []
    for arg in args[1:]:
        value = literal_value(arg) if isinstance(arg, Mapping) and "lit" in arg else None
        if type(value) is not int or value < (0 if bounds else 1):
            raise InvalidArgument(f"SUBSTRING needs a constant start >= 1, length >= 0: {expr!r}")
        bounds.append(value)
    start = bounds[0] - 1
    return start, (start + bounds[1] if len(bounds) == 2 else None)


def substring_function(expr: Mapping[str, Any]) -> Callable[[Any], Any]:
    """SUBSTRING of one (non-NULL) string, its bounds fixed."""
    start, end = substring_bounds(expr)
    return lambda text: text[start:end]


def _function(expr: Mapping[str, Any]) -> Evaluator:
    name, args = expr["fn"], expr.get("args")
    if name not in FUNCTIONS or not isinstance(args, list) or not args:
        raise InvalidArgument(f"unknown function or arguments {dict(expr)!r}")
    if name in ("greatest", "least"):
        pick = max if name == "greatest" else min
        return _extreme(pick, args, converter(expr.get("type"), scaled=True))
    apply = substring_function(expr) if name == "substring" else STRICT_FUNCTIONS[name]
    if name != "substring" and len(args) != 1:
        raise InvalidArgument(f"{name.upper()} takes one argument: {dict(expr)!r}")
    inner = compile_expr(args[0])

    def evaluate(get: Lookup) -> Any:
        value = inner(get)
        return None if value is None else apply(value)

    return evaluate


def _extreme(
    pick: Callable[[list[Any]], Any], args: list[Any], convert: Callable[[Any], Any]
) -> Evaluator:
    """GREATEST or LEAST: of the non-NULL arguments, each as a value of the result type."""
    compiled = [compile_expr(a) for a in args]

    def evaluate(get: Lookup) -> Any:
        present = [convert(v) for v in (arg(get) for arg in compiled) if v is not None]
        return pick(present) if present else None

    return evaluate


# --- predicates (three-valued inside: True, False or None for NULL) ----------------------------


def _in(subject: Evaluator, values: list[Mapping[str, Any]]) -> Evaluator:
    if all("lit" in v or "null" in v for v in values):
        # Equal int, Decimal and float values hash alike, so one set serves every numeric type.
        constants = frozenset(literal_value(v) for v in values if "lit" in v)
        miss = None if any("null" in v for v in values) else False  # x IN (1, NULL): not FALSE

        def in_constants(get: Lookup) -> bool | None:
            x = subject(get)
            return None if x is None else (x in constants) or miss

        return in_constants
    items = [compile_expr(v) for v in values]

    def in_list(get: Lookup) -> bool | None:
        x = subject(get)
        if x is None:
            return None
        unknown = False
        for item in items:
            y = item(get)
            if y is None:
                unknown = True
            elif x == y:
                return True
        return None if unknown else False

    return in_list


def _between(subject: Evaluator, low: Evaluator, high: Evaluator) -> Evaluator:
    def evaluate(get: Lookup) -> bool | None:
        x = subject(get)
        if x is None:
            return None
        lo, hi = low(get), high(get)
        above = None if lo is None else lo <= x
        below = None if hi is None else x <= hi
        if above is False or below is False:
            return False
        if above is None or below is None:
            return None
        return True

    return evaluate


def _connective(decisive: bool) -> Callable[[list[Evaluator]], Evaluator]:
    """AND (``decisive`` False: one FALSE part decides) or OR (one TRUE part decides); else
    NULL if a part is NULL, else the other truth value."""

    def combine(parts: list[Evaluator]) -> Evaluator:
        def evaluate(get: Lookup) -> bool | None:
            unknown = False
            for part in parts:
                value = part(get)
                if value is decisive:
                    return decisive
                if value is None:
                    unknown = True
            return None if unknown else not decisive

        return evaluate

    return combine


_and, _or = _connective(False), _connective(True)


def like_regex(pattern: str) -> re.Pattern[str]:
    """A LIKE pattern as a regular expression matching the whole string."""
    parts = [".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern]
    return re.compile("".join(parts), re.DOTALL)


def _like(subject: Evaluator, pattern: str) -> Evaluator:
    regex = like_regex(pattern)

    def evaluate(get: Lookup) -> bool | None:
        x = subject(get)
        return None if x is None else regex.fullmatch(x) is not None

    return evaluate


def _not(inner: Evaluator) -> Evaluator:
    def evaluate(get: Lookup) -> bool | None:
        value = inner(get)
        return None if value is None else not value

    return evaluate


def _predicate3(pred: Mapping[str, Any]) -> Evaluator:
    """Compile to a three-valued function, so NOT and AND treat NULL as SQL does."""
    if not isinstance(pred, Mapping):
        raise InvalidArgument(f"predicate must be an object; got {pred!r}")
    if "cmp" in pred:
        return _operator_node(pred, "cmp", _COMPARE, "comparison")
    if "in" in pred:
        values = pred.get("values")
        if not isinstance(values, list) or not values:
            raise InvalidArgument(f"IN needs a non-empty values list; got {dict(pred)!r}")
        return _in(compile_expr(pred["in"]), values)
    if "between" in pred:
        if "low" not in pred or "high" not in pred:
            raise InvalidArgument(f"BETWEEN needs low and high; got {dict(pred)!r}")
        return _between(
            compile_expr(pred["between"]), compile_expr(pred["low"]), compile_expr(pred["high"])
        )
    if "not" in pred:
        return _not(_predicate3(pred["not"]))
    for key, combine in (("and", _and), ("or", _or)):
        if key in pred:
            parts = pred[key]
            if not isinstance(parts, list) or not parts:
                raise InvalidArgument(f"{key.upper()} needs a non-empty list; got {dict(pred)!r}")
            return combine([_predicate3(p) for p in parts])
    if "like" in pred:
        pattern = pred.get("pattern")
        if not isinstance(pattern, str):
            raise InvalidArgument(f"LIKE needs a constant pattern; got {dict(pred)!r}")
        return _like(compile_expr(pred["like"]), pattern)
    if "notnull" in pred:
        inner = compile_expr(pred["notnull"])
        return lambda get: inner(get) is not None
    if "lit" in pred and pred.get("type") == "BOOL":  # a constant condition (TRUE, FALSE)
        constant = literal_value(pred)
        return lambda get: constant
    raise InvalidArgument(f"unknown predicate {dict(pred)!r}")


def compile_predicate(pred: Mapping[str, Any]) -> Predicate:
    """Compile a predicate once; the result is True only when the predicate is TRUE (not NULL)."""
    inner = _predicate3(pred)
    return lambda get: inner(get) is True


def compile_filters(filters: list[Mapping[str, Any]] | tuple[Mapping[str, Any], ...]) -> Predicate:
    """A view's WHERE conjunction as one predicate (always True when there are no filters)."""
    if not filters:
        return lambda get: True
    if len(filters) == 1:
        return compile_predicate(filters[0])
    return compile_predicate({"and": list(filters)})
