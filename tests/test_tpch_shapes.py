"""TPC-H's 22 queries as incremental views (issue #41): our own formulations of what each query
computes, over ``tpch_data``'s small schema and random streams of changes, against duckdb's
recomputation of the same SQL.

Each query is written as TPC-H states it, less what a view has no use for: no ORDER BY or
LIMIT (a view is the whole grouped result), DATE literals, constants scaled to a few rows
(Q11's fraction, Q18's quantity). EXTRACT(YEAR FROM ...) (Q7, Q8, Q9) and SUBSTRING(c_phone
FROM 1 FOR 2) (Q22) are TPC-H's own since the view language takes them (2026-12-02; before,
columns ``o_orderyear``, ``l_shipyear`` and ``c_cntrycode`` of the schema stood for them).
Where the view language refuses that SQL, the refusal is tested word for word and a rewrite
that keeps the query's idea is maintained instead.

* sync: the refresh operator (``test_subqueries.Stack``: views over views in memory) over an
  initial load with children before parents and then batches of inserts, deletes and updates,
  equals duckdb after every batch;
* cumulus: the query's M3 program at depths 0, 1, 2 and unbounded (the interpreter), one
  change at a time, equals duckdb after every change, and every map its definition at the end;
* Q1, Q3, Q5, Q10, Q11, Q13 and Q18 (hidden views in sync and async, nested aggregates in
  cumulus) on the session cluster in sync, async and cumulus mode under concurrent writers.

Which query each mode takes, as written (W) or rewritten (R), and why not:

=====  ======  ======  =======  ===================================================================
query  sync    async   cumulus  refused as written / the rewrite
=====  ======  ======  =======  ===================================================================
Q1     W       W       W
Q2     W       W       W        correlated MIN subquery over a join: a hidden view; in cumulus
                                a nested count map per (part, cost), a write of supplier, nation
                                or region its slice of partsupp's costs read into the new MIN
Q3     W       W       W
Q4     W       W       W        EXISTS correlated by an unqualified outer column (o_orderkey,
                                orders's by SQL's scoping): a hidden view; in cumulus a nested
                                COUNT(*) per order
Q5     W       W       W
Q6     W       W       W
Q7     W       W       W        (FROM subquery merged into the view; grouped by EXTRACT(YEAR ...))
Q8     W       W       W        (FROM subquery merged; a ratio of sums; grouped by EXTRACT)
Q9     W       W       W        (FROM subquery merged; grouped by EXTRACT(YEAR ...))
Q10    W       W       W
Q11    W       W       W        scalar subquery in HAVING: the groups filtered in WHERE over the
                                grouped query (hidden views); in cumulus (since 2026-12-03)
                                the total's keyless maps, compared with each group's sum
                                when the view is read
Q12    W       W       W
Q13    W       W       W        a LEFT JOIN whose ON filters orders (o_comment NOT LIKE ...):
                                a filtered derived table (hidden views); in cumulus (since
                                2026-12-03) the per-customer counts are orders pre-aggregated
                                by customer, a LEFT JOIN lookup, and the view is grouped by
                                its value (COALESCE(n, 0)): an order moves its customer's row
                                from one count's group to the next
Q14    W       W       W
Q15    W       W       W        the CTE twice and MAX over it: hidden views; in cumulus (since
                                2026-12-03) the MAX over the revenues read at each line item's
                                supplier (one nesting) and the WHERE conjunct compared with it
                                as HAVING when the view is read
Q16    W       W       W, R     NOT IN (SELECT ...), an anti-join (hidden views); in cumulus
                                count maps (its rows per value, and its rows, non-NULL ones);
                                R, cheaper in cumulus: joined with supplier, s_comment NOT LIKE
                                (the same where every partsupp has a supplier)
Q17    W       W       W        correlated 0.2 * AVG subquery (NULL over no rows): a hidden view;
                                in cumulus a nested AVG with domain maintenance
Q18    W       W       W        IN over a grouped subquery with HAVING: hidden views; in cumulus
                                nested sums under HAVING
Q19    W       W       W        (the join equality inside each OR branch is not factored out:
                                a cross product the OR filters, a scan step per change)
Q20    W       W       W        correlated 0.5 * SUM subquery, as Q17, inside IN: hidden views;
                                in cumulus (since 2026-12-03) the IN's rows joined and the
                                view grouped by supplier and nation keys: the SUM and the
                                IN over part one nesting each, where IN over them was two
Q21    W       W       W        EXISTS / NOT EXISTS correlated by l2.l_suppkey <> l1.l_suppkey:
                                suppliers per order less l1's own (hidden views); in cumulus
                                the two counts lifted per order, re-derived at that order
Q22    W       W       W        the FROM subquery merged, its WHERE's subqueries kept (since
                                2026-12-03; before, cumulus refused it as nested twice): NOT
                                EXISTS correlated by an unqualified outer column (as Q4), an
                                anti-join, and AVG above zero: hidden views in sync and async;
                                in cumulus a nested COUNT(*) per customer and the AVG lifted
=====  ======  ======  =======  ===================================================================

Async maintains the plan sync does (it only defers it), so it takes what sync takes; the
cluster tests run Q1, Q3, Q5, Q10, Q11, Q13 and Q18 in all three modes, Q15 in sync and
cumulus. Found on the way (fixed in ``passes/lift_subqueries.py``): an IN subquery with
GROUP BY ... HAVING (Q18) failed with a TypeError, and a scalar subquery over a FROM subquery
(Q15's MAX over the CTE) lifted the inner FROM subquery as a second scalar ("needs a SELECT
of one column").
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profiles import examples
from shape_suite import create, every_mode_equals_duckdb, maintain, replay
from test_m3_differential import DEPTHS
from tpch_data import TPCH

from agglauncher.cluster import LocalCluster
from aggview import errors
from cumulus.compiler import compile_sql_views

SCHEMAS = TPCH.schemas
REVENUE = "l_extendedprice * (1 - l_discount)"
GERMAN_STOCK = (
    "FROM partsupp, supplier, nation WHERE ps_suppkey = s_suppkey AND s_nationkey = n_nationkey "
    "AND n_name = 'GERMANY'"
)
CODES = "('13', '31', '23', '29', '30', '18', '17')"

# === the queries as TPC-H writes them ============================================================

WRITTEN: dict[str, str] = {
    "q1": "SELECT l_returnflag, l_linestatus, SUM(l_quantity) AS sum_qty, "
    f"SUM(l_extendedprice) AS sum_base_price, SUM({REVENUE}) AS sum_disc_price, "
    f"SUM({REVENUE} * (1 + l_tax)) AS sum_charge, AVG(l_quantity) AS avg_qty, "
    "AVG(l_extendedprice) AS avg_price, AVG(l_discount) AS avg_disc, COUNT(*) AS count_order "
    "FROM lineitem WHERE l_shipdate <= DATE '1998-09-02' GROUP BY l_returnflag, l_linestatus",
    "q2": "SELECT s.s_acctbal, s.s_name, n.n_name, p.p_partkey, p.p_mfgr, s.s_address "
    "FROM part p, supplier s, partsupp ps, nation n, region r "
    "WHERE p.p_partkey = ps.ps_partkey AND s.s_suppkey = ps.ps_suppkey AND p.p_size = 15 "
    "AND p.p_type LIKE '%BRASS' AND s.s_nationkey = n.n_nationkey "
    "AND n.n_regionkey = r.r_regionkey AND r.r_name = 'EUROPE' AND ps.ps_supplycost = ("
    "SELECT MIN(ps2.ps_supplycost) FROM partsupp ps2, supplier s2, nation n2, region r2 "
    "WHERE p.p_partkey = ps2.ps_partkey AND s2.s_suppkey = ps2.ps_suppkey "
    "AND s2.s_nationkey = n2.n_nationkey AND n2.n_regionkey = r2.r_regionkey "
    "AND r2.r_name = 'EUROPE')",
    "q3": f"SELECT l_orderkey, o_orderdate, o_shippriority, SUM({REVENUE}) AS revenue "
    "FROM customer, orders, lineitem WHERE c_mktsegment = 'BUILDING' AND c_custkey = o_custkey "
    "AND l_orderkey = o_orderkey AND o_orderdate < DATE '1995-03-15' "
    "AND l_shipdate > DATE '1995-03-15' GROUP BY l_orderkey, o_orderdate, o_shippriority",
    "q4": "SELECT o_orderpriority, COUNT(*) AS order_count FROM orders "
    "WHERE o_orderdate >= DATE '1993-07-01' AND o_orderdate < DATE '1993-10-01' "
    "AND EXISTS (SELECT * FROM lineitem WHERE l_orderkey = o_orderkey "
    "AND l_commitdate < l_receiptdate) GROUP BY o_orderpriority",
    "q5": f"SELECT n_name, SUM({REVENUE}) AS revenue "
    "FROM customer, orders, lineitem, supplier, nation, region "
    "WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND l_suppkey = s_suppkey "
    "AND c_nationkey = s_nationkey AND s_nationkey = n_nationkey AND n_regionkey = r_regionkey "
    "AND r_name = 'ASIA' AND o_orderdate >= DATE '1994-01-01' "
    "AND o_orderdate < DATE '1995-01-01' GROUP BY n_name",
    "q6": "SELECT SUM(l_extendedprice * l_discount) AS revenue FROM lineitem "
    "WHERE l_shipdate >= DATE '1994-01-01' AND l_shipdate < DATE '1995-01-01' "
    "AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24",
    "q7": "SELECT supp_nation, cust_nation, l_year, SUM(volume) AS revenue FROM ("
    "SELECT n1.n_name AS supp_nation, n2.n_name AS cust_nation, "
    "EXTRACT(YEAR FROM l_shipdate) AS l_year, "
    f"{REVENUE} AS volume FROM supplier, lineitem, orders, customer, nation n1, nation n2 "
    "WHERE s_suppkey = l_suppkey AND o_orderkey = l_orderkey AND c_custkey = o_custkey "
    "AND s_nationkey = n1.n_nationkey AND c_nationkey = n2.n_nationkey "
    "AND ((n1.n_name = 'FRANCE' AND n2.n_name = 'GERMANY') "
    "OR (n1.n_name = 'GERMANY' AND n2.n_name = 'FRANCE')) "
    "AND l_shipdate BETWEEN DATE '1995-01-01' AND DATE '1996-12-31') shipping "
    "GROUP BY supp_nation, cust_nation, l_year",
    "q8": "SELECT o_year, SUM(CASE WHEN nation = 'BRAZIL' THEN volume ELSE 0 END) / "
    "SUM(volume) AS mkt_share FROM ("
    f"SELECT EXTRACT(YEAR FROM o_orderdate) AS o_year, {REVENUE} AS volume, n2.n_name AS nation "
    "FROM part, supplier, lineitem, orders, customer, nation n1, nation n2, region "
    "WHERE p_partkey = l_partkey AND s_suppkey = l_suppkey AND l_orderkey = o_orderkey "
    "AND o_custkey = c_custkey AND c_nationkey = n1.n_nationkey "
    "AND n1.n_regionkey = r_regionkey AND r_name = 'AMERICA' AND s_nationkey = n2.n_nationkey "
    "AND o_orderdate BETWEEN DATE '1995-01-01' AND DATE '1996-12-31' "
    "AND p_type = 'ECONOMY ANODIZED STEEL') all_nations GROUP BY o_year",
    "q9": "SELECT nation, o_year, SUM(amount) AS sum_profit FROM ("
    "SELECT n_name AS nation, EXTRACT(YEAR FROM o_orderdate) AS o_year, "
    f"{REVENUE} - ps_supplycost * l_quantity AS amount "
    "FROM part, supplier, lineitem, partsupp, orders, nation "
    "WHERE s_suppkey = l_suppkey AND ps_suppkey = l_suppkey AND ps_partkey = l_partkey "
    "AND p_partkey = l_partkey AND o_orderkey = l_orderkey AND s_nationkey = n_nationkey "
    "AND p_name LIKE '%green%') profit GROUP BY nation, o_year",
    "q10": f"SELECT c_custkey, c_name, SUM({REVENUE}) AS revenue, c_acctbal, n_name "
    "FROM customer, orders, lineitem, nation WHERE c_custkey = o_custkey "
    "AND l_orderkey = o_orderkey AND o_orderdate >= DATE '1993-10-01' "
    "AND o_orderdate < DATE '1994-01-01' AND l_returnflag = 'R' AND c_nationkey = n_nationkey "
    "GROUP BY c_custkey, c_name, c_acctbal, n_name",
    "q11": f"SELECT ps_partkey, SUM(ps_supplycost * ps_availqty) AS value {GERMAN_STOCK} "
    "GROUP BY ps_partkey HAVING SUM(ps_supplycost * ps_availqty) > ("
    f"SELECT SUM(ps_supplycost * ps_availqty) * 0.1 {GERMAN_STOCK})",
    "q12": "SELECT l_shipmode, SUM(CASE WHEN o_orderpriority = '1-URGENT' "
    "OR o_orderpriority = '2-HIGH' THEN 1 ELSE 0 END) AS high_line_count, "
    "SUM(CASE WHEN o_orderpriority <> '1-URGENT' AND o_orderpriority <> '2-HIGH' "
    "THEN 1 ELSE 0 END) AS low_line_count FROM orders, lineitem "
    "WHERE o_orderkey = l_orderkey AND l_shipmode IN ('MAIL', 'SHIP') "
    "AND l_commitdate < l_receiptdate AND l_shipdate < l_commitdate "
    "AND l_receiptdate >= DATE '1994-01-01' AND l_receiptdate < DATE '1995-01-01' "
    "GROUP BY l_shipmode",
    "q13": "SELECT c_count, COUNT(*) AS custdist FROM ("
    "SELECT c_custkey, COUNT(o_orderkey) AS c_count FROM customer LEFT OUTER JOIN orders "
    "ON c_custkey = o_custkey AND o_comment NOT LIKE '%special%requests%' "
    "GROUP BY c_custkey) c_orders GROUP BY c_count",
    "q14": "SELECT 100.00 * SUM(CASE WHEN p_type LIKE 'PROMO%' "
    f"THEN {REVENUE} ELSE 0 END) / SUM({REVENUE}) AS promo_revenue FROM lineitem, part "
    "WHERE l_partkey = p_partkey AND l_shipdate >= DATE '1995-09-01' "
    "AND l_shipdate < DATE '1995-10-01'",
    "q15": "WITH revenue0 AS (SELECT l_suppkey AS supplier_no, "
    f"SUM({REVENUE}) AS total_revenue FROM lineitem WHERE l_shipdate >= DATE '1996-01-01' "
    "AND l_shipdate < DATE '1996-04-01' GROUP BY l_suppkey) "
    "SELECT s_suppkey, s_name, s_address, total_revenue FROM supplier, revenue0 "
    "WHERE s_suppkey = supplier_no AND total_revenue = (SELECT MAX(total_revenue) FROM revenue0)",
    "q16": "SELECT p_brand, p_type, p_size, COUNT(DISTINCT ps_suppkey) AS supplier_cnt "
    "FROM partsupp, part WHERE p_partkey = ps_partkey AND p_brand <> 'Brand#45' "
    "AND p_type NOT LIKE 'MEDIUM POLISHED%' AND p_size IN (49, 14, 23, 45, 19, 3, 36, 9) "
    "AND ps_suppkey NOT IN (SELECT s_suppkey FROM supplier "
    "WHERE s_comment LIKE '%Customer%Complaints%') GROUP BY p_brand, p_type, p_size",
    "q17": "SELECT SUM(l_extendedprice) / 7.0 AS avg_yearly FROM lineitem, part "
    "WHERE p_partkey = l_partkey AND p_brand = 'Brand#23' AND p_container = 'MED BOX' "
    "AND l_quantity < (SELECT 0.2 * AVG(l2.l_quantity) FROM lineitem l2 "
    "WHERE l2.l_partkey = p_partkey)",
    "q18": "SELECT c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice, "
    "SUM(l_quantity) AS sum_qty FROM customer, orders, lineitem WHERE o_orderkey IN ("
    "SELECT l2.l_orderkey FROM lineitem l2 GROUP BY l2.l_orderkey "
    "HAVING SUM(l2.l_quantity) > 40) AND c_custkey = o_custkey AND o_orderkey = l_orderkey "
    "GROUP BY c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice",
    "q19": f"SELECT SUM({REVENUE}) AS revenue FROM lineitem, part WHERE "
    "(p_partkey = l_partkey AND p_brand = 'Brand#12' AND p_container IN ('SM CASE', 'SM BOX') "
    "AND l_quantity >= 1 AND l_quantity <= 11 AND p_size BETWEEN 1 AND 5 "
    "AND l_shipmode IN ('AIR', 'AIR REG') AND l_shipinstruct = 'DELIVER IN PERSON') "
    "OR (p_partkey = l_partkey AND p_brand = 'Brand#23' AND p_container IN ('MED BOX', 'MED PKG') "
    "AND l_quantity >= 10 AND l_quantity <= 20 AND p_size BETWEEN 1 AND 10 "
    "AND l_shipmode IN ('AIR', 'AIR REG') AND l_shipinstruct = 'DELIVER IN PERSON') "
    "OR (p_partkey = l_partkey AND p_brand = 'Brand#34' AND p_container IN ('LG BOX', 'LG CASE') "
    "AND l_quantity >= 20 AND l_quantity <= 30 AND p_size BETWEEN 1 AND 15 "
    "AND l_shipmode IN ('AIR', 'AIR REG') AND l_shipinstruct = 'DELIVER IN PERSON')",
    "q20": "SELECT s_name, s_address FROM supplier, nation WHERE s_suppkey IN ("
    "SELECT ps_suppkey FROM partsupp WHERE ps_partkey IN ("
    "SELECT p_partkey FROM part WHERE p_name LIKE 'forest%') AND ps_availqty > ("
    "SELECT 0.5 * SUM(l_quantity) FROM lineitem WHERE l_partkey = ps_partkey "
    "AND l_suppkey = ps_suppkey AND l_shipdate >= DATE '1994-01-01' "
    "AND l_shipdate < DATE '1995-01-01')) AND s_nationkey = n_nationkey AND n_name = 'CANADA'",
    "q21": "SELECT s_name, COUNT(*) AS numwait FROM supplier, lineitem l1, orders, nation "
    "WHERE s_suppkey = l1.l_suppkey AND o_orderkey = l1.l_orderkey AND o_orderstatus = 'F' "
    "AND l1.l_receiptdate > l1.l_commitdate AND EXISTS (SELECT * FROM lineitem l2 "
    "WHERE l2.l_orderkey = l1.l_orderkey AND l2.l_suppkey <> l1.l_suppkey) "
    "AND NOT EXISTS (SELECT * FROM lineitem l3 WHERE l3.l_orderkey = l1.l_orderkey "
    "AND l3.l_suppkey <> l1.l_suppkey AND l3.l_receiptdate > l3.l_commitdate) "
    "AND s_nationkey = n_nationkey AND n_name = 'SAUDI ARABIA' GROUP BY s_name",
    "q22": "SELECT cntrycode, COUNT(*) AS numcust, SUM(c_acctbal) AS totacctbal FROM ("
    "SELECT SUBSTRING(c_phone FROM 1 FOR 2) AS cntrycode, c_acctbal FROM customer "
    f"WHERE SUBSTRING(c_phone FROM 1 FOR 2) IN {CODES} AND c_acctbal > (SELECT "
    "AVG(c2.c_acctbal) FROM customer c2 WHERE c2.c_acctbal > 0.00 "
    f"AND SUBSTRING(c2.c_phone FROM 1 FOR 2) IN {CODES}) "
    "AND NOT EXISTS (SELECT * FROM orders WHERE o_custkey = c_custkey)) custsale "
    "GROUP BY cntrycode",
}

# === rewritten where the view language refuses TPC-H's SQL =======================================

REWRITTEN: dict[str, str] = {
    "q16": "SELECT p_brand, p_type, p_size, COUNT(DISTINCT ps_suppkey) AS supplier_cnt "
    "FROM partsupp, part, supplier WHERE p_partkey = ps_partkey AND s_suppkey = ps_suppkey "
    "AND p_brand <> 'Brand#45' AND p_type NOT LIKE 'MEDIUM POLISHED%' "
    "AND p_size IN (49, 14, 23, 45, 19, 3, 36, 9) "
    "AND s_comment NOT LIKE '%Customer%Complaints%' GROUP BY p_brand, p_type, p_size",
}

# each query as maintained: rewritten where TPC-H's SQL is refused
SHAPES = {name: REWRITTEN.get(name, sql) for name, sql in WRITTEN.items()}
CUMULUS = (
    "q1",
    "q2",  # a MIN over a join: its count map's changed slice read into the new MIN
    "q3",
    "q4",  # EXISTS: a nested COUNT(*) per order, lifted
    "q5",
    "q6",
    "q7",
    "q8",
    "q9",
    "q10",
    "q11",  # the HAVING's uncorrelated total: keyless maps, compared when the view is read
    "q12",
    "q13",  # the per-customer counts pre-aggregated, a LEFT JOIN lookup: grouped by its value
    "q14",
    "q15",  # the MAX over the revenues read at each line item's supplier, compared when read
    "q16",
    "q17",  # a correlated 0.2 * AVG over the outer query's own table: domain maintenance
    "q18",  # IN over a grouped subquery: its HAVING over lifted sums
    "q19",
    "q20",  # IN over a subquery with a nested SUM: a join grouped by supplier, one nesting
    "q21",  # EXISTS and NOT EXISTS correlated by <>: two counts per order, lifted
    "q22",  # the FROM subquery merged: NOT EXISTS and an uncorrelated AVG, one level each
)
# compared within rounding: AVG (a DECIMAL rounded to 6 places; duckdb's a DOUBLE) and "/"
APPROX = {
    "q1": {"avg_qty", "avg_price", "avg_disc"},
    "q8": {"mkt_share"},
    "q14": {"promo_revenue"},
    "q17": {"avg_yearly"},
}
# accepted as written in every mode (NOT IN: an anti-join), rewritten as cumulus maintains it
# cheaper (an uncorrelated NOT IN re-derives the whole domain at a write of its table)
REWRITTEN_FOR_CUMULUS = ("q16",)
# === refusals and the acceptance table ===========================================================


def test_the_acceptance_table_is_what_the_compiler_does() -> None:
    """Every query as maintained compiles in sync and async mode, in cumulus exactly those of
    ``CUMULUS``; TPC-H's SQL compiles in sync and in cumulus, every query of it (Q20, the
    last, since 2026-12-03)."""
    for name, select in SHAPES.items():
        compile_sql_views(create(name, select, "sync"), SCHEMAS.__getitem__)  # async: the same
        try:
            compile_sql_views(create(name, select, "cumulus"), SCHEMAS.__getitem__)
            assert name in CUMULUS, name
        except errors.InvalidArgument:
            assert name not in CUMULUS, name
    for name, select in WRITTEN.items():  # every one as written, since 2026-12-02
        compile_sql_views(create(name, select, "sync"), SCHEMAS.__getitem__)
        assert name not in REWRITTEN or name in REWRITTEN_FOR_CUMULUS
        compile_sql_views(create(name, select, "cumulus"), SCHEMAS.__getitem__)
    assert len(WRITTEN) == 22


# === sync: the refresh operator ==================================================================


# per query, a seed whose stream (``COUNT`` batches after the initial load) makes the view
# nonempty at least 5 times (the first such seed from 0)
COUNT = 12
SEEDS = {
    **{name: 0 for name in WRITTEN},
    **{"q4": 8, "q5": 6, "q7": 8, "q8": 2, "q9": 1, "q10": 2, "q12": 11, "q14": 1, "q17": 2},
    **{"q20": 10, "q21": 11},
}


@pytest.mark.parametrize("name", sorted(SHAPES, key=lambda n: int(n[1:])))
def test_the_refresh_operator_maintains_each_query_as_duckdb_recomputes_it(name: str) -> None:
    seen = maintain(TPCH, name, SHAPES[name], SEEDS[name], COUNT, APPROX.get(name, ()))
    assert seen >= 5, (
        f"{name}: the view was nonempty {seen} times (5 wanted): the seed tests little"
    )


@pytest.mark.parametrize("name", REWRITTEN_FOR_CUMULUS)
def test_the_refresh_operator_maintains_the_written_sql_it_takes(name: str) -> None:
    seen = maintain(TPCH, name, WRITTEN[name], SEEDS[name], COUNT, APPROX.get(name, ()))
    assert seen >= 5, f"{name}: the view was nonempty {seen} times (5 wanted)"


@settings(max_examples=examples(4, 40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(SHAPES)), seed=st.integers(0, 2**32))
def test_random_streams_maintained_by_the_refresh_operator_equal_duckdb(
    name: str, seed: int
) -> None:
    maintain(TPCH, name, SHAPES[name], seed, 8, APPROX.get(name, ()))


# === cumulus: M3 programs ========================================================================


# programs of 45 maps or more (compiling and printing them costs seconds): in the ci profile
# only the unbounded depth, and no print -> parse round trip
LARGE = ("q5", "q7", "q8", "q9")


@pytest.mark.parametrize("name", CUMULUS)
def test_m3_programs_of_each_query_equal_duckdb_after_every_change(name: str) -> None:
    large = name in LARGE and examples(True, False)
    depths = (None,) if large else DEPTHS
    seen = replay(
        TPCH, name, SHAPES[name], SEEDS[name], COUNT, depths, not large, APPROX.get(name, ())
    )
    assert seen >= 5, (
        f"{name}: the view was nonempty {seen} times (5 wanted): the seed tests little"
    )


# random streams: the shapes compared with a scalar or grouped by a nested value when read,
# and Q20's IN read as a grouped join
RANDOM_IN_M3 = ("q11", "q13", "q15", "q20")


@settings(max_examples=examples(4, 40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(RANDOM_IN_M3), seed=st.integers(0, 2**32))
def test_random_streams_of_the_rewritten_shapes_in_m3_equal_duckdb(name: str, seed: int) -> None:
    """Q15's top supplier: the MAX moves to another supplier as line items come and go;
    Q20's supplier comes and goes as its shipped quantity passes half its stock."""
    replay(TPCH, name, SHAPES[name], seed, 8, approx=APPROX.get(name, ()))


