"""A LEFT JOIN in Cumulus (M3): the program's size and the cost of an update.

``SELECT a.g, COUNT(*) AS n, SUM(b.w) AS s FROM a LEFT JOIN b ON a.k = b.k GROUP BY a.g`` over
a(id, k, g) and b(id, k, w) at 10^4 rows each (k in 0..9999: about a third of a's rows
match no row of b; g in 100 groups), fed 2,000 inserts and deletes (half on each table)
through the reference interpreter (generated code, one core); duckdb recomputing the view
from scratch is the comparison. Run once for docs/DECISIONS.md:

    PYTHONPATH=. python -m bench.cumulus_outer
"""

from __future__ import annotations

import random

from aggview.schema import Column, ColumnType, TableSchema
from bench import cumulus_nested

INT = ColumnType.parse("INT")
SELECT = "SELECT a.g, COUNT(*) AS n, SUM(b.w) AS s FROM a LEFT JOIN b ON a.k = b.k GROUP BY a.g"


def _table(name: str, value: str) -> TableSchema:
    columns = (Column("id", INT, False), Column("k", INT), Column(value, INT))
    return TableSchema(name, name, columns, ("id",))


def _row(rng: random.Random, row_id: int) -> tuple[int, int, int]:
    """One key per row on average (e^-1 of a's rows unmatched), g in 100 groups."""
    return (row_id, rng.randrange(10_000), rng.randrange(100))


if __name__ == "__main__":
    cumulus_nested.TABLES.clear()
    cumulus_nested.TABLES.update({"a": _table("a", "g"), "b": _table("b", "w")})
    cumulus_nested._row = _row  # (its loading and stream, over these tables)
    print(cumulus_nested.measure("LEFT JOIN", SELECT))
