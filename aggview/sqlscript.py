"""SQL text as ``aggview sql`` sends it: a script cut into calls, results as text, and the
interactive shell.

A script is cut at semicolons outside quotes and comments; each statement is one call, except
that ``BEGIN … COMMIT`` (or ROLLBACK) goes as one call, which makes it one transaction.
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import io
import json
import re
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

from aggview import errors

_BEGIN = re.compile(r"^\s*BEGIN\b", re.IGNORECASE)
_END = re.compile(r"^\s*(COMMIT|ROLLBACK)\b", re.IGNORECASE)
HISTORY = Path.home() / ".aggview_history"
# Every statement the cluster runs, for the shell's help and the server's refusal of others.
STATEMENTS = (
    "SELECT ... FROM table or view [WHERE ...] [GROUP BY ...] [ORDER BY ...] [LIMIT n]",
    "INSERT INTO table [(columns)] VALUES (...), ...",
    "UPDATE table SET column = value | column + n [WHERE ...]",
    "DELETE FROM table [WHERE ...]",
    "BEGIN; INSERT/UPDATE/DELETE ...; COMMIT;   (one transaction; ROLLBACK drops it)",
    "BEGIN READ ONLY; SELECT ...; SELECT ...; COMMIT;   (every SELECT at one timestamp)",
    "CREATE TABLE [IF NOT EXISTS] name (column TYPE [PRIMARY KEY] [NOT NULL], ...)",
    "DROP TABLE [IF EXISTS] name",
    "CREATE MATERIALIZED VIEW name [WITH (refresh = 'sync'|'async'|'cumulus', ...)] AS SELECT",
    "ALTER MATERIALIZED VIEW name SET (refresh = ..., interval_ms = ..., nodes = ...)",
    "DROP MATERIALIZED VIEW [IF EXISTS] name",
)
KINDS = (
    "SELECT, INSERT, UPDATE, DELETE, BEGIN ... COMMIT, CREATE TABLE, DROP TABLE, CREATE "
    "MATERIALIZED VIEW, ALTER MATERIALIZED VIEW ... SET, DROP MATERIALIZED VIEW"
)
EXITS = frozenset({"\\q", "exit", "quit", "exit;", "quit;"})


def statements(text: str) -> Iterator[str]:
    """The statements of a script, as written (comments kept, semicolons dropped)."""
    current: list[str] = []
    i, quote = 0, ""
    while i < len(text):
        char = text[i]
        if quote:
            current.append(char)
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
            current.append(char)
        elif text.startswith("--", i):
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            current.append(text[i:end])
            i = end
            continue
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = len(text) if end < 0 else end + 2
            current.append(text[i:end])
            i = end
            continue
        elif char == ";":
            yield from _nonempty("".join(current))
            current = []
        else:
            current.append(char)
        i += 1
    yield from _nonempty("".join(current))


def _bare(statement: str) -> str:
    """The statement without its comments."""
    return re.sub(r"--[^\n]*|/\*.*?\*/", "", statement, flags=re.DOTALL).strip()


def _nonempty(statement: str) -> Iterator[str]:
    if _bare(statement):
        yield statement.strip()


def calls(text: str) -> Iterator[str]:
    """The calls a script makes: one per statement, a transaction block as one."""
    block: list[str] = []
    for statement in statements(text):
        if block or _BEGIN.match(_bare(statement)):
            block.append(statement)
            if _END.match(_bare(statement)):
                yield "; ".join(block) + ";"
                block = []
        else:
            yield statement
    if block:
        yield "; ".join(block) + ";"  # the server refuses BEGIN without COMMIT, saying so


def complete(text: str) -> bool:
    """Whether text typed so far ends a statement and leaves no BEGIN block open."""
    if not text.rstrip().endswith(";"):
        return False
    inside = False
    for statement in statements(text):
        if _BEGIN.match(_bare(statement)):
            inside = True
        elif _END.match(_bare(statement)):
            inside = False
    return not inside


def _text(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _json_value(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)  # exact
    if isinstance(value, datetime.date):
        return value.isoformat()
    return value


def render(columns: list[str], rows: list[list[Any]], form: str) -> str:
    """A result as ``table`` (tab-separated, with a header), ``csv`` or ``json`` (one object
    per row, a JSON array). Nothing for a result without columns, except an empty array."""
    if form == "json":
        return json.dumps([dict(zip(columns, map(_json_value, r), strict=True)) for r in rows])
    if not columns:
        return ""
    if form == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([["" if v is None else _text(v) for v in r] for r in rows])
        return out.getvalue().rstrip("\n")
    return "\n".join(["\t".join(columns), *("\t".join(map(_text, r)) for r in rows)])


def shell(run: Callable[[str], None], address: str = "", prompt: str = "aggview> ") -> None:
    """Reads statements from the terminal (a statement ends at its semicolon; a BEGIN block at
    its COMMIT) with line editing and a history file, runs each, prints errors and goes on;
    ``help`` lists the statements, ``\\q``, ``exit`` or Ctrl-D leaves."""
    import readline  # line editing where the platform has it

    where = f" connected to {address}" if address else ""
    print(f"aggview SQL shell{where}: end each statement with ';'. help lists them; \\q quits.")
    with contextlib.suppress(OSError):
        readline.read_history_file(HISTORY)
    pending = ""
    try:
        while True:
            try:
                line = input(prompt if not pending else "    ...> ")
            except EOFError:
                print()
                return
            if not pending and line.strip().lower() in EXITS:
                return
            if not pending and line.strip().lower() in ("help", "\\?", "\\h", "help;"):
                print("Statements (end each with ';'):", *STATEMENTS, sep="\n  ")
                continue
            pending += line + "\n"
            if not complete(pending):
                continue
            for call in calls(pending):
                try:
                    run(call)
                except errors.AggviewError as exc:
                    print(f"error: {exc}")
            pending = ""
    finally:
        with contextlib.suppress(OSError):
            readline.write_history_file(HISTORY)
