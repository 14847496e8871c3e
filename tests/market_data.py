"""Two small schemas for ``test_market_shapes``, each with its random streams
(``shape_suite.Stream``): an order book and a star schema.

- ``ORDER_BOOK``: bids and asks of brokers (id, broker, price, volume), prices in a narrow
  band so that bids and asks cross, meet and come within a few ticks of each other; orders
  are placed, changed and cancelled (inserted, updated, deleted) in any order.
- ``STAR``: a fact table of order lines (``lineorder``) and four dimensions (``dates``,
  ``customer``, ``supplier``, ``part``) by surrogate keys; facts are loaded before their
  dimensions, and a fact may name a dimension row not inserted yet or already deleted.

Values come from small domains holding every constant the suite's queries compare with.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from shape_suite import Dataset


def _pick(*choices: Any) -> Callable[[random.Random], Any]:
    return lambda rng: rng.choice(choices)


def _money(high: int) -> Callable[[random.Random], Decimal]:
    return lambda rng: Decimal(rng.randrange(0, 100 * high)) / 100


_ORDER = [("id", "INT"), ("broker", "INT"), ("price", "INT"), ("volume", "INT")]
ORDER_BOOK = Dataset(
    "book",
    {"bids": _ORDER, "asks": _ORDER},
    {"bids": ("id",), "asks": ("id",)},
    ("bids", "asks"),
    {"bids": (range(14),), "asks": (range(14),)},
    {"bids": 6, "asks": 6},
    {
        "broker": _pick(0, 1, 2, 3),
        "price": _pick(97, 98, 99, 100, 101, 102, 103),
        "volume": _pick(1, 2, 5, 10, 20),
    },
)

_CITIES = ("UNITED KI1", "UNITED KI5", "CHINA    3", "PERU     0")
_NATIONS = ("UNITED KINGDOM", "CHINA", "PERU", "UNITED STATES")
_REGIONS = ("EUROPE", "ASIA", "AMERICA")
_DIMENSION_KEYS = {"dates": range(6), "customer": range(4), "supplier": range(3), "part": range(4)}


def _key(table: str) -> Callable[[random.Random], int]:
    return lambda rng: rng.choice(_DIMENSION_KEYS[table])


STAR = Dataset(
    "star",
    {
        "lineorder": [
            ("lo_orderkey", "INT"),
            ("lo_linenumber", "INT"),
            ("lo_custkey", "INT"),
            ("lo_partkey", "INT"),
            ("lo_suppkey", "INT"),
            ("lo_orderdate", "INT"),
            ("lo_quantity", "INT"),
            ("lo_extendedprice", "DECIMAL(12,2)"),
            ("lo_discount", "INT"),
            ("lo_revenue", "DECIMAL(12,2)"),
            ("lo_supplycost", "DECIMAL(12,2)"),
        ],
        "dates": [("d_datekey", "INT"), ("d_year", "INT"), ("d_month", "TEXT")],
        "customer": [
            ("c_custkey", "INT"),
            ("c_city", "TEXT"),
            ("c_nation", "TEXT"),
            ("c_region", "TEXT"),
        ],
        "supplier": [
            ("s_suppkey", "INT"),
            ("s_city", "TEXT"),
            ("s_nation", "TEXT"),
            ("s_region", "TEXT"),
        ],
        "part": [
            ("p_partkey", "INT"),
            ("p_mfgr", "TEXT"),
            ("p_category", "TEXT"),
            ("p_brand", "TEXT"),
        ],
    },
    {
        "lineorder": ("lo_orderkey", "lo_linenumber"),
        "dates": ("d_datekey",),
        "customer": ("c_custkey",),
        "supplier": ("s_suppkey",),
        "part": ("p_partkey",),
    },
    ("lineorder", "dates", "customer", "supplier", "part"),
    {
        "lineorder": (range(6), range(1, 5)),
        **{table: (keys,) for table, keys in _DIMENSION_KEYS.items()},
    },
    {"lineorder": 16, "dates": 5},
    {
        "lo_custkey": _key("customer"),
        "lo_partkey": _key("part"),
        "lo_suppkey": _key("supplier"),
        "lo_orderdate": _key("dates"),
        "lo_quantity": _pick(1, 10, 24, 25, 30, 40),
        "lo_extendedprice": _money(90),
        "lo_discount": _pick(0, 1, 3, 4, 6),
        "lo_revenue": _money(80),
        "lo_supplycost": _money(40),
        "d_year": _pick(1992, 1993, 1995, 1997, 1998),
        "d_month": _pick("Jan", "Jul", "Dec"),
        "c_city": _pick(*_CITIES),
        "c_nation": _pick(*_NATIONS),
        "c_region": _pick(*_REGIONS),
        "s_city": _pick(*_CITIES),
        "s_nation": _pick(*_NATIONS),
        "s_region": _pick(*_REGIONS),
        "p_mfgr": _pick("MFGR#1", "MFGR#2", "MFGR#3"),
        "p_category": _pick("MFGR#11", "MFGR#12", "MFGR#21"),
        "p_brand": _pick("MFGR#121", "MFGR#122", "MFGR#2221"),
    },
)
