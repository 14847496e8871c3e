"""A small TPC-H-like schema and a random stream of changes to it, for ``test_tpch_shapes``.

Eight tables with TPC-H's names and the columns the 22 queries read (the queries take
EXTRACT(YEAR ...) of the dates and SUBSTRING of the phone number themselves), composite
primary keys where TPC-H has them. Values come from small domains
that contain every constant the queries compare with, and dates from a list that holds each
boundary date of their ranges and a day either side, so a handful of rows per table reaches
every branch of every predicate.

Its streams (``shape_suite.Stream``): an initial load with children before parents (line
items before their orders, orders before their customers, ..., regions last), then random
batches of inserts, deletes and updates.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from shape_suite import Dataset

# table -> [(column, type)], its primary key; types as both our DDL and duckdb's take them
COLUMNS: dict[str, list[tuple[str, str]]] = {
    "region": [("r_regionkey", "INT"), ("r_name", "TEXT")],
    "nation": [("n_nationkey", "INT"), ("n_name", "TEXT"), ("n_regionkey", "INT")],
    "supplier": [
        ("s_suppkey", "INT"),
        ("s_name", "TEXT"),
        ("s_address", "TEXT"),
        ("s_nationkey", "INT"),
        ("s_acctbal", "DECIMAL(12,2)"),
        ("s_comment", "TEXT"),
    ],
    "customer": [
        ("c_custkey", "INT"),
        ("c_name", "TEXT"),
        ("c_nationkey", "INT"),
        ("c_phone", "TEXT"),  # Q22's country code is SUBSTRING(c_phone FROM 1 FOR 2)
        ("c_acctbal", "DECIMAL(12,2)"),
        ("c_mktsegment", "TEXT"),
    ],
    "part": [
        ("p_partkey", "INT"),
        ("p_name", "TEXT"),
        ("p_mfgr", "TEXT"),
        ("p_brand", "TEXT"),
        ("p_type", "TEXT"),
        ("p_size", "INT"),
        ("p_container", "TEXT"),
        ("p_retailprice", "DECIMAL(12,2)"),
    ],
    "partsupp": [
        ("ps_partkey", "INT"),
        ("ps_suppkey", "INT"),
        ("ps_availqty", "INT"),
        ("ps_supplycost", "DECIMAL(12,2)"),
    ],
    "orders": [
        ("o_orderkey", "INT"),
        ("o_custkey", "INT"),
        ("o_orderstatus", "TEXT"),
        ("o_totalprice", "DECIMAL(12,2)"),
        ("o_orderdate", "DATE"),
        ("o_orderpriority", "TEXT"),
        ("o_shippriority", "INT"),
        ("o_comment", "TEXT"),
    ],
    "lineitem": [
        ("l_orderkey", "INT"),
        ("l_linenumber", "INT"),
        ("l_partkey", "INT"),
        ("l_suppkey", "INT"),
        ("l_quantity", "DECIMAL(12,2)"),
        ("l_extendedprice", "DECIMAL(12,2)"),
        ("l_discount", "DECIMAL(12,2)"),
        ("l_tax", "DECIMAL(12,2)"),
        ("l_returnflag", "TEXT"),
        ("l_linestatus", "TEXT"),
        ("l_shipdate", "DATE"),
        ("l_commitdate", "DATE"),
        ("l_receiptdate", "DATE"),
        ("l_shipinstruct", "TEXT"),
        ("l_shipmode", "TEXT"),
    ],
}
PRIMARY_KEYS: dict[str, tuple[str, ...]] = {
    "region": ("r_regionkey",),
    "nation": ("n_nationkey",),
    "supplier": ("s_suppkey",),
    "customer": ("c_custkey",),
    "part": ("p_partkey",),
    "partsupp": ("ps_partkey", "ps_suppkey"),
    "orders": ("o_orderkey",),
    "lineitem": ("l_orderkey", "l_linenumber"),
}
# the order of an initial load: every child before its parents
CHILDREN_FIRST = ("lineitem", "partsupp", "orders", "customer", "supplier", "part", "nation")
CHILDREN_FIRST += ("region",)

# key domains: (a range per key column); foreign keys are drawn from the parent's
DOMAINS: dict[str, tuple[range, ...]] = {
    "region": (range(2),),
    "nation": (range(3),),
    "supplier": (range(3),),
    "customer": (range(4),),
    "part": (range(4),),
    "partsupp": (range(4), range(3)),
    "orders": (range(6),),
    "lineitem": (range(6), range(1, 6)),
}
ROWS = {"lineitem": 20, "orders": 5, "partsupp": 8}  # an initial load's rows (3 elsewhere)

_DAYS = [
    "1993-07-01", "1993-10-01", "1993-12-31", "1994-01-01", "1994-12-31", "1995-03-15",
    "1995-03-16", "1995-09-01", "1995-10-01", "1996-01-01", "1996-04-01", "1998-09-03",
]  # fmt: skip
DATES = [datetime.date.fromisoformat(d) for d in _DAYS]


def _money(rng: random.Random, high: int) -> Decimal:
    return Decimal(rng.randrange(-high, 100 * high)) / 100


def _values() -> dict[str, Callable[[random.Random], Any]]:
    """A random value per non-key column (foreign keys from the parent's domain)."""

    def pick(*choices: Any) -> Callable[[random.Random], Any]:
        return lambda rng: rng.choice(choices)

    def key_of(table: str) -> Callable[[random.Random], Any]:
        return lambda rng: rng.choice(DOMAINS[table][0])

    return {
        "r_name": pick("AMERICA", "ASIA", "EUROPE"),
        "n_name": pick("BRAZIL", "CANADA", "FRANCE", "GERMANY", "SAUDI ARABIA"),
        "n_regionkey": key_of("region"),
        "s_name": pick("Supplier#1", "Supplier#2", "Supplier#3", "Supplier#4"),
        "s_address": pick("north", "south"),
        "s_nationkey": key_of("nation"),
        "s_acctbal": lambda rng: _money(rng, 50),
        "s_comment": pick("Customer slow; Complaints noted", "careful deposits", "Customer ok"),
        "c_name": pick("Customer#1", "Customer#2", "Customer#3"),
        "c_nationkey": key_of("nation"),
        "c_phone": pick("13-555-0101", "17-555-0102", "31-555-0103", "99-555-0104"),
        "c_acctbal": lambda rng: _money(rng, 50),
        "c_mktsegment": pick("BUILDING", "AUTOMOBILE"),
        "p_name": pick("forest green", "misty forest", "ivory"),
        "p_mfgr": pick("Manufacturer#1", "Manufacturer#2"),
        "p_brand": pick("Brand#12", "Brand#23", "Brand#34", "Brand#45"),
        "p_type": pick(
            "ECONOMY ANODIZED STEEL",
            "PROMO BRUSHED BRASS",
            "STANDARD POLISHED BRASS",
            "MEDIUM POLISHED TIN",
        ),
        "p_size": pick(1, 3, 5, 9, 15, 49),
        "p_container": pick("SM CASE", "MED BOX", "LG BOX"),
        "p_retailprice": lambda rng: _money(rng, 20),
        "ps_availqty": lambda rng: rng.randrange(0, 60),
        "ps_supplycost": lambda rng: _money(rng, 10),
        "o_custkey": key_of("customer"),
        "o_orderstatus": pick("F", "O"),
        "o_totalprice": lambda rng: _money(rng, 100),
        "o_orderdate": pick(*DATES),
        "o_orderpriority": pick("1-URGENT", "2-HIGH", "3-MEDIUM"),
        "o_shippriority": pick(0, 1),
        "o_comment": pick("special requests pending", "no special requests", "quick"),
        "l_partkey": key_of("part"),
        "l_suppkey": key_of("supplier"),
        "l_quantity": lambda rng: Decimal(rng.choice([1, 2, 5, 10, 11, 20, 30, 40])),
        "l_extendedprice": lambda rng: _money(rng, 50),
        "l_discount": lambda rng: Decimal(rng.choice([0, 4, 5, 6, 7, 8])) / 100,
        "l_tax": lambda rng: Decimal(rng.choice([0, 2, 8])) / 100,
        "l_returnflag": pick("A", "N", "R"),
        "l_linestatus": pick("F", "O"),
        "l_shipdate": pick(*DATES),
        "l_commitdate": pick(*DATES),
        "l_receiptdate": pick(*DATES),
        "l_shipinstruct": pick("DELIVER IN PERSON", "NONE"),
        "l_shipmode": pick("AIR", "AIR REG", "MAIL", "SHIP", "TRUCK"),
    }


VALUES = _values()
TPCH = Dataset("tpch", COLUMNS, PRIMARY_KEYS, CHILDREN_FIRST, DOMAINS, ROWS, VALUES)
