"""Nested aggregates in Cumulus (M3): the program's size and the cost of an update.

Views over r(id, k, x) and s(id, k, y) at 10^4 rows each: a Q17-like correlated AVG over
the view's own table, and an uncorrelated AVG of another table. Each is loaded, then fed a
stream of inserts and deletes (half on each table the view reads) through the reference
interpreter (generated code, one core); the same view recomputed by duckdb from scratch is the
comparison. Run once for docs/DECISIONS.md:

    PYTHONPATH=. python -m bench.cumulus_nested [--small] [a view's name, or part of it, ...]

Also NOT IN (correlated and not), a Q21-like EXISTS and NOT EXISTS correlated by ``<>``,
subqueries over a join (a write re-deriving one key's domain, or all of it), a view grouped by
a per-row count (Q13-like), HAVING against an uncorrelated total (Q11-like) and the top group
of a grouped subquery (Q15-like), IN over a subquery with a correlated SUM (Q20-like).
"""

from __future__ import annotations

import random
import sys
import time
from typing import Any

import duckdb

from aggview.schema import Column, ColumnType, TableSchema
from coordinator.adhoc import load_rows
from cumulus.m3.compiler import compile_program, plan_of
from cumulus.m3.interpreter import Interpreter

INT = ColumnType.parse("INT")
ROWS = 10_000
UPDATES = 2_000
GROUPS = 1_000  # k in 0..999: ten rows per group
VIEWS = {
    "correlated (Q17-like)": "SELECT SUM(r.x) AS t, COUNT(*) AS n FROM r "
    "WHERE 5 * r.x < (SELECT AVG(r2.x) FROM r r2 WHERE r2.k = r.k)",
    "uncorrelated": "SELECT r.k, SUM(r.x) AS t FROM r WHERE r.x > (SELECT AVG(s.y) FROM s) "
    "GROUP BY r.k",
    "NOT IN, correlated": "SELECT r.k, COUNT(*) AS n FROM r "
    "WHERE r.x NOT IN (SELECT s.y FROM s WHERE s.k = r.k) GROUP BY r.k",
    "NOT IN, uncorrelated": "SELECT r.k, COUNT(*) AS n FROM r "
    "WHERE r.x NOT IN (SELECT s.y FROM s WHERE s.k < 10) GROUP BY r.k",
    "EXISTS and NOT EXISTS by <> (Q21-like)": "SELECT r.k, COUNT(*) AS n FROM r "
    "WHERE EXISTS (SELECT 1 FROM s WHERE s.k = r.k AND s.y <> r.x) AND NOT EXISTS "
    "(SELECT 1 FROM s s2 WHERE s2.k = r.k AND s2.y <> r.x AND s2.y > 90) GROUP BY r.k",
    "EXISTS over a join, each write at its key": "SELECT r.k, COUNT(*) AS n FROM r "
    "WHERE EXISTS (SELECT 1 FROM s JOIN r r2 ON s.k = r2.k WHERE s.k = r.k AND r2.x > 90) "
    "GROUP BY r.k",
    "MIN over a join, r's writes a slice": "SELECT r.k, COUNT(*) AS n FROM r "
    "WHERE r.x >= (SELECT MIN(s.y) FROM s JOIN r r2 ON s.id = r2.id WHERE r2.k = r.k) "
    "GROUP BY r.k",
    "SUM over a join, s's writes everywhere": "SELECT r.k, COUNT(*) AS n FROM r "
    "WHERE r.x < (SELECT SUM(s.y) FROM s JOIN r r2 ON s.id = r2.id WHERE r2.k = r.k) "
    "GROUP BY r.k",
    # grouped by a nested value (Q13-like: s's rows per r.k, pre-aggregated, as group keys)
    "grouped by a per-row count (Q13-like)": "SELECT d.n, COUNT(*) AS c FROM (SELECT r.id, "
    "COUNT(s.y) AS n FROM r LEFT JOIN s ON r.k = s.k AND s.y > 10 GROUP BY r.id) d GROUP BY d.n",
    # HAVING against an uncorrelated total (Q11-like): keyless maps, compared when read
    "HAVING against a total (Q11-like)": "SELECT r.k, SUM(r.x) AS t FROM r GROUP BY r.k "
    "HAVING SUM(r.x) * 2000 > (SELECT SUM(s.y) FROM s)",
    # the top group of a grouped subquery (Q15-like; u is s with k NOT NULL): its MAX read at
    # each row of u by its key, compared with the view's rows when read
    "the top of a grouped subquery (Q15-like)": "SELECT r.id, g.t FROM r JOIN (SELECT u.k, "
    "SUM(u.y) AS t FROM u GROUP BY u.k) g ON r.k = g.k WHERE g.t = (SELECT MAX(m.t) FROM "
    "(SELECT u.k, SUM(u.y) AS t FROM u GROUP BY u.k) m)",
    # IN over a subquery with a correlated SUM (Q20-like): the IN's rows joined, the view
    # grouped by r's key (a row of r once while any row of s qualifies)
    "IN over a subquery with a SUM (Q20-like)": "SELECT r.id, r.x FROM r WHERE r.k IN "
    "(SELECT s.k FROM s WHERE s.y * 10 > (SELECT SUM(r2.x) FROM r r2 WHERE r2.k = s.id))",
}


