"""SQL text shared by every statement the project reads: parsing one statement, identifiers,
and literals -- the one literal parser, so a view's WHERE, a read's WHERE and (later) an INSERT's
VALUES agree on what ``-1.50``, ``1e3`` or ``DATE '2024-01-01'`` mean (``DATE('2024-01-01')``,
DBToaster's and several engines' spelling, is the same literal).

Literal types: 12 is INT (DECIMAL(38,0) past 64 bits); 1.50 is DECIMAL(38,2); 1e3 is FLOAT; 'x'
is TEXT, or DATE when compared with a DATE and in ISO form; DATE '2024-01-01' is DATE; a leading
minus (any number of them, parenthesized or not) negates a numeric literal of any type.
"""

from __future__ import annotations

import datetime
import re
from decimal import Decimal
from typing import Any

import sqlglot
from sqlglot import exp

from aggview import errors
from aggview.schema import INT_MAX, ColumnType
from cumulus.expressions import literal_value
from cumulus.plan import Expr
from cumulus.typerules import BOOL, DATE, FLOAT, INT, NUMERIC, TEXT, decimal_type

Typed = tuple[Expr, ColumnType]
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def identifier(node: exp.Expression | None, what: str) -> str:
    """SQL identifier rules: unquoted names fold to lower case, quoted ones are kept."""
    if node is None:
        raise errors.InvalidArgument(f"missing {what} name")
    ident = node if isinstance(node, exp.Identifier) else node.find(exp.Identifier)
    if ident is None:
        raise errors.InvalidArgument(f"missing {what} name")
    name = ident.name if ident.quoted else ident.name.lower()
    if not _NAME.match(name):
        raise errors.InvalidArgument(
            f"invalid {what} name {name!r}: use letters, digits and _ (at most 64)"
        )
    return name


# The words a statement may start with: a typo in the first one is named as such.
STATEMENT_WORDS = frozenset(
    {"SELECT", "WITH", "INSERT", "UPDATE", "DELETE", "CREATE", "ALTER", "DROP", "BEGIN"}
    | {"COMMIT", "ROLLBACK", "START", "END", "VALUES"}
)


def syntax_error(sql: str, exc: sqlglot.errors.SqlglotError) -> errors.InvalidArgument:
    """A parser's error in SQL terms (``syntax error near 'SELEC'``), without the parser's
    class names or its terminal escape codes."""
    if isinstance(exc, sqlglot.errors.TokenError):
        return errors.InvalidArgument("syntax error: a quote or comment is not closed")
    found = exc.errors[0] if isinstance(exc, sqlglot.errors.ParseError) and exc.errors else {}
    line, column = found.get("line") or 1, found.get("col") or 1
    lines = sql.splitlines() or [""]
    offset = sum(len(text) + 1 for text in lines[: line - 1]) + column
    statement = sql[sql.rfind(";", 0, offset) + 1 :]  # the one the error is in
    first = re.match(r"\s*(?:--[^\n]*\n\s*)*([A-Za-z_]+)", statement)
    if first and first.group(1).upper() not in STATEMENT_WORDS:
        return errors.InvalidArgument(
            f"syntax error near {first.group(1)!r}: a statement starts with SELECT, INSERT, "
            "UPDATE, DELETE, CREATE, ALTER, DROP, BEGIN or COMMIT"
        )
    near = (found.get("highlight") or "").strip()
    said = str(found.get("description") or "")
    why = f": {said.lower()}" if said.startswith("Expecting") else ""
    where = f"line {line}, column {column}"
    return errors.InvalidArgument(
        f"syntax error near {near!r} ({where}){why}" if near else f"syntax error ({where}){why}"
    )


def parse_statements(sql: str) -> list[exp.Expression]:
    """Every statement of ``sql`` (separated by semicolons)."""
    try:
        statements = [s for s in sqlglot.parse(sql) if s is not None]
    except sqlglot.errors.SqlglotError as exc:
        raise syntax_error(sql, exc) from None
    if not statements:
        raise errors.InvalidArgument("no SQL statement")
    for statement in statements:
        for call in list(statement.find_all(exp.Date)):
            only = not any(v for k, v in call.args.items() if k != "this")
            if only and isinstance(call.this, exp.Literal) and call.this.is_string:
                call.replace(exp.cast(call.this.copy(), "DATE"))  # DATE('1995-03-15')
    return statements


def parse_sql(sql: str) -> exp.Expression:
    statements = parse_statements(sql)
    if len(statements) != 1:
        raise errors.InvalidArgument(f"expected one SQL statement, got {len(statements)}")
    return statements[0]


