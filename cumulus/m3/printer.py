"""An M3 program as DBToaster's text (sections SOURCES, MAPS, QUERIES, TRIGGERS).

What DBToaster's syntax has no words for is written in the same style: ``{x IS NOT NULL}`` (SQL's
NULLs), relation atoms inside statements (bounded ``--depth``) and ``DECLARE VIEW`` (a user's
view: its groups, aggregates read from maps, HAVING). The output is canonical: ``parser.parse``
reads it back to an equal program, and printing that again gives the same text.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from aggview.schema import ColumnType
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
    Query,
    Rel,
    Source,
    Statement,
    Trigger,
    View,
    ViewColumn,
)

RESERVED = frozenset(
    """abs aggsum and as between case cast coalesce create date declare else end extract false
    greatest hidden having in is least like map not null on or query rows stream substring table
    then true view when""".split()
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CMP_TEXT = {"=": "=", "<>": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def banner(title: str) -> str:
    return f"{'-' * 20} {title} {'-' * 20}"


def name(text: str) -> str:
    """A name as written: quoted when it is not a plain word or is a keyword of the syntax."""
    if _NAME.fullmatch(text) and text.lower() not in RESERVED:
        return text
    return '"' + text.replace('"', '""') + '"'


def type_text(column_type: ColumnType) -> str:
    return str(column_type).lower()


# --- expressions ---------------------------------------------------------------------------------


def literal_text(node: Expr) -> str:
    """A literal that parses back to the same value *and type* (``cumulus.sqltext`` rules)."""
    value, kind = node["lit"], ColumnType.parse(node["type"])
    if kind.kind == "INT":
        return str(value)
    if kind.kind == "DECIMAL":
        scale = kind.scale or 0
        text = format(Decimal(value).quantize(Decimal(1).scaleb(-scale)), "f")
        return text if scale else text + "."
    if kind.kind == "FLOAT":
        text = repr(float(value))
        return text if "e" in text or "E" in text else text + "e0"
    if kind.kind == "TEXT":
        return "'" + str(value).replace("'", "''") + "'"
    if kind.kind == "DATE":
        return f"DATE('{value}')"
    return "TRUE" if value else "FALSE"


_ARITH = 5  # the level of + and -: the operands of comparisons


def _level(expr: Expr) -> int:
    if "or" in expr:
        return 1
    if "and" in expr:
        return 2
    if "not" in expr:
        return 3
    if any(k in expr for k in ("cmp", "in", "between", "notnull", "like")):
        return 4
    if "op" in expr:
        return _ARITH if expr["op"] in ("+", "-") else _ARITH + 1
    if "neg" in expr:
        return 7
    return 8


def expr_text(expr: Expr, minimum: int = 0) -> str:
    """An expression with only the parentheses precedence needs (left-associative)."""
    text = _expr_text(expr)
    return f"({text})" if _level(expr) < minimum else text


def _expr_text(expr: Expr) -> str:
    if "var" in expr:
        return name(expr["var"])
    if "lit" in expr:
        return literal_text(expr)
    if "op" in expr:
        level = _level(expr)
        left, right = expr["args"]
        return f"{expr_text(left, level)} {expr['op']} {expr_text(right, level + 1)}"
    if "neg" in expr:
        inner = expr_text(expr["neg"], 7)
        return f"-({inner})" if inner.startswith("-") else f"-{inner}"
    if "cmp" in expr:
        left, right = expr["args"]
        return f"{expr_text(left, _ARITH)} {_CMP_TEXT[expr['cmp']]} {expr_text(right, _ARITH)}"
    if "in" in expr:
        values = ", ".join(expr_text(v, _ARITH) for v in expr["values"])
        return f"{expr_text(expr['in'], _ARITH)} IN ({values})"
    if "between" in expr:
        subject, low, high = (expr_text(expr[k], _ARITH) for k in ("between", "low", "high"))
        return f"{subject} BETWEEN {low} AND {high}"
    if "notnull" in expr:
        return f"{expr_text(expr['notnull'], _ARITH)} IS NOT NULL"
    if "like" in expr:
        pattern = literal_text({"lit": expr["pattern"], "type": "TEXT"})
        return f"{expr_text(expr['like'], _ARITH)} LIKE {pattern}"
    if "not" in expr:
        return f"NOT {expr_text(expr['not'], 3)}"
    if "and" in expr:
        return " AND ".join(expr_text(p, 3) for p in expr["and"])
    if "or" in expr:
        return " OR ".join(expr_text(p, 2) for p in expr["or"])
    if "null" in expr:
        return "NULL"
    if "case" in expr:
        whens = " ".join(f"WHEN {expr_text(w)} THEN {expr_text(t)}" for w, t in expr["case"])
        otherwise = f" ELSE {expr_text(expr['else'])}" if "else" in expr else ""
        shown = type_text(ColumnType.parse(expr["type"]))
        return f"CAST(CASE {whens}{otherwise} END AS {shown})"
    if "finish" in expr:  # SUM or AVG from a nested aggregate's sum and count
        args = ", ".join(expr_text(a) for a in expr["args"])
        shown = type_text(ColumnType.parse(expr["type"]))
        return f"CAST({expr['finish'].upper()}({args}) AS {shown})"
    if "coalesce" in expr:
        args = ", ".join(expr_text(a) for a in expr["coalesce"])
        return f"CAST(COALESCE({args}) AS {type_text(ColumnType.parse(expr['type']))})"
    if "fn" in expr:
        return _function_text(expr)
    raise ValueError(f"cannot print expression {expr!r}")


def _function_text(expr: Expr) -> str:
    """SQL's spelling; GREATEST and LEAST in a CAST to their type (as COALESCE), which the
    parser cannot know from variables it has no types for."""
    name, args = expr["fn"], [expr_text(a) for a in expr["args"]]
    if name in ("year", "month", "day"):
        return f"EXTRACT({name.upper()} FROM {args[0]})"
    text = f"{name.upper()}({', '.join(args)})"
    if "type" in expr:
        return f"CAST({text} AS {type_text(ColumnType.parse(expr['type']))})"
    return text


# --- factors, statements, declarations -----------------------------------------------------------


def map_ref_text(ref: MapRef, types: dict[str, ColumnType]) -> str:
    value_type = types.get(ref.name)
    shown = type_text(value_type) if value_type is not None else "?"
    return f"{name(ref.name)}({shown})[][{', '.join(name(k) for k in ref.keys)}]"


def factor_text(factor: Factor, types: dict[str, ColumnType]) -> str:
    if isinstance(factor, MapExtreme):
        adjust = "".join(f", {expr_text(e)}" for e in factor.adjust or ())
        inner = f"{factor.extreme.upper()}({map_ref_text(factor, types)}{adjust})"
        return f"({name(factor.var)} ^= {inner})"
    if isinstance(factor, MapLift):
        return f"({name(factor.var)} ^= {map_ref_text(factor, types)})"
    if isinstance(factor, MapRef):
        return map_ref_text(factor, types)
    if isinstance(factor, Rel):
        return f"{name(factor.relation)}({', '.join(name(a) for a in factor.args)})"
    if isinstance(factor, Guard):
        return "{" + expr_text(factor.pred) + "}"
    if isinstance(factor, Lift):
        inner = factor.expr
        shown = expr_text(inner) if "var" in inner else "{" + expr_text(inner) + "}"
        return f"({name(factor.var)} ^= {shown})"
    expr = factor.expr
    if "var" in expr or "lit" in expr:
        return expr_text(expr)
    return "{" + expr_text(expr) + "}"


def product_text(body: tuple[Factor, ...], types: dict[str, ColumnType]) -> str:
    if not body:
        return "1"
    return " * ".join(factor_text(f, types) for f in body)


def aggsum_text(aggsum: AggSum, types: dict[str, ColumnType]) -> str:
    keys = ", ".join(name(k) for k in aggsum.keys)
    return f"AggSum([{keys}], {product_text(aggsum.body, types)})"


def part_text(part: Part, types: dict[str, ColumnType]) -> str:
    if isinstance(part, MapRef):
        return map_ref_text(part, types)
    if isinstance(part, PartSum):
        return "(" + " + ".join(part_text(p, types) for p in part.parts) + ")"
    return aggsum_text(part, types)


def source_text(source: Source) -> str:
    columns = ", ".join(
        f"{name(c.name)} {type_text(c.type)}{'' if c.nullable else ' NOT NULL'}"
        for c in source.columns
    )
    kind = "TABLE" if source.replicated else "STREAM"
    return f"CREATE {kind} {name(source.name)}({columns});"


def keys_text(keys: tuple[tuple[str, ColumnType], ...]) -> str:
    return ", ".join(f"{name(k)}:{type_text(t)}" for k, t in keys)


def map_text(decl: MapDecl, types: dict[str, ColumnType]) -> str:
    head = f"DECLARE MAP {name(decl.name)}({type_text(decl.value_type)})[][{keys_text(decl.keys)}]"
    if decl.definition is None:
        return head + ";"
    return f"{head} :=\n    {aggsum_text(decl.definition, types)};"


def query_text(query: Query, types: dict[str, ColumnType]) -> str:
    return f"DECLARE QUERY {name(query.name)} := {part_text(query.part, types)};"


def _column_text(column: ViewColumn, types: dict[str, ColumnType]) -> str:
    hidden = "HIDDEN " if column.hidden else ""
    if column.expr is not None:
        assert column.type is not None
        shown = "{" + expr_text(column.expr) + "}"
        return f"{hidden}{name(column.name)} := {shown} : {type_text(column.type)}"
    if column.kind is None:
        return name(column.name)
    parts = " + ".join(part_text(p, types) for p in column.parts)
    if column.count is not None:
        parts += ", " + part_text(column.count, types)
    assert column.type is not None
    hidden = "HIDDEN " if column.hidden else ""
    return f"{hidden}{name(column.name)} := {column.kind.name}({parts}) : {type_text(column.type)}"


def view_text(view: View, types: dict[str, ColumnType]) -> str:
    lines = [f"DECLARE VIEW {name(view.name)}[{keys_text(view.keys)}] :="]
    items = [f"ROWS {part_text(view.rows, types)}"]
    items += [_column_text(c, types) for c in view.columns]
    lines += [f"    {item}," for item in items[:-1]] + [f"    {items[-1]}"]
    if view.having is not None:
        lines.append("    HAVING {" + expr_text(view.having) + "}")
    lines[-1] += ";"
    return "\n".join(lines)


def statement_text(statement: Statement, types: dict[str, ColumnType]) -> str:
    target = map_ref_text(statement.target, types)
    return f"{target} += {product_text(statement.body, types)};"


def trigger_text(trigger: Trigger, types: dict[str, ColumnType]) -> str:
    args = ", ".join(name(a) for a in trigger.args)
    lines = [f"ON {trigger.sign} {name(trigger.relation)}({args}) {{"]
    lines += [f"    {statement_text(s, types)}" for s in trigger.statements]
    lines.append("}")
    return "\n".join(lines)


def print_program(program: Program) -> str:
    """The whole program as M3 text, every section present (possibly empty)."""
    types = {decl.name: decl.value_type for decl in program.maps}
    out: list[Any] = [banner("SOURCES")]
    out += [source_text(s) for s in program.sources]
    out += ["", banner("MAPS")]
    out += [map_text(m, types) for m in program.maps]
    out += ["", banner("QUERIES")]
    out += [query_text(q, types) for q in program.queries]
    out += [view_text(v, types) for v in program.views]
    out += ["", banner("TRIGGERS")]
    for trigger in program.triggers:
        out += [trigger_text(trigger, types), ""]
    return "\n".join(out).rstrip() + "\n"
