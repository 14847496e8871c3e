"""The view compiler: DDL statements, every supported construct, every refusal, each pass alone.

The catalog is the thesis dashboard schema (plus ``flags`` for BOOL and FLOAT columns). Refusals
live in ``compiler_fixtures/refusals.sql``: SQL in, error class and message fragment out.
"""

from __future__ import annotations

import datetime
import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from aggview import errors
from aggview.schema import Column, ColumnType, TableSchema
from cumulus import typerules
from cumulus.aggregates import RULES, Kind
from cumulus.compiler import compile_sql, compile_sql_views, compile_view
from cumulus.ddl import (
    DEFAULT_ASYNC_INTERVAL_MS,
    DEFAULT_EPOCH_MS,
    AlterView,
    CreateView,
    DropView,
    altered_plan,
    parse_view_statement,
)
from cumulus.expressions import compile_predicate
from cumulus.passes import check_support, plan_joins, resolve_tables
from cumulus.plan import Aggregate, ColumnRef, GroupColumn, JoinEdge, TableRef, ViewPlan

FIXTURES = Path(__file__).parent / "compiler_fixtures"


def _table(name: str, columns: list[tuple[str, str]], key: str) -> TableSchema:
    cols = [Column(n, ColumnType.parse(t)) for n, t in columns]
    return TableSchema.build(name, f"t_{name}", cols, key)


CATALOG = {
    s.name: s
    for s in [
        _table(
            "events",
            [
                ("event_id", "INT"),
                ("prod_id", "INT"),
                ("shop_id", "INT"),
                ("cost", "DECIMAL(10,2)"),
                ("ts", "DATE"),
            ],
            "event_id",
        ),
        _table(
            "products",
            [("prod_id", "INT"), ("cat_id", "INT"), ("name", "TEXT"), ("price", "DECIMAL(10,2)")],
            "prod_id",
        ),
        _table("categories", [("cat_id", "INT"), ("name", "TEXT")], "cat_id"),
        _table("shops", [("shop_id", "INT"), ("addr_id", "INT"), ("name", "TEXT")], "shop_id"),
        _table("address", [("addr_id", "INT"), ("city", "TEXT")], "addr_id"),
        _table("flags", [("id", "INT"), ("ok", "BOOL"), ("score", "FLOAT")], "id"),
    ]
}


def table(name: str) -> TableSchema:
    schema = CATALOG.get(name)
    if schema is None:
        raise errors.UnknownTable(f"unknown table {name!r}")
    return schema


def view(select: str, header: str = "CREATE MATERIALIZED VIEW v AS") -> ViewPlan:
    plan = compile_sql(f"{header} {select}", table)
    # Every plan the compiler makes survives a trip through JSON text unchanged.
    again = ViewPlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan and again.to_json() == plan.to_json()
    return plan


def col(alias: str, column: str) -> dict[str, Any]:
    return {"col": [alias, column]}


def lit(value: object, type_: str) -> dict[str, Any]:
    return {"lit": value, "type": type_}


def aggregates(plan: ViewPlan) -> list[tuple[str, str, str, bool]]:
    return [(a.name, a.kind, a.result_type, a.hidden) for a in plan.aggregates]


# === DDL ========================================================================================


def test_create_defaults_to_sync_and_keeps_the_select_text() -> None:
    sql = "CREATE MATERIALIZED VIEW Totals AS\n  SELECT count(*) FROM events ;"
    assert parse_view_statement(sql) == CreateView(
        "totals", False, "sync", 0, "SELECT count(*) FROM events"
    )


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        (
            "CREATE MATERIALIZED VIEW v WITH (refresh = 'async', interval_ms = 500) AS SELECT 1",
            CreateView("v", False, "async", 500, "SELECT 1"),
        ),
        (
            "create  materialized\n view IF not EXISTS \"MyView\" with(REFRESH='ASYNC')as select 1",
            CreateView("MyView", True, "async", 1000, "select 1"),
        ),
        (
            "-- a dashboard view\nCREATE MATERIALIZED VIEW v /* opts */ WITH (\n"
            "  interval_ms = 86400000, refresh = async\n) AS SELECT 1",
            CreateView("v", False, "async", 86_400_000, "SELECT 1"),
        ),
        (
            "CREATE MATERIALIZED VIEW v WITH (refresh = sync) AS SELECT 1",
            CreateView("v", False, "sync", 0, "SELECT 1"),
        ),
        (
            "CREATE MATERIALIZED VIEW v WITH (refresh = 'async', interval_ms = 10) AS SELECT 1",
            CreateView("v", False, "async", 10, "SELECT 1"),
        ),
        ("DROP MATERIALIZED VIEW v", DropView("v", False)),
        ("drop materialized view if exists V;", DropView("v", True)),
        ("ALTER MATERIALIZED VIEW v SET (interval_ms = 250)", AlterView("v", interval_ms=250)),
        ('alter materialized view "V" set ( INTERVAL_MS=99 ) ;', AlterView("V", interval_ms=99)),
        (
            "ALTER MATERIALIZED VIEW v SET (refresh = 'cumulus', nodes = 3, mode = conservative)",
            AlterView("v", refresh="cumulus", nodes=3, speculation="conservative"),
        ),
    ],
)
def test_view_statements(sql: str, expected: object) -> None:
    assert parse_view_statement(sql) == expected


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TABLE t (a INT PRIMARY KEY)",
        "DROP TABLE view",
        "SELECT * FROM t",
        "INSERT INTO t VALUES (1)",
        "ALTER TABLE t ADD COLUMN b INT",
        "",
    ],
)
def test_other_statements_are_not_view_statements(sql: str) -> None:
    assert parse_view_statement(sql) is None


