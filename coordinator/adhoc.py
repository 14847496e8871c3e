"""Ad-hoc SELECTs over base tables (joins, aggregates, ORDER BY …) at one snapshot.

The rows of every table (or view) the query names are read at one timestamp, up to the
``max_adhoc_rows`` limit in all, into an in-memory duckdb that cannot touch files or the
network, and the query runs there. Past the limit the answer is an error that suggests a
materialized view (or Spark); the message of a result names the views over the same tables,
which may answer it cheaper. Pure reading: nothing here writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from sqlglot import exp

from aggview import errors
from aggview.rowcodec import decode_row
from aggview.schema import ColumnType, TableSchema, from_storage
from coordinator.transactions import TransactionManager
from cumulus.aggstate import ViewState
from cumulus.passes.lift_subqueries import HIDDEN_PREFIX
from cumulus.sqltext import identifier


def sources(statement: exp.Select) -> list[str]:
    """The tables and views a query reads; anything else there (a table function, a file, a
    schema-qualified name) is refused."""
    ctes = {identifier(c.args["alias"], "name") for c in statement.find_all(exp.CTE)}
    names = []
    for table in statement.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier) or table.args.get("db"):
            raise errors.InvalidArgument(f"unsupported source {table.sql()!r}: name a table")
        name = identifier(table.this, "table")
        if name not in ctes and name not in names:
            names.append(name)
    if not names:
        raise errors.InvalidArgument("SELECT needs FROM a table")
    return names


async def run(
    statement: exp.Select, manager: TransactionManager, at: int
) -> tuple[list[str], list[tuple[Any, ...]], int, str]:
    """(columns, rows, timestamp, note) of an ad-hoc query."""
    names = sources(statement)
    views = manager.views.views if manager.views is not None else {}
    loaded: dict[str, tuple[list[tuple[str, str]], list[tuple[Any, ...]]]] = {}
    budget = limit = manager.limits.max_adhoc_rows
    async with manager.snapshot(at) as ts:
        for name in names:
            if name in views:
                rows, _, _ = await manager.views.read(name, {}, at=ts)  # type: ignore[union-attr]
                columns = _view_columns(views[name].compiled)
                values = [tuple(r[c] for c, _ in columns) for r in rows]
            else:
                schema = manager.catalog.table(name)
                stored = await manager.read_range_at(
                    schema.table_id, b"", b"", ts, limit=budget + 1
                )
                columns = [(c.name, c.type.duckdb()) for c in schema.columns]
                values = [_typed(schema, data) for _, data in stored]
            budget -= len(values)
            if budget < 0:
                raise errors.LimitExceeded(
                    f"this query reads more than {limit} rows ({name} among them; the limit is "
                    "max_adhoc_rows): declare a materialized view for it (CREATE MATERIALIZED "
                    "VIEW … AS SELECT …) or run it in Spark (aggspark)"
                )
            loaded[name] = (columns, values)
    columns, rows = await asyncio.to_thread(_execute, statement, loaded)
    over = [
        v
        for v, view in views.items()
        if set(view.plan.base_tables()) == set(names) and not v.startswith(HIDDEN_PREFIX)
    ]
    note = f"computed over {limit - budget} rows read"
    if over:
        note += f"; materialized view {', '.join(sorted(over))} reads the same tables"
    return columns, rows, ts, note


def _view_columns(state: ViewState) -> list[tuple[str, str]]:
    """A view's output columns and their duckdb types, from its compiled plan."""
    types = dict(zip([g.name for g in state.plan.group_by], state.group_types, strict=True))
    types.update(zip([a.name for a in state.plan.aggregates], state.result_types, strict=True))
    types.update((d.name, ColumnType.parse(d.type)) for d in state.plan.derived)
    return [(c, types[c].duckdb()) for c in state.plan.output]


def _typed(schema: TableSchema, data: bytes) -> tuple[Any, ...]:
    raw = decode_row(data) or {}
    return tuple(
        None if raw.get(c.name) is None else from_storage(c.type, raw[c.name])
        for c in schema.columns
    )


def _named(statement: exp.Select) -> exp.Select:
    """The query with each unnamed aggregate of its result named by its function, as SQL
    engines name it: ``COUNT(*)`` is ``count``, not duckdb's ``count_star()`` (unless that
    name is taken in the result)."""
    named = statement.copy()
    taken = {e.alias_or_name for e in named.expressions}
    for item in named.expressions:
        if isinstance(item, exp.AggFunc) and item.key not in taken:
            taken.add(item.key)
            item.replace(exp.alias_(item.copy(), item.key))
    return named


def _execute(
    statement: exp.Select, loaded: dict[str, tuple[list[tuple[str, str]], list[tuple[Any, ...]]]]
) -> tuple[list[str], list[tuple[Any, ...]]]:
    import duckdb  # here: a tenth of a second of every member's start, for the rare ad-hoc query

    con = duckdb.connect(config={"enable_external_access": False})
    try:
        for name, (columns, rows) in loaded.items():
            declared = ", ".join(f'"{c}" {t}' for c, t in columns)
            con.execute(f'CREATE TABLE "{name}" ({declared})')
            if rows:
                load_rows(con, name, rows)
        con.execute("SET lock_configuration = true")
        try:
            result = con.execute(_named(statement).sql(dialect="duckdb"))
        except duckdb.Error as exc:
            raise errors.InvalidArgument(f"cannot run this query: {exc}") from None
        columns = [d[0] for d in result.description or []]
        return columns, result.fetchall()
    finally:
        con.close()


_LOADING = "aggview rows being loaded"  # a name no table of ours has (a space in it)


def load_rows(
    con: Any, name: str, rows: Sequence[Sequence[Any]], columns: Sequence[str] = ()
) -> None:
    """The rows into duckdb table ``name`` (into its ``columns``, when given) a column at a
    time, through Arrow (duckdb's executemany binds them a row at a time: 6.1 s for 8,000
    rows of three columns, Arrow 14 ms), cast to the declared types by the INSERT; a row at a
    time where Arrow cannot hold a value (an integer past 64 bits, a decimal past 38 digits),
    so the error, if any, is duckdb's as before. The server's ad-hoc queries and the tests'
    duckdb oracles load their rows here."""
    import pyarrow as pa

    into = f'"{name}"'
    if columns:
        into += " (" + ", ".join(f'"{c}"' for c in columns) + ")"
    try:
        values = zip(*rows, strict=True)
        table = pa.table({f"c{i}": pa.array(column) for i, column in enumerate(values)})
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        marks = ", ".join("?" for _ in rows[0])
        con.executemany(f"INSERT INTO {into} VALUES ({marks})", rows)
        return
    con.register(_LOADING, table)
    try:
        con.execute(f'INSERT INTO {into} SELECT * FROM "{_LOADING}"')
    finally:
        con.unregister(_LOADING)
