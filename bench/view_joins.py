"""Cost per update of the view language's multi-table constructs (issue #41), in each mode
that takes them: for one example view per construct over two tables ``a`` and ``b`` (``--rows``
rows in all, half each; join keys shared by about ten rows),

* which modes accept it (sync and async compile it with the refresh operator, cumulus and
  ``aggview m3`` to an M3 program) and the M3 program's size (maps, statements);
* the refresh operator's microseconds per update (what a sync view adds to a writing
  transaction, an async refresh per change): ``cumulus.cascade`` over in-memory tables with an
  index per join column, hidden views (subqueries) maintained first as on a cluster;
* the M3 interpreter's microseconds per update (the work a Cumulus runtime distributes);
* duckdb recomputing the view from scratch over the same rows, what a view without
  incremental maintenance pays per read (or per refresh).

An update is a row of ``a`` or ``b`` replaced by another (a delete and an insert: it may move
between join keys and groups). Both incremental paths end equal to duckdb's recomputation, or
the run stops. No server runs: this is the computation alone, on one core.

    python -m bench.view_joins                       # 10^4 rows
    python -m bench.view_joins --rows 1000000 --only "inner join" EXISTS
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import random
import tempfile
import time
from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import Any

import duckdb
import sqlglot

from aggview import errors
from aggview.merge import combine
from aggview.schema import ColumnType, TableSchema, from_storage, row_to_storage
from bench.m3 import MemoryTables
from coordinator.catalog import table_from_create
from cumulus.aggstate import Row, ViewState
from cumulus.cascade import cascade
from cumulus.compiler import compile_sql_views
from cumulus.delta import Changes
from cumulus.m3.compiler import compile_program, plan_of
from cumulus.m3.interpreter import Interpreter
from cumulus.plan import ViewPlan
from cumulus.view_rows import row_schema, rows_id, view_rows, with_views

DDL = {
    "a": "CREATE TABLE a (id INT PRIMARY KEY, k INT, g TEXT, v DECIMAL(8,2) NOT NULL)",
    "b": "CREATE TABLE b (id INT PRIMARY KEY, k INT, w DECIMAL(8,2) NOT NULL)",
}
TABLES = {name: table_from_create(sqlglot.parse_one(sql), lambda n: n) for name, sql in DDL.items()}
JOIN = "FROM a JOIN b ON a.k = b.k"
VIEWS = {
    "inner join": f"SELECT a.g, SUM(b.w) AS s, COUNT(*) AS n {JOIN} GROUP BY a.g",
    "MIN, MAX, COUNT(DISTINCT)": (
        f"SELECT a.g, MIN(b.w) AS lo, MAX(b.w) AS hi, COUNT(DISTINCT b.k) AS d {JOIN} GROUP BY a.g"
    ),
    "HAVING": f"SELECT a.g, SUM(b.w) AS s {JOIN} GROUP BY a.g HAVING COUNT(*) > 100",
    "SUM / COUNT": f"SELECT a.g, SUM(b.w) / COUNT(*) AS r {JOIN} GROUP BY a.g",
    "DISTINCT": f"SELECT DISTINCT a.g, b.k {JOIN}",
    "bag (no aggregate)": f"SELECT a.g, b.w {JOIN} WHERE a.v > 3",
    "theta join": "SELECT a.g, COUNT(*) AS n FROM a JOIN b ON a.k = b.k AND a.v < b.w GROUP BY a.g",
    "LEFT JOIN": (
        "SELECT a.g, COUNT(b.w) AS m, COUNT(*) AS n FROM a LEFT JOIN b ON a.k = b.k GROUP BY a.g"
    ),
    "FULL JOIN": "SELECT a.g, COUNT(*) AS n FROM a FULL JOIN b ON a.k = b.k GROUP BY a.g",
    "EXISTS": (
        "SELECT a.g, COUNT(*) AS n FROM a WHERE EXISTS (SELECT 1 FROM b WHERE b.k = a.k) "
        "GROUP BY a.g"
    ),
    "NOT EXISTS": (
        "SELECT a.g, COUNT(*) AS n FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k) "
        "GROUP BY a.g"
    ),
    "IN (SELECT ...)": (
        "SELECT a.g, SUM(a.v) AS s FROM a WHERE a.k IN (SELECT b.k FROM b WHERE b.w > 0) "
        "GROUP BY a.g"
    ),
    "scalar subquery": (
        "SELECT a.g, COUNT(*) AS n FROM a WHERE a.v > (SELECT AVG(b.w) FROM b) GROUP BY a.g"
    ),
    "correlated subquery": (
        "SELECT a.g, COUNT(*) AS n FROM a "
        "WHERE a.v > (SELECT AVG(b.w) FROM b WHERE b.k = a.k) GROUP BY a.g"
    ),
    "subquery in FROM": (
        "SELECT t.g, SUM(t.w) AS s FROM (SELECT a.g, b.w FROM a JOIN b ON a.k = b.k) t GROUP BY t.g"
    ),
    "UNION ALL": (
        "SELECT k, SUM(v) AS s, COUNT(*) AS n FROM (SELECT a.k, a.v FROM a UNION ALL "
        "SELECT b.k, b.w AS v FROM b) u GROUP BY k"
    ),
}
GROUPS = 20


class Memory:
    """The base tables (``bench.m3.MemoryTables``) and each view's stored groups: what
    ``rows_where`` and a group read get from LTMs, here from memory, so the refresh operator's
    cost is its own."""

    def __init__(self, plans: list[ViewPlan], relation: Callable[[str], TableSchema]) -> None:
        self.plans = {p.name: p for p in plans}
        self.states = {p.name: ViewState(p, relation) for p in plans}
        self.groups: dict[str, dict[bytes, Row]] = {p.name: {} for p in plans}
        self.tables = MemoryTables(TABLES, plans)
        self.inner = {t for p in plans for t in p.base_tables() if t in self.plans}
        self.loop = asyncio.new_event_loop()  # one for the run: a loop per update costs more

    async def read(self, name: str, prefixes: list[bytes] | None) -> dict[bytes, Row]:
        groups = self.groups[name]
        if prefixes is None:
            return dict(groups)
        found = {p: groups[p] for p in prefixes if p in groups}  # whole keys: a lookup
        for prefix in (p for p in prefixes if p not in groups):
            found |= {k: s for k, s in groups.items() if k.startswith(prefix)}
        return found

    def apply(self, table: str, before: Row | None, after: Row | None) -> None:
        """One change of one row: a transaction of its own."""
        self.apply_batch(table, [(before, after)])

    def apply_batch(self, table: str, rows: list[tuple[Row | None, Row | None]]) -> None:
        """Changes of rows of one table as one batch (a whole table at once: its initial
        computation, as a view over existing rows starts)."""
        batch: dict[bytes, tuple[Row | None, Row | None]] = {}
        for before, after in rows:
            some = before if before is not None else after
            assert some is not None
            batch[self.tables.key(table, some)] = (before, after)
        changes: Changes = {table: batch}
        rows_where = with_views(self.tables.rows_where, self.states, self.read)
        deltas, _ = self.loop.run_until_complete(
            cascade(self.states.values(), changes, rows_where, self.read, self.inner)
        )
        for name, delta in deltas.items():
            groups = self.groups[name]
            for group, d in delta.items():
                groups[group] = combine(groups.get(group, {}), d)
        for key, (before, after) in batch.items():
            self.tables.put(table, key, before, after)

    def view(self, name: str) -> list[tuple[Any, ...]]:
        state = self.states[name]
        out = []
        for row in view_rows(state, self.groups[name]).values():
            values = []
            for column in state.plan.output:
                value = row[column]
                ctype = state.plan.column_type(column)
                values.append(
                    None if value is None else from_storage(ColumnType.parse(ctype), value)
                )
            out += [tuple(values)] * row["__count"]
        return out


def _row(rng: random.Random, table: str, row_id: int, keys: int) -> dict[str, Any]:
    k = rng.randrange(keys) if rng.random() > 0.02 else None
    if table == "a":
        v = Decimal(rng.randrange(-500, 1000)) / 100
        return {"id": row_id, "k": k, "g": f"g{rng.randrange(GROUPS)}", "v": v}
    return {"id": row_id, "k": k, "w": Decimal(rng.randrange(-500, 1000)) / 100}


def _copy_into(con: duckdb.DuckDBPyConnection, table: str, rows: Iterable[dict[str, Any]]) -> None:
    """Rows into duckdb by a CSV file and COPY (an empty field is NULL; no text here is
    empty): an INSERT per row took 90 % of a run at 10^5 rows."""
    columns = [c.name for c in TABLES[table].columns]
    with tempfile.NamedTemporaryFile("w", suffix=".csv", newline="") as file:
        writer = csv.writer(file)
        writer.writerows([("" if r[c] is None else r[c]) for c in columns] for r in rows)
        file.flush()
        con.execute(f"COPY {table} FROM '{file.name}' (HEADER false)")


def _rounded(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Rows compared across engines: numbers to 6 places (duckdb's AVG and division are
    doubles), NULLs first."""

    def norm(value: Any) -> Any:
        if isinstance(value, Decimal | float):
            return round(float(value), 6)
        return value

    return sorted((tuple(norm(v) for v in row) for row in rows), key=repr)