_CREATE = "CREATE MATERIALIZED VIEW v WITH ({}) AS SELECT count(*) FROM events"


@pytest.mark.parametrize(
    ("sql", "fragment"),
    [
        (
            _CREATE.format("refresh = 'eager'"),
            "refresh must be 'sync', 'async' or 'cumulus'; got 'eager'",
        ),
        (_CREATE.format("refresh = 1"), "refresh must be 'sync', 'async' or 'cumulus'"),
        (
            _CREATE.format("refresh = 'async', interval_ms = '500'"),
            "interval_ms must be a positive integer (milliseconds); got '500'",
        ),
        (_CREATE.format("refresh = 'async', interval_ms = -5"), "positive integer"),
        (_CREATE.format("refresh = 'async', interval_ms = 0"), "positive integer"),
        (_CREATE.format("refresh = 'async', interval_ms = 1.5"), "positive integer"),
        (_CREATE.format("refresh = 'async', interval_ms = 1e3"), "positive integer"),
        (_CREATE.format("refresh = 'async', interval_ms = x"), "positive integer"),
        (_CREATE.format("refresh = 'async', interval_ms = true"), "invalid value"),
        (_CREATE.format("refresh = 'async', interval_ms = 9"), "between 10 and 86400000; got 9"),
        (_CREATE.format("refresh = 'async', interval_ms = 86400001"), "between 10 and 86400000"),
        (_CREATE.format("refresh = 'sync', interval_ms = 100"), "interval_ms applies only to"),
        (_CREATE.format("interval_ms = 100"), "interval_ms applies only to refresh = 'async'"),
        (_CREATE.format("foo = 1, bar = 'x'"), "unknown view option foo, bar"),
        (_CREATE.format("format = 'parquet'"), "unknown view option format"),
        (_CREATE.format("refresh = 'async', refresh = 'sync'"), "refresh is given twice"),
        (_CREATE.format("refresh"), "expected ="),
        (_CREATE.format("refresh = 'async'"), None),  # control: valid
        ("CREATE MATERIALIZED VIEW v WITH (refresh = 'async' AS SELECT 1", "expected ,"),
        ("CREATE MATERIALIZED VIEW v SELECT 1", "expected AS"),
        ("CREATE MATERIALIZED VIEW AS SELECT 1", "expected a view name"),
        ("CREATE MATERIALIZED VIEW v AS ;", "has no SELECT"),
        ("CREATE MATERIALIZED VIEW s.v AS SELECT 1", "qualified view names"),
        ('CREATE MATERIALIZED VIEW "bad name" AS SELECT 1', "invalid view name"),
        ("CREATE VIEW v AS SELECT 1", "plain views are not supported"),
        ("DROP VIEW v", "plain views are not supported"),
        ("CREATE OR REPLACE MATERIALIZED VIEW v AS SELECT 1", "OR REPLACE MATERIALIZED VIEW"),
        ("CREATE TEMPORARY MATERIALIZED VIEW v AS SELECT 1", "TEMPORARY MATERIALIZED VIEW"),
        ("DROP MATERIALIZED VIEW a, b", "one view at a time"),
        ("DROP MATERIALIZED VIEW v CASCADE", "unexpected 'CASCADE'"),
        ("DROP MATERIALIZED VIEW", "expected a view name"),
        ("ALTER MATERIALIZED VIEW v SET (refresh = 'lazy')", "refresh must be 'sync', 'async'"),
        ("ALTER MATERIALIZED VIEW v SET (nodes = 0)", "nodes must be a whole number from 1"),
        ("ALTER MATERIALIZED VIEW v SET (interval_ms = 5)", "between 10 and 86400000; got 5"),
        ("ALTER MATERIALIZED VIEW v SET (foo = 5)", "unknown view option foo"),
        ("ALTER MATERIALIZED VIEW v SET ()", "nothing to alter"),
        ("ALTER MATERIALIZED VIEW v RENAME TO w", "expected SET"),
        ("ALTER MATERIALIZED VIEW v SET (interval_ms = 50) now", "unexpected 'now'"),
        ("CREATE MATERIALIZED VIEW v WITH (refresh = 'async) AS SELECT 1", "is not closed"),
    ],
)
def test_bad_view_statements(sql: str, fragment: str | None) -> None:
    if fragment is None:
        assert isinstance(parse_view_statement(sql), CreateView)
        return
    with pytest.raises(errors.InvalidArgument) as caught:
        parse_view_statement(sql)
    assert fragment in str(caught.value)


