"""``aggview m3 --schema FILE.sql "SELECT ..." [--depth N]``: print the M3 program of views.

The schema file's CREATE TABLE statements are read by the catalog's own parser, which the entry
point passes in (``cumulus`` sits below the coordinator and cannot import it).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlglot
from sqlglot import exp

from aggview import errors
from aggview.schema import TableSchema
from cumulus.m3.compiler import compile_program, plan_of
from cumulus.m3.printer import print_program
from cumulus.sqltext import syntax_error

TableFromCreate = Callable[[exp.Create, Callable[[str], str]], TableSchema]


def add_m3_command(sub: Any, run: Callable[[argparse.Namespace], None]) -> None:
    m3 = sub.add_parser(
        "m3", help="compile view SQL to an M3 program (recursive delta compilation)"
    )
    m3.add_argument("--schema", required=True, help="a file of CREATE TABLE statements")
    m3.add_argument(
        "select",
        nargs="+",
        help="SELECT ... (one view each: q, or q1, q2, ...) or CREATE MATERIALIZED VIEW ...",
    )
    m3.add_argument(
        "--depth",
        type=int,
        default=None,
        help="bound the recursion: 0 recomputes when read, 1 is first-order IVM "
        "(default: every level materialized)",
    )
    m3.set_defaults(run=run)


def tables_of(schema_sql: str, table_from_create: TableFromCreate) -> dict[str, TableSchema]:
    try:
        statements = [s for s in sqlglot.parse(schema_sql) if s is not None]
    except sqlglot.errors.SqlglotError as exc:
        raise syntax_error(schema_sql, exc) from None
    tables: dict[str, TableSchema] = {}
    for statement in statements:
        if not (isinstance(statement, exp.Create) and statement.kind == "TABLE"):
            raise errors.InvalidArgument(
                f"the schema holds CREATE TABLE statements only, not {statement.sql()[:60]!r}"
            )
        schema = table_from_create(statement, lambda name: name)
        if schema.name in tables:
            raise errors.InvalidArgument(f"the schema declares table {schema.name} twice")
        tables[schema.name] = schema
    return tables


def program_text(
    schema_sql: str, selects: list[str], depth: int | None, table_from_create: TableFromCreate
) -> str:
    tables = tables_of(schema_sql, table_from_create)

    def table(name: str) -> TableSchema:
        if name not in tables:
            raise errors.UnknownTable(f"unknown table {name!r} (not in the schema file)")
        return tables[name]

    names = ["q"] if len(selects) == 1 else [f"q{i}" for i in range(1, len(selects) + 1)]
    plans = [plan_of(sql, name, table) for sql, name in zip(selects, names, strict=True)]
    return print_program(compile_program(plans, table, depth))


def run_m3(args: argparse.Namespace, table_from_create: TableFromCreate) -> None:
    try:
        schema_sql = Path(args.schema).read_text()
    except OSError as exc:
        raise errors.InvalidArgument(f"cannot read --schema {args.schema}: {exc}") from None
    print(program_text(schema_sql, args.select, args.depth, table_from_create), end="")