def measure(name: str, sql: str, rows: int, updates: int, seed: int = 7) -> dict[str, Any]:
    """One construct: what accepts it, its M3 size, µs per update of each path, duckdb's
    µs per recomputation; both paths checked against duckdb at the end."""
    relation_of: dict[str, TableSchema] = dict(TABLES)
    out: dict[str, Any] = {"construct": name}
    try:
        plans = compile_sql_views(f"CREATE MATERIALIZED VIEW q AS {sql}", relation_of.__getitem__)
    except errors.AggviewError as exc:
        plans, out["refresh"] = [], f"refused: {str(exc)[:60]}"
    numbers = {p.name: i for i, p in enumerate(plans)}
    by_name = {p.name: p for p in plans}

    def relation(table: str) -> TableSchema:
        if table in by_name:
            return row_schema(by_name[table], rows_id(numbers[table], table))
        return TABLES[table]

    interp, read = None, set(TABLES)
    try:
        plan = plan_of(sql, "q", TABLES.__getitem__)
        program = compile_program([plan], TABLES.__getitem__)
        interp, read = Interpreter(program), set(plan.base_tables())
        out["maps"] = len(program.maps)
        out["statements"] = sum(len(t.statements) for t in program.triggers)
    except errors.AggviewError as exc:
        out["m3"] = f"refused: {str(exc)[:60]}"
    memory = Memory(plans, relation) if plans else None
    rng = random.Random(seed)
    keys = max(rows // 10, 1)
    table_rows = {t: {i: _row(rng, t, i, keys) for i in range(rows // 2)} for t in TABLES}
    for t, found in table_rows.items():
        if interp is not None and t in read:
            for values in found.values():
                interp.insert(t, values)
        if memory is not None:  # each table's rows as one batch: the initial computation
            memory.apply_batch(t, [(None, row_to_storage(TABLES[t], v)) for v in found.values()])
    stream = []
    for _ in range(updates):
        t = rng.choice(list(TABLES))
        old = table_rows[t][rng.randrange(rows // 2)]
        new = _row(rng, t, old["id"], keys)
        table_rows[t][old["id"]] = new
        stream.append((t, old, new))
    if interp is not None:
        started = time.perf_counter()
        for t, old, new in stream:
            if t in read:  # a table the view does not read: nothing to do
                interp.update(t, old, new)
        out["m3_us"] = (time.perf_counter() - started) / updates * 1e6
    if memory is not None:
        stored = [
            (t, row_to_storage(TABLES[t], old), row_to_storage(TABLES[t], new))
            for t, old, new in stream
        ]
        started = time.perf_counter()
        for t, before, after in stored:
            memory.apply(t, before, after)
        out["refresh_us"] = (time.perf_counter() - started) / updates * 1e6
    con = duckdb.connect()
    for t, ddl in DDL.items():
        con.execute(ddl)
        _copy_into(con, t, table_rows[t].values())
    query = sqlglot.parse_one(sql).sql(dialect="duckdb")
    expected = _rounded(con.execute(query).fetchall())
    runs = 5
    started = time.perf_counter()
    for _ in range(runs):
        con.execute(query).fetchall()
    out["duckdb_us"] = (time.perf_counter() - started) / runs * 1e6
    if interp is not None:
        got = [tuple(r.values()) for r in interp.view("q")]
        if _rounded(got) != expected:
            raise SystemExit(f"{name}: the M3 interpreter's view differs from duckdb's")
    if memory is not None:
        if _rounded(memory.view("q")) != expected:
            raise SystemExit(f"{name}: the refresh operator's view differs from duckdb's")
    return out


def _cell(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, float) else str(value)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.view_joins", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--updates", type=int, default=1_000)
    parser.add_argument("--only", nargs="+", default=[], help="these constructs (by name)")
    args = parser.parse_args(argv)
    chosen = {n: s for n, s in VIEWS.items() if not args.only or n in args.only}
    print(f"{args.rows:,} rows (half in a, half in b), {args.updates:,} updates of one row each")
    header = ["construct", "sync/async", "cumulus", "maps", "stmts"]
    header += ["refresh µs", "M3 µs", "duckdb µs"]
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for name, sql in chosen.items():
        r = measure(name, sql, args.rows, args.updates)
        cells = [
            name,
            "yes" if "refresh_us" in r else r.get("refresh", "-"),
            "yes" if "m3_us" in r else r.get("m3", "-"),
            _cell(r.get("maps")),
            _cell(r.get("statements")),
            _cell(r.get("refresh_us")),
            _cell(r.get("m3_us")),
            _cell(r.get("duckdb_us"), 0),
        ]
        print(" | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