def test_an_altered_plan_takes_the_new_mode_s_defaults_and_refuses_other_modes_options() -> None:
    create = parse_view_statement(
        "CREATE MATERIALIZED VIEW v WITH (refresh = 'async', interval_ms = 250) "
        "AS SELECT cat_id, COUNT(*) AS n FROM products GROUP BY cat_id"
    )
    assert isinstance(create, CreateView)
    plan = compile_view(create, CATALOG.__getitem__)
    cumulus = altered_plan(plan, AlterView("v", refresh="cumulus", nodes=3))
    assert (cumulus.mode, cumulus.nodes, cumulus.interval_ms, cumulus.speculation) == (
        "cumulus",
        3,
        DEFAULT_EPOCH_MS,
        "speculative",
    )
    assert altered_plan(cumulus, AlterView("v", epoch_ms=40)).nodes == 3  # its own kept
    back = altered_plan(cumulus, AlterView("v", refresh="async"))
    assert (back.mode, back.interval_ms, back.nodes) == ("async", DEFAULT_ASYNC_INTERVAL_MS, 0)
    assert altered_plan(plan, AlterView("v", interval_ms=40)).interval_ms == 40
    assert altered_plan(plan, AlterView("v", refresh="sync")).interval_ms == 0
    assert altered_plan(plan, AlterView("v", refresh="async")) == plan  # nothing changes
    for alter, fragment in (
        (AlterView("v", refresh="sync", interval_ms=40), "interval_ms applies only"),
        (AlterView("v", nodes=2), "nodes applies only to refresh = 'cumulus'"),
        (AlterView("v", refresh="async", speculation="conservative"), "mode applies only"),
    ):
        with pytest.raises(errors.InvalidArgument, match=fragment):
            altered_plan(plan, alter)


# === supported constructs ======================================================================

DASHBOARD = (
    "SELECT c.name, SUM(e.cost) AS cost, COUNT(*) FROM events e "
    "JOIN products p ON e.prod_id = p.prod_id JOIN categories c ON p.cat_id = c.cat_id "
    "WHERE e.cost > 0 GROUP BY c.name"
)


def test_dashboard_view() -> None:
    plan = view(DASHBOARD, "CREATE MATERIALIZED VIEW by_category WITH (refresh = 'async') AS")
    assert (plan.name, plan.mode, plan.interval_ms, plan.sql) == (
        "by_category",
        "async",
        1000,
        DASHBOARD,
    )
    assert plan.tables == (
        TableRef("e", "events"),
        TableRef("p", "products"),
        TableRef("c", "categories"),
    )
    assert plan.edges == (
        JoinEdge(ColumnRef("e", "prod_id"), ColumnRef("p", "prod_id")),
        JoinEdge(ColumnRef("p", "cat_id"), ColumnRef("c", "cat_id")),
    )
    assert plan.filters == ({"cmp": ">", "args": [col("e", "cost"), lit(0, "INT")]},)
    assert plan.group_by == (GroupColumn("name", ColumnRef("c", "name"), "TEXT"),)
    assert plan.aggregates == (
        Aggregate("cost", "sum", col("e", "cost"), "DECIMAL(10,2)", "DECIMAL(38,2)"),
        Aggregate("count", "count_star", None, None, "INT"),
    )
    assert plan.having is None
    assert plan.output == ("name", "cost", "count")
    assert plan.base_tables() == ("events", "products", "categories")
    assert plan.columns_of("e") == ("prod_id", "cost")
    assert plan.columns_of("c") == ("cat_id", "name")
    assert plan.column_type("cost") == "DECIMAL(38,2)"


def test_self_join_uses_aliases() -> None:
    plan = view(
        "SELECT a.shop_id, count(*) FROM events a JOIN events b "
        "ON a.prod_id = b.prod_id AND b.cost > 1 GROUP BY a.shop_id"
    )
    assert plan.tables == (TableRef("a", "events"), TableRef("b", "events"))
    assert plan.base_tables() == ("events",)
    assert plan.aliases_of("events") == ("a", "b")
    assert plan.aliases_of("products") == ()
    assert plan.edges == (JoinEdge(ColumnRef("a", "prod_id"), ColumnRef("b", "prod_id")),)
    assert plan.filters == ({"cmp": ">", "args": [col("b", "cost"), lit(1, "INT")]},)
    assert plan.columns_of("b") == ("prod_id", "cost")