@pytest.mark.parametrize("name", REWRITTEN_FOR_CUMULUS)
def test_m3_programs_of_the_written_sql_equal_duckdb_after_every_change(name: str) -> None:
    """Q16 as TPC-H writes it (NOT IN over supplier), as cumulus now takes it."""
    seen = replay(TPCH, name, WRITTEN[name], SEEDS[name], COUNT, approx=APPROX.get(name, ()))
    assert seen >= 5, f"{name}: the view was nonempty {seen} times (5 wanted)"


# === every mode on a cluster =====================================================================

# seeds whose initial load gives the view two rows or more; and Q18, whose subqueries are
# hidden views in sync and async (views over views on the cluster), nested aggregates in cumulus
CLUSTER_SEEDS = {"q1": 0, "q3": 9, "q5": 6, "q10": 19, "q11": 0, "q13": 0, "q18": 0}
CLUSTER_MODES: dict[str, tuple[str, ...]] = {}


@pytest.mark.parametrize("name", sorted(CLUSTER_SEEDS))
def test_queries_equal_duckdb_on_a_cluster_in_every_mode(cluster: LocalCluster, name: str) -> None:
    modes = CLUSTER_MODES.get(name, ("sync", "async", "cumulus"))
    seed, approx = CLUSTER_SEEDS[name], APPROX.get(name, ())
    sizes = every_mode_equals_duckdb(cluster, TPCH, name, SHAPES[name], seed, modes, approx)
    assert sizes[0] >= 2, f"{name}: the view as created has {sizes[0]} rows, the seed tests little"


@pytest.mark.parametrize("name", ["q15", "q20"])
def test_the_rewritten_cumulus_shapes_on_a_cluster_in_sync_and_cumulus(
    cluster: LocalCluster, name: str
) -> None:
    """Q15's view (one row: the top supplier, more on a tie) and Q20's suppliers created on
    the cluster, read after concurrent writers change them: cumulus compares Q15's rows with
    the MAX when read, and keeps Q20's as a join grouped by supplier."""
    seed = SEEDS[name]
    sizes = every_mode_equals_duckdb(cluster, TPCH, name, SHAPES[name], seed, ("sync", "cumulus"))
    assert sizes[0] >= 1, f"{name}: the view had {sizes} rows, the seed tests little"
