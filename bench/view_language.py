"""Cost per update of the view language's constructs (issue #41): for one example view per
construct, the microseconds the M3 interpreter spends per base-table update (an insert, or a
delete and an insert for an update) against duckdb recomputing the view from scratch over the
same 10^4 rows.

    python -m bench.view_language [--rows 10000] [--updates 2000]
"""

from __future__ import annotations

import argparse
import random
import time
from decimal import Decimal
from typing import Any

import duckdb
import sqlglot

from coordinator.adhoc import load_rows
from coordinator.catalog import table_from_create
from cumulus.m3.compiler import compile_program, plan_of
from cumulus.m3.interpreter import Interpreter

DDL = "CREATE TABLE t (id INT PRIMARY KEY, k INT, g TEXT, v DECIMAL(8,2) NOT NULL, x INT)"
SCHEMA = table_from_create(sqlglot.parse_one(DDL), lambda name: name)
VIEWS = {
    "baseline (comparison)": "SELECT g, SUM(v) FROM t WHERE x > 2 GROUP BY g",
    "OR": "SELECT g, SUM(v) FROM t WHERE x > 2 OR g = 'a' GROUP BY g",
    "IN (list, NULL)": "SELECT g, SUM(v) FROM t WHERE x IN (1, 2, NULL) GROUP BY g",
    "NOT IN": "SELECT g, SUM(v) FROM t WHERE x NOT IN (1, 2) GROUP BY g",
    "BETWEEN": "SELECT g, SUM(v) FROM t WHERE x BETWEEN 1 AND 3 GROUP BY g",
    "LIKE": "SELECT g, SUM(v) FROM t WHERE g LIKE 'a%' OR g LIKE '_b' GROUP BY g",
    "CASE in SUM": "SELECT g, SUM(CASE WHEN x > 2 THEN v ELSE 0 END) FROM t GROUP BY g",
    "COALESCE in SUM": "SELECT g, SUM(COALESCE(x, k, 0)) FROM t GROUP BY g",
    "GROUP BY CASE": (
        "SELECT CASE WHEN x > 2 THEN 'hi' ELSE g END AS b, COUNT(*) FROM t GROUP BY b"
    ),
    "SUM(a) / SUM(b)": "SELECT g, SUM(v) / SUM(k) AS r FROM t GROUP BY g",
    "SUM(x) - 5 * COUNT(*)": "SELECT g, SUM(x) - 5 * COUNT(*) AS d FROM t GROUP BY g",
    "CASE over aggregates": (
        "SELECT g, CASE WHEN COUNT(*) > 0 THEN SUM(v) / COUNT(*) END AS m FROM t GROUP BY g"
    ),
}
GROUPS = ["a", "ab", "b", "cb", "c", None]


def row(rng: random.Random, row_id: int) -> dict[str, Any]:
    return {
        "id": row_id,
        "k": rng.choice([None, *range(5)]),
        "g": rng.choice(GROUPS),
        "v": Decimal(rng.randrange(-400, 400)) / 100,
        "x": rng.choice([None, *range(6)]),
    }


def measure(sql: str, rows: int, updates: int, seed: int = 7) -> tuple[float, float]:
    """(µs per update in the M3 interpreter, µs per duckdb recomputation from scratch)."""
    schemas = {"t": SCHEMA}
    program = compile_program([plan_of(sql, "q", schemas.__getitem__)], schemas.__getitem__)
    interp = Interpreter(program)
    rng = random.Random(seed)
    table = {i: row(rng, i) for i in range(rows)}
    for values in table.values():
        interp.insert("t", values)
    changes = []
    for _ in range(updates):
        old = table[rng.randrange(rows)]
        new = {**row(rng, old["id"])}
        table[old["id"]] = new
        changes.append((old, new))
    start = time.perf_counter()
    for old, new in changes:
        interp.update("t", old, new)
    interp.view("q")
    m3_us = (time.perf_counter() - start) / updates * 1e6
    con = duckdb.connect()
    con.execute(DDL)
    load_rows(con, "t", [[r[c] for c in ("id", "k", "g", "v", "x")] for r in table.values()])
    query = sqlglot.parse_one(sql).sql(dialect="duckdb")
    con.execute(query).fetchall()  # warm
    runs = 20
    start = time.perf_counter()
    for _ in range(runs):
        con.execute(query).fetchall()
    return m3_us, (time.perf_counter() - start) / runs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--updates", type=int, default=2_000)
    args = parser.parse_args()
    print(f"{args.rows} rows, {args.updates} updates (a delete and an insert each)")
    print(f"{'construct':26} {'M3 µs/update':>13} {'duckdb µs/recompute':>20}")
    measure(VIEWS["baseline (comparison)"], args.rows, args.updates // 4)  # warm up
    for name, sql in VIEWS.items():
        m3_us, duck_us = measure(sql, args.rows, args.updates)
        print(f"{name:26} {m3_us:13.1f} {duck_us:20.0f}")


if __name__ == "__main__":
    main()