def test_cross_alias_inequality_is_a_filter_in_where() -> None:
    plan = view(
        "SELECT a.shop_id, count(*) FROM events a, events b "
        "WHERE a.prod_id = b.prod_id AND a.shop_id <> b.shop_id GROUP BY a.shop_id"
    )
    assert plan.edges == (JoinEdge(ColumnRef("a", "prod_id"), ColumnRef("b", "prod_id")),)
    assert plan.filters == ({"cmp": "<>", "args": [col("a", "shop_id"), col("b", "shop_id")]},)


def test_comma_join_of_four_tables_with_unqualified_columns() -> None:
    plan = view(
        "SELECT city, sum(cost) AS revenue FROM events e, shops s, address a, products p "
        "WHERE e.shop_id = s.shop_id AND s.addr_id = a.addr_id AND p.prod_id = e.prod_id "
        "AND price < 100 GROUP BY city"
    )
    assert [str(e.left) + "=" + str(e.right) for e in plan.edges] == [
        "e.shop_id=s.shop_id",
        "s.addr_id=a.addr_id",
        "p.prod_id=e.prod_id",
    ]
    assert plan.filters == ({"cmp": "<", "args": [col("p", "price"), lit(100, "INT")]},)
    assert plan.group_by == (GroupColumn("city", ColumnRef("a", "city"), "TEXT"),)


def test_inner_join_on_with_extra_conditions_and_duplicate_edges() -> None:
    plan = view(
        "SELECT count(*) FROM events e INNER JOIN products p "
        "ON e.prod_id = p.prod_id AND p.price >= 10 AND (p.cat_id = 3) "
        "WHERE p.prod_id = e.prod_id AND e.shop_id = e.prod_id AND 1 < 2"
    )
    assert plan.edges == (JoinEdge(ColumnRef("e", "prod_id"), ColumnRef("p", "prod_id")),)
    assert plan.filters == (
        {"cmp": ">=", "args": [col("p", "price"), lit(10, "INT")]},
        {"cmp": "=", "args": [col("p", "cat_id"), lit(3, "INT")]},
        {"cmp": "=", "args": [col("e", "shop_id"), col("e", "prod_id")]},
        {"cmp": "<", "args": [lit(1, "INT"), lit(2, "INT")]},
    )


def test_where_predicates() -> None:
    plan = view(
        "SELECT count(*) FROM events WHERE shop_id IN (1, 2, 3) AND cost BETWEEN 1.5 AND 10 "
        "AND shop_id != 7 AND NOT prod_id IN (4) AND cost NOT BETWEEN 2 AND 3 "
        "AND NOT (shop_id = 9) AND ts BETWEEN '2024-01-01' AND DATE '2024-12-31' "
        "AND ts IN ('2024-02-29') AND -cost < -(1 + shop_id) AND ((prod_id > 0))"
    )
    ev = "events"
    assert plan.filters == (
        {"in": col(ev, "shop_id"), "values": [lit(1, "INT"), lit(2, "INT"), lit(3, "INT")]},
        {"between": col(ev, "cost"), "low": lit("1.5", "DECIMAL(38,1)"), "high": lit(10, "INT")},
        {"cmp": "<>", "args": [col(ev, "shop_id"), lit(7, "INT")]},
        {"not": {"in": col(ev, "prod_id"), "values": [lit(4, "INT")]}},
        {"not": {"between": col(ev, "cost"), "low": lit(2, "INT"), "high": lit(3, "INT")}},
        {"not": {"cmp": "=", "args": [col(ev, "shop_id"), lit(9, "INT")]}},
        {
            "between": col(ev, "ts"),
            "low": lit("2024-01-01", "DATE"),
            "high": lit("2024-12-31", "DATE"),
        },
        {"in": col(ev, "ts"), "values": [lit("2024-02-29", "DATE")]},
        {
            "cmp": "<",
            "args": [
                {"neg": col(ev, "cost")},
                {"neg": {"op": "+", "args": [lit(1, "INT"), col(ev, "shop_id")]}},
            ],
        },
        {"cmp": ">", "args": [col(ev, "prod_id"), lit(0, "INT")]},
    )


def test_bool_conditions_and_min_max_over_bool() -> None:
    plan = view("SELECT min(ok), max(ok), avg(score) FROM flags WHERE ok AND NOT ok = FALSE")
    true = lit(True, "BOOL")
    assert plan.filters == (
        {"cmp": "=", "args": [col("flags", "ok"), true]},
        {"not": {"cmp": "=", "args": [col("flags", "ok"), lit(False, "BOOL")]}},
    )
    assert aggregates(plan) == [
        ("min_ok", "min", "BOOL", False),
        ("max_ok", "max", "BOOL", False),
        ("avg_score", "avg", "FLOAT", False),
    ]