def literal(node: exp.Expression) -> Typed:
    """A SQL literal as a JSON literal and its type."""
    if isinstance(node, exp.Boolean):
        return {"lit": bool(node.this), "type": "BOOL"}, BOOL
    if isinstance(node, exp.Cast):
        return date_literal(node.this.this, node), DATE
    if isinstance(node, exp.Null):
        raise errors.InvalidArgument(
            f"NULL literal is not supported (a comparison with NULL is never true): "
            f"{(node.parent or node).sql()}"
        )
    assert isinstance(node, exp.Literal)
    text = node.this
    if node.is_string:
        return {"lit": text, "type": "TEXT"}, TEXT
    if re.fullmatch(r"[0-9]+", text):
        value = int(text)
        if value <= INT_MAX:
            return {"lit": value, "type": "INT"}, INT
        if len(text.lstrip("0")) > 38:
            raise errors.InvalidArgument(f"integer literal {text} has more than 38 digits")
        return {"lit": str(value), "type": "DECIMAL(38,0)"}, decimal_type(0)
    if re.fullmatch(r"[0-9]*\.[0-9]*", text) and text != ".":
        number = Decimal(text)
        scale = len(text.split(".")[1])
        if len(number.as_tuple().digits) > 38 or scale > 38:
            raise errors.InvalidArgument(f"decimal literal {text} has more than 38 digits")
        return {"lit": format(number, "f"), "type": str(decimal_type(scale))}, decimal_type(scale)
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise errors.InvalidArgument(f"numeric literal {text} is not a finite number")
    return {"lit": value, "type": "FLOAT"}, FLOAT


def date_literal(text: str, node: exp.Expression) -> Expr:
    try:
        if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", text):
            raise ValueError
        datetime.date.fromisoformat(text)
    except ValueError:
        raise errors.TypeMismatch(
            f"{text!r} is not an ISO-8601 date (YYYY-MM-DD) in {node.sql()}"
        ) from None
    return {"lit": text, "type": "DATE"}


def negated_literal(lit: Expr, type_: ColumnType) -> Expr:
    value = lit["lit"]
    if type_.kind == "DECIMAL":
        return {**lit, "lit": format(-Decimal(value), "f") if Decimal(value) else value}
    return {**lit, "lit": -value}


def constant(node: exp.Expression) -> Typed:
    """A literal, possibly signed and parenthesized (``-1.50``, ``-(-2)``, ``+3``), typed."""
    if isinstance(node, exp.Paren):
        return constant(node.this)
    if isinstance(node, exp.Neg):
        inner, type_ = constant(node.this)
        if type_.kind not in NUMERIC:
            raise errors.TypeMismatch(f"unary minus on {type_}: {node.sql()}")
        return negated_literal(inner, type_), type_
    if isinstance(node, exp.Literal | exp.Boolean | exp.Cast | exp.Null):
        return literal(node)
    raise errors.InvalidArgument(f"expected a literal, got {node.sql()!r}")


def column_value(node: exp.Expression, column_type: ColumnType) -> Any:
    """A literal as the Python value a column of ``column_type`` is written or compared with:
    numbers convert exactly between the numeric types where they can (an exponent literal for
    a DECIMAL column by its shortest decimal form, an integral one for an INT column), a TEXT
    literal in ISO form for a DATE column is that date, NULL is None. What cannot convert is
    left for the column's own check to refuse, naming the column."""
    if isinstance(node, exp.Null):
        return None
    expr, type_ = constant(node)
    value = literal_value(expr)
    kind = column_type.kind
    if type_.kind in NUMERIC and kind in NUMERIC and type_.kind != kind:
        if kind == "FLOAT":
            return float(value)
        if kind == "DECIMAL" and isinstance(value, float):
            return Decimal(repr(value))
        if kind == "INT" and value == int(value):
            return int(value)
    if kind == "DATE" and type_.kind == "TEXT":
        return literal_value(date_literal(value, node))
    return value


def divided_as_views_divide(select: str) -> str:
    """``select`` in duckdb's dialect with ``/`` as a view computes it: FLOAT division, NULL by
    a zero divisor (duckdb gives inf for ``1 / 0``, which a view never does). For a
    recomputation by duckdb that must mean what the view means."""

    def divide(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Div):
            return node
        right = exp.Nullif(
            this=exp.cast(node.expression, "DOUBLE"), expression=exp.Literal.number(0)
        )
        return exp.Div(this=exp.cast(node.this, "DOUBLE"), expression=right)

    return parse_sql(select).transform(divide).sql(dialect="duckdb")