def _table(name: str, value: str, k_nullable: bool = True) -> TableSchema:
    columns = (Column("id", INT, False), Column("k", INT, k_nullable), Column(value, INT))
    return TableSchema(name, name, columns, ("id",))


TABLES = {"r": _table("r", "x"), "s": _table("s", "y"), "u": _table("u", "y", False)}


def _row(rng: random.Random, row_id: int) -> tuple[int, int, int]:
    return (row_id, rng.randrange(GROUPS), rng.randrange(100))


def measure(name: str, select: str) -> dict[str, Any]:
    program = compile_program([plan_of(select, "v", TABLES.__getitem__)], TABLES.__getitem__)
    read = [s.name for s in program.sources]
    rng = random.Random(1)
    interp = Interpreter(program)
    con = duckdb.connect()
    live: dict[str, dict[int, tuple[int, int, int]]] = {}
    for table in read:
        con.execute(f"CREATE TABLE {table} (id INT, k INT, {TABLES[table].columns[2].name} INT)")
        rows = [_row(rng, i) for i in range(ROWS)]
        live[table] = {r[0]: r for r in rows}
        load_rows(con, table, rows)
        for row in rows:
            interp.insert(table, row)
    stream = []
    next_id = ROWS
    for i in range(UPDATES):
        table = read[i % len(read)]
        if i % 2 == 0:
            row = _row(rng, next_id)
            next_id += 1
            live[table][row[0]] = row
            stream.append(("+", table, row))
        else:
            row = live[table].pop(rng.choice(list(live[table])))
            stream.append(("-", table, row))
    per_table: dict[str, list[float]] = {t: [] for t in read}
    for sign, table, row in stream:
        began = time.perf_counter()
        interp.apply(sign, table, row)
        per_table[table].append(time.perf_counter() - began)
    began = time.perf_counter()
    interp.view("v")
    read = time.perf_counter() - began
    began = time.perf_counter()
    for _ in range(20):
        con.execute(select).fetchall()
    duck = (time.perf_counter() - began) / 20
    statements = sum(len(t.statements) for t in program.triggers)
    return {
        "view": name,
        "maps": len(program.maps),
        "statements": statements,
        **{f"us per update of {t}": round(1e6 * sum(v) / len(v), 1) for t, v in per_table.items()},
        "read ms": round(1e3 * read, 2),
        "duckdb recomputation ms": round(1e3 * duck, 2),
    }


if __name__ == "__main__":
    wanted = sys.argv[1:]  # names (or parts of them) to run; all by default
    if "--small" in wanted:  # 10^3 rows a table in 100 groups, 200 updates: the whole-domain
        wanted.remove("--small")  # views' loads (every write of s re-derives all) end soon
        ROWS, GROUPS, UPDATES = 1_000, 100, 200
    for view, sql in VIEWS.items():
        if not wanted or any(w in view for w in wanted):
            print(measure(view, sql))