def test_zero_group_by_and_aggregate_kinds() -> None:
    plan = view(
        "SELECT avg(cost), avg(shop_id), min(ts), max(cost), count(DISTINCT prod_id), "
        "count(cost), count(1), sum(shop_id), min(DISTINCT shop_id) FROM events"
    )
    assert plan.group_by == ()
    assert aggregates(plan) == [
        ("avg_cost", "avg", "DECIMAL(38,6)", False),
        ("avg_shop_id", "avg", "DECIMAL(38,6)", False),
        ("min_ts", "min", "DATE", False),
        ("max_cost", "max", "DECIMAL(10,2)", False),
        ("count_distinct_prod_id", "count_distinct", "INT", False),
        ("count_cost", "count", "INT", False),
        ("count", "count_star", "INT", False),
        ("sum_shop_id", "sum", "INT", False),
        ("min_shop_id", "min", "INT", False),
    ]
    assert plan.aggregates[4].arg == col("events", "prod_id")
    assert plan.aggregates[4].arg_type == "INT"


@pytest.mark.parametrize(
    ("expr", "arg_type", "result_type"),
    [
        ("e.cost * 2", "DECIMAL(38,2)", "DECIMAL(38,2)"),
        ("e.cost * p.price", "DECIMAL(38,4)", "DECIMAL(38,4)"),
        ("e.cost + p.price * 1.5", "DECIMAL(38,3)", "DECIMAL(38,3)"),
        ("e.cost - 1", "DECIMAL(38,2)", "DECIMAL(38,2)"),
        ("e.shop_id * 3 - e.prod_id", "INT", "INT"),
        ("e.cost / 2", "FLOAT", "FLOAT"),
        ("e.shop_id / e.prod_id", "FLOAT", "FLOAT"),
        ("e.cost * 1e2", "FLOAT", "FLOAT"),
        ("e.shop_id + 99999999999999999999", "DECIMAL(38,0)", "DECIMAL(38,0)"),
        ("-(e.cost)", "DECIMAL(10,2)", "DECIMAL(38,2)"),
        ("e.cost * 0.000000000000000000000000000000000001", "DECIMAL(38,38)", "DECIMAL(38,38)"),
    ],
)
def test_arithmetic_types(expr: str, arg_type: str, result_type: str) -> None:
    plan = view(
        f"SELECT sum({expr}) AS s, avg({expr}) AS a FROM events e "
        "JOIN products p ON e.prod_id = p.prod_id"
    )
    total, mean = plan.aggregates
    assert (total.arg_type, total.result_type) == (arg_type, result_type)
    scale = ColumnType.parse(arg_type).scale or 0
    assert mean.result_type == ("FLOAT" if arg_type == "FLOAT" else f"DECIMAL(38,{max(scale, 6)})")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5", lit(5, "INT")),
        ("-5", lit(-5, "INT")),
        ("1.50", lit("1.50", "DECIMAL(38,2)")),
        ("-1.50", lit("-1.50", "DECIMAL(38,2)")),
        ("-0.00", lit("0.00", "DECIMAL(38,2)")),
        (".5", lit("0.5", "DECIMAL(38,1)")),
        ("0.0000001", lit("0.0000001", "DECIMAL(38,7)")),
        ("1e3", lit(1000.0, "FLOAT")),
        ("9223372036854775807", lit(9223372036854775807, "INT")),
        ("9223372036854775808", lit("9223372036854775808", "DECIMAL(38,0)")),
    ],
)
def test_numeric_literals(text: str, expected: dict[str, Any]) -> None:
    plan = view(f"SELECT count(*) FROM events WHERE cost < {text}")
    assert plan.filters[0]["args"][1] == expected


