"""``cumulus.passes.preaggregate``: a per-row aggregate of a LEFT JOIN in FROM becomes a LEFT
JOIN lookup of the pre-aggregated table, in refresh = 'cumulus' and ``aggview m3``; sync and
async keep the hidden views. What the views mean is checked against duckdb in
``test_cumulus_subqueries`` (its ``per-row`` shapes: after every update, random streams, the
runtime at every epoch) and ``test_tpch_shapes`` (Q13 as TPC-H writes it, on a cluster too)."""

from __future__ import annotations

import pytest
import sqlglot
from test_cumulus_subqueries import TABLES

from cumulus.compiler import compile_sql_views
from cumulus.passes.preaggregate import preaggregate_left_join

Q13_LIKE = (
    "SELECT d.n, COUNT(*) AS c FROM (SELECT r.id, COUNT(s.y) AS n FROM r LEFT OUTER JOIN s "
    "ON r.k = s.k AND s.y > 1 GROUP BY r.id) d GROUP BY d.n"
)


def _rewritten(select: str) -> str:
    parsed = sqlglot.parse_one(select)
    return preaggregate_left_join(parsed, TABLES.__getitem__).sql()  # type: ignore[arg-type]


def test_the_joined_table_is_pre_aggregated_at_the_join_key() -> None:
    assert _rewritten(Q13_LIKE) == (
        'SELECT COALESCE("d_s"."n", 0) AS "n", COUNT(*) AS c FROM r LEFT JOIN (SELECT s.k AS '
        '"k", COUNT(s.y) AS "n" FROM s WHERE s.y > 1 GROUP BY s.k) AS "d_s" ON r.k = "d_s"."k" '
        'GROUP BY COALESCE("d_s"."n", 0)'
    )


def test_unqualified_columns_a_where_and_other_aggregates() -> None:
    """The subquery's unqualified columns are its tables' (here each has one owner); its WHERE
    on the outer table stays the view's; SUM and MAX are read as they are (NULL where none
    matched), the outer table's grouped columns as its own."""
    select = (
        "SELECT x, SUM(t) AS t FROM (SELECT r.id, x, SUM(y) AS t, MAX(y) AS m FROM r LEFT JOIN s "
        "ON s.k = r.x WHERE r.k > 0 GROUP BY r.id, x) d WHERE m IS NULL OR m < 3 GROUP BY x"
    )
    assert _rewritten(select) == (
        'SELECT "r".x AS "x", SUM("d_s"."t") AS t FROM r LEFT JOIN (SELECT s.k AS "k", '
        'SUM("s".y) AS "t", MAX("s".y) AS "m" FROM s GROUP BY s.k) AS "d_s" ON r.x = "d_s"."k" '
        'WHERE r.k > 0 AND ("d_s"."m" IS NULL OR "d_s"."m" < 3) GROUP BY "r".x'
    )


@pytest.mark.parametrize(
    "select",
    [
        # COUNT(*) counts an unmatched row as 1
        "SELECT n, COUNT(*) AS c FROM (SELECT r.id, COUNT(*) AS n FROM r LEFT JOIN s "
        "ON r.k = s.k GROUP BY r.id) d GROUP BY n",
        # grouped by less than the outer table's key: a group is many of its rows
        "SELECT n, COUNT(*) AS c FROM (SELECT r.k, COUNT(s.y) AS n FROM r LEFT JOIN s "
        "ON r.k = s.k GROUP BY r.k) d GROUP BY n",
        # a WHERE on the joined table drops the unmatched rows
        "SELECT n, COUNT(*) AS c FROM (SELECT r.id, COUNT(s.y) AS n FROM r LEFT JOIN s "
        "ON r.k = s.k WHERE s.y > 0 GROUP BY r.id) d GROUP BY n",
        # an ON condition across both tables other than an equality
        "SELECT n, COUNT(*) AS c FROM (SELECT r.id, COUNT(s.y) AS n FROM r LEFT JOIN s "
        "ON r.k = s.k AND s.y < r.x GROUP BY r.id) d GROUP BY n",
        # no equality at all
        "SELECT n, COUNT(*) AS c FROM (SELECT r.id, COUNT(s.y) AS n FROM r LEFT JOIN s "
        "ON s.y > 1 GROUP BY r.id) d GROUP BY n",
        # DISTINCT, an aggregate of the outer table, an inner join, HAVING
        "SELECT n, COUNT(*) AS c FROM (SELECT r.id, COUNT(DISTINCT s.y) AS n FROM r "
        "LEFT JOIN s ON r.k = s.k GROUP BY r.id) d GROUP BY n",
        "SELECT n, COUNT(*) AS c FROM (SELECT r.id, SUM(r.x + s.y) AS n FROM r LEFT JOIN s "
        "ON r.k = s.k GROUP BY r.id) d GROUP BY n",
        "SELECT n, COUNT(*) AS c FROM (SELECT r.id, COUNT(s.y) AS n FROM r JOIN s "
        "ON r.k = s.k GROUP BY r.id) d GROUP BY n",
        "SELECT n, COUNT(*) AS c FROM (SELECT r.id, COUNT(s.y) AS n FROM r LEFT JOIN s "
        "ON r.k = s.k GROUP BY r.id HAVING COUNT(s.y) > 1) d GROUP BY n",
        # the view joins the subquery with another table
        "SELECT d.n, COUNT(*) AS c FROM (SELECT r.id, COUNT(s.y) AS n FROM r LEFT JOIN s "
        "ON r.k = s.k GROUP BY r.id) d JOIN s s2 ON s2.id = d.id GROUP BY d.n",
        # a column of the joined table shown: not one value per row of the outer table
        "SELECT n, COUNT(*) AS c FROM (SELECT r.id, s.k, COUNT(s.y) AS n FROM r LEFT JOIN s "
        "ON r.k = s.k GROUP BY r.id, s.k) d GROUP BY n",
    ],
)
def test_other_shapes_are_left_as_they_are(select: str) -> None:
    parsed = sqlglot.parse_one(select)
    assert preaggregate_left_join(parsed, TABLES.__getitem__).sql() == parsed.sql()  # type: ignore[arg-type]


def test_only_cumulus_pre_aggregates() -> None:
    """Sync and async keep the subquery a hidden view (its own LEFT JOIN, with the ON's filter
    of s a hidden view of its own); cumulus has one nested aggregate, the pre-aggregated
    table, in its plan."""
    sync = compile_sql_views(f"CREATE MATERIALIZED VIEW v AS {Q13_LIKE}", TABLES.__getitem__)
    assert [[t.table for t in p.tables] for p in sync] == [["s"], ["r", "__sub_v_2"], ["__sub_v_1"]]
    (cumulus,) = compile_sql_views(
        f"CREATE MATERIALIZED VIEW v WITH (refresh = 'cumulus') AS {Q13_LIKE}", TABLES.__getitem__
    )
    assert [t.table for t in cumulus.tables][0] == "r"
    (nested,) = cumulus.nested
    assert [t.table for t in nested.tables] == ["s"] and [g.name for g in nested.group_by] == ["k"]