def test_having_reuses_outputs_and_adds_hidden_aggregates() -> None:
    plan = view(
        "SELECT c.name AS category, SUM(e.cost) AS revenue FROM events e "
        "JOIN products p ON e.prod_id = p.prod_id JOIN categories c ON p.cat_id = c.cat_id "
        "GROUP BY c.name, p.cat_id "
        "HAVING sum(e.cost) > 5 AND count(*) >= 2 AND COUNT(*) < 1000 AND avg(p.price) <= 9.5 "
        "AND c.name <> 'toys' AND p.cat_id IN (1, 2) AND revenue < 10000"
    )
    assert aggregates(plan) == [
        ("revenue", "sum", "DECIMAL(38,2)", False),
        ("_having0", "count_star", "INT", True),
        ("_having1", "avg", "DECIMAL(38,6)", True),
    ]
    assert plan.group_by == (
        GroupColumn("category", ColumnRef("c", "name"), "TEXT"),
        GroupColumn("cat_id", ColumnRef("p", "cat_id"), "INT"),
    )
    assert plan.output == ("category", "revenue")
    assert plan.having == {
        "and": [
            {"cmp": ">", "args": [{"out": "revenue"}, lit(5, "INT")]},
            {"cmp": ">=", "args": [{"out": "_having0"}, lit(2, "INT")]},
            {"cmp": "<", "args": [{"out": "_having0"}, lit(1000, "INT")]},
            {"cmp": "<=", "args": [{"out": "_having1"}, lit("9.5", "DECIMAL(38,1)")]},
            {"cmp": "<>", "args": [{"out": "category"}, lit("toys", "TEXT")]},
            {"in": {"out": "cat_id"}, "values": [lit(1, "INT"), lit(2, "INT")]},
            {"cmp": "<", "args": [{"out": "revenue"}, lit(10000, "INT")]},
        ]
    }


def test_having_alone_supplies_the_aggregate() -> None:
    plan = view("SELECT shop_id FROM events GROUP BY shop_id HAVING count(*) > 1")
    assert aggregates(plan) == [("_having0", "count_star", "INT", True)]
    assert plan.output == ("shop_id",)
    assert plan.having == {"cmp": ">", "args": [{"out": "_having0"}, lit(1, "INT")]}


def test_output_names_are_deterministic_and_deduplicated() -> None:
    plan = view(
        "SELECT sum(e.cost), p.name, count(*), c.name, sum(e.cost), count(*) AS sum_cost_2, "
        "avg(e.cost * 2), sum(e.cost + 1) "
        "FROM events e JOIN products p ON e.prod_id = p.prod_id "
        "JOIN categories c ON c.cat_id = p.cat_id GROUP BY c.name, p.name, p.cat_id"
    )
    assert plan.output == (
        "sum_cost",
        "name",
        "count",
        "name_2",
        "sum_cost_3",
        "sum_cost_2",
        "avg",
        "sum",
    )
    assert [g.name for g in plan.group_by] == ["name_2", "name", "cat_id"]
    assert [g.ref for g in plan.group_by] == [
        ColumnRef("c", "name"),
        ColumnRef("p", "name"),
        ColumnRef("p", "cat_id"),
    ]


def test_group_by_position_and_output_alias() -> None:
    by_position = view("SELECT shop_id, count(*) FROM events GROUP BY 1")
    by_alias = view("SELECT shop_id AS shop, count(*) FROM events GROUP BY shop")
    assert by_position.group_by == (GroupColumn("shop_id", ColumnRef("events", "shop_id"), "INT"),)
    assert by_alias.group_by == (GroupColumn("shop", ColumnRef("events", "shop_id"), "INT"),)
    # An input column wins over an output alias of the same name, as in SQL.
    shadowed = view("SELECT prod_id AS shop_id, count(*) FROM events GROUP BY shop_id, prod_id")
    assert [g.ref.column for g in shadowed.group_by] == ["shop_id", "prod_id"]


def test_group_columns_not_selected_are_still_part_of_the_key() -> None:
    plan = view("SELECT sum(cost) FROM events GROUP BY shop_id, ts, shop_id")
    assert [(g.name, g.type) for g in plan.group_by] == [("shop_id", "INT"), ("ts", "DATE")]
    assert plan.output == ("sum_cost",)


def test_quoted_and_folded_identifiers() -> None:
    plan = view('SELECT E.Shop_ID AS "Shop", COUNT(*) AS N FROM Events E GROUP BY e.shop_id')
    assert plan.tables == (TableRef("e", "events"),)
    assert plan.output == ("Shop", "n")


def test_compiled_filters_evaluate_on_rows() -> None:
    plan = view(
        "SELECT count(*) FROM events e WHERE e.cost * 2 > 10.5 "
        "AND e.ts BETWEEN '2024-01-01' AND '2024-12-31' AND e.shop_id IN (1, 2)"
    )
    checks = [compile_predicate(f) for f in plan.filters]

    def passes(**row: object) -> bool:
        return all(check(lambda alias, column: row[column]) for check in checks)

    day = datetime.date(2024, 6, 1)
    assert passes(cost=Decimal("5.26"), ts=day, shop_id=1)
    assert not passes(cost=Decimal("5.25"), ts=day, shop_id=1)
    assert not passes(cost=Decimal("9.00"), ts=datetime.date(2025, 1, 1), shop_id=2)
    assert not passes(cost=None, ts=day, shop_id=2)
    assert not passes(cost=Decimal("9.00"), ts=day, shop_id=3)


# === refusals (fixture file) ===================================================================


def _refusal_cases() -> list[Any]:
    text = (FIXTURES / "refusals.sql").read_text()
    cases = []
    for match in re.finditer(r"^-- (\w+): (.+)\n((?:(?!--).*\n)*?.*;)$", text, re.MULTILINE):
        error, fragment, sql = match.groups()
        cases.append(pytest.param(error, fragment, sql.rstrip(";"), id=sql[:60]))
    return cases


REFUSALS = _refusal_cases()


def test_fixture_file_is_parsed() -> None:
    assert len(REFUSALS) >= 100


@pytest.mark.parametrize(("error", "fragment", "select"), REFUSALS)
def test_refusals(error: str, fragment: str, select: str) -> None:
    with pytest.raises(errors.AggviewError) as caught:
        compile_sql(f"CREATE MATERIALIZED VIEW v AS {select}", table)
    assert type(caught.value).__name__ == error, str(caught.value)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    "options", ["", " WITH (refresh = 'async')", " WITH (refresh = 'cumulus')"]
)
def test_a_row_limit_in_a_subquery_is_refused_in_every_mode(options: str) -> None:
    """A subquery's LIMIT was dropped with its ORDER BY (found 2026-12-03): every row of the
    subquery counted, a wrong view. Now refused, in every mode, naming the subquery."""
    select = (
        "SELECT count(*) FROM events WHERE prod_id IN "
        "(SELECT prod_id FROM products ORDER BY price LIMIT 3)"
    )
    with pytest.raises(errors.InvalidArgument, match="LIMIT is not supported .*: SELECT prod_id"):
        compile_sql_views(f"CREATE MATERIALIZED VIEW v{options} AS {select}", table)


def test_cumulus_refuses_a_view_over_a_one_row_subquery_alone() -> None:
    """Its row is SQL's even over no rows: an M3 program's maps start empty and never counted
    it (COUNT(*) 0 where SQL has 1; found 2026-12-03). Sync and async take it
    (``test_subquery_views``); beside a table, cumulus does too."""
    select = "SELECT count(*) AS n FROM (SELECT SUM(cost) AS t FROM events) d"
    for options in ("", " WITH (refresh = 'async')"):
        compile_sql_views(f"CREATE MATERIALIZED VIEW v{options} AS {select}", table)
    cumulus = " WITH (refresh = 'cumulus')"
    with pytest.raises(errors.InvalidArgument, match="a view over subqueries of one row alone"):
        compile_sql_views(f"CREATE MATERIALIZED VIEW v{cumulus} AS {select}", table)
    joined = "SELECT count(*) AS n FROM shops, (SELECT SUM(cost) AS t FROM events) d"
    compile_sql_views(f"CREATE MATERIALIZED VIEW v{cumulus} AS {joined}", table)


# === passes alone ==============================================================================


def test_check_supported_alone() -> None:
    check_support.check_supported(check_support.parse_select(DASHBOARD))
    with pytest.raises(errors.InvalidArgument, match="window function"):
        check_support.check_supported(
            check_support.parse_select("SELECT sum(x) OVER () FROM nowhere_needed")
        )


def test_resolve_tables_gives_each_on_clause_its_scope() -> None:
    select = check_support.parse_select(DASHBOARD)
    refs, scope, ons = resolve_tables.resolve_tables(select, table)
    assert [r.alias for r in refs] == ["e", "p", "c"]
    assert [list(s.tables) for _, s in ons] == [["e", "p"], ["e", "p", "c"]]
    assert scope.tables["c"] is CATALOG["categories"]


def test_unknown_table_from_a_dict_lookup() -> None:
    with pytest.raises(errors.UnknownTable, match="unknown table 'nope'"):
        compile_view(
            CreateView("v", False, "sync", 0, "SELECT count(*) FROM nope"), CATALOG.__getitem__
        )


def test_plan_where_alone() -> None:
    """Equalities of two tables' columns are edges; any other condition, in ON or WHERE and
    over one table or several (a theta join), is a filter; shops, linked by nothing, is a cross
    product."""
    select = check_support.parse_select(
        "SELECT count(*) FROM events e JOIN products p ON e.prod_id + 1 = p.prod_id "
        "AND e.shop_id < p.prod_id, shops s WHERE e.prod_id = p.prod_id AND e.cost > p.price"
    )
    refs, scope, ons = resolve_tables.resolve_tables(select, table)
    edges, filters = plan_joins.plan_where(select, scope, ons)
    assert [(str(e.left), str(e.right)) for e in edges] == [("e.prod_id", "p.prod_id")]
    assert [next(iter(f)) for f in filters] == ["cmp", "cmp", "cmp"]
    assert [f["cmp"] for f in filters] == ["=", "<", ">"]


def test_arithmetic_and_aggregate_type_rules_alone() -> None:
    dec = ColumnType.parse
    node = check_support.parse_select("SELECT 1").expressions[0]
    assert typerules.arithmetic_type("+", dec("INT"), dec("INT"), node) == dec("INT")
    assert typerules.arithmetic_type("-", dec("DECIMAL(5,1)"), dec("DECIMAL(10,3)"), node) == dec(
        "DECIMAL(38,3)"
    )
    assert typerules.arithmetic_type("*", dec("DECIMAL(5,1)"), dec("INT"), node) == dec(
        "DECIMAL(38,1)"
    )
    assert typerules.arithmetic_type("/", dec("INT"), dec("INT"), node) == dec("FLOAT")
    assert typerules.arithmetic_type("+", dec("FLOAT"), dec("DECIMAL(5,1)"), node) == dec("FLOAT")
    assert RULES[Kind.AVG].result_type(dec("DECIMAL(10,8)")) == dec("DECIMAL(38,8)")
    assert RULES[Kind.SUM].result_type(dec("FLOAT")) == dec("FLOAT")
    assert RULES[Kind.COUNT_DISTINCT].result_type(dec("TEXT")) == dec("INT")


# === plan JSON =================================================================================


def test_plan_json_round_trip_and_shape() -> None:
    plan = view(
        "SELECT c.name, SUM(e.cost), AVG(e.cost) FROM events e "
        "JOIN products p ON e.prod_id = p.prod_id JOIN categories c ON p.cat_id = c.cat_id "
        "WHERE e.ts >= DATE '2024-01-01' GROUP BY c.name HAVING count(*) > 2",
        "CREATE MATERIALIZED VIEW v WITH (refresh = 'async', interval_ms = 250) AS",
    )
    data = plan.to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["tables"][0] == {"alias": "e", "table": "events"}
    assert data["edges"][0] == {"left": ["e", "prod_id"], "right": ["p", "prod_id"]}
    assert data["group_by"][0] == {"name": "name", "ref": ["c", "name"], "type": "TEXT"}
    assert data["interval_ms"] == 250
    data["filters"][0]["args"][1]["lit"] = "2000-01-01"  # to_json hands out copies
    assert plan.filters[0]["args"][1]["lit"] == "2024-01-01"


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"format": 2}, "unsupported format"),
        ({"mode": "eager"}, "refresh must be sync, async or cumulus"),
        ({"interval_ms": 0}, "needs interval_ms"),
        ({"interval_ms": True}, "wrong type"),
        ({"tables": []}, "aliases must be present"),
        ({"output": ["nope"]}, "output 'nope' is not a view column"),
        ({"edges": [{"left": ["e", "x"], "right": ["e", "y"]}]}, "must join two aliases"),
        ({"group_by": [{"name": "n", "ref": ["c", "name"], "type": "decimal"}]}, "canonical"),
        ({"filters": [1]}, "filters must be objects"),
        ({"having": []}, "wrong type"),
    ],
)
def test_plan_from_json_refuses_corrupt_plans(change: dict[str, Any], fragment: str) -> None:
    data = {**view(DASHBOARD, "CREATE MATERIALIZED VIEW v WITH (refresh=async) AS").to_json()}
    data.update(change)
    with pytest.raises(errors.InvalidArgument, match=re.escape(fragment)):
        ViewPlan.from_json(data)


def test_aggregate_invariants() -> None:
    with pytest.raises(errors.InvalidArgument, match="only count_star"):
        Aggregate("x", "sum", None, None, "INT")
    with pytest.raises(errors.InvalidArgument, match="unknown kind"):
        Aggregate("x", "median", col("a", "b"), "INT", "INT")
    assert TableRef.of("events") == TableRef("events", "events")
    assert TableRef.of("events", "e") == TableRef("e", "events")


def test_changes_to_columns_a_view_does_not_read_are_skipped() -> None:
    from coordinator.views import touching

    plan = view(
        "SELECT c.name, SUM(e.cost) AS cost FROM events e JOIN products p ON e.prod_id = "
        "p.prod_id JOIN categories c ON p.cat_id = c.cat_id GROUP BY c.name"
    )
    event = {"event_id": 1, "prod_id": 2, "cost": 5, "ts": 0}
    changes = {
        "events": {
            b"a": (event, {**event, "ts": 1}),  # a column the view does not read
            b"b": (event, {**event, "cost": 6}),
            b"c": (None, event),
            b"d": (event, None),
        },
        "products": {b"p": ({"prod_id": 2, "name": "x"}, {"prod_id": 2, "name": "y"})},
        "shops": {b"s": (None, {"shop_id": 1})},  # not a table of the view
    }
    assert touching(plan, changes) == {
        "events": {k: changes["events"][k] for k in (b"b", b"c", b"d")}
    }
