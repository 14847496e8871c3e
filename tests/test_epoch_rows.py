"""A Cumulus view's rows kept across epochs (``cumulus.m3.epoch_rows``): at every epoch equal to
reading every group of the same maps, under random inserts and deletes of both tables (groups
appear, change, vanish and come back; HAVING drops and keeps them), and read whole where a
view's rows are not read group by group."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.catalog import table_from_create
from cumulus.m3.epoch_rows import EpochRows, group_keyed_maps
from cumulus.m3.interpreter import Interpreter
from cumulus.m3.readout import read_groups
from cumulus.runtime.replay import compile_views

SCHEMA = """
CREATE TABLE shops (id INT PRIMARY KEY, region TEXT NOT NULL);
CREATE TABLE sales (id INT PRIMARY KEY, shop_id INT NOT NULL, item TEXT NOT NULL,
                    amount DECIMAL(10,2) NOT NULL, qty INT);
"""

BY_GROUP = {  # read group by group
    "join": "SELECT h.region, s.item, SUM(s.amount) AS total, COUNT(*) AS n, AVG(s.qty) AS q "
    "FROM sales s JOIN shops h ON s.shop_id = h.id GROUP BY h.region, s.item",
    "having": "SELECT s.item, SUM(s.qty) AS q FROM sales s GROUP BY s.item HAVING COUNT(*) > 1",
    "derived": "SELECT s.shop_id, SUM(s.amount) * 2 AS twice, COUNT(s.qty) AS counted "
    "FROM sales s GROUP BY s.shop_id",
    "no group": "SELECT SUM(s.amount) AS total, COUNT(*) AS n FROM sales s",
    "bag": "SELECT s.item, s.shop_id FROM sales s",
    "distinct": "SELECT DISTINCT h.region FROM sales s JOIN shops h ON s.shop_id = h.id",
}
WHOLE = {  # read whole every epoch
    "max": "SELECT s.item, MAX(s.amount) AS top FROM sales s GROUP BY s.item",
    "scalar": "SELECT s.item, SUM(s.qty) AS q FROM sales s GROUP BY s.item "
    "HAVING SUM(s.qty) > (SELECT SUM(t.qty) FROM sales t) / 4",
}

ITEMS = ["a", "b", "c"]
sale = st.tuples(
    st.integers(0, 11),  # id
    st.integers(0, 2),  # shop
    st.sampled_from(ITEMS),
    st.sampled_from([Decimal("1.00"), Decimal("2.50"), Decimal("-1.00")]),
    st.one_of(st.none(), st.integers(0, 3)),
)
change = st.one_of(
    st.tuples(st.just("sale"), sale),
    st.tuples(st.just("shop"), st.integers(0, 2), st.sampled_from(["north", "south"])),
    st.tuples(st.just("epoch")),
)


def _counted(rows: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(sorted(r.items())) for r in rows)


def _run(name: str, sql: str, changes: list[tuple[Any, ...]]) -> int:
    program, _ = compile_views(SCHEMA, [(name, sql)], table_from_create)
    view = program.views[0]
    reference = Interpreter(program)
    rows = EpochRows(view)
    sales: dict[int, tuple[Any, ...]] = {}
    shops: dict[int, str] = {}
    read_again = 0
    for kind, *rest in [*changes, ("epoch",)]:
        if kind == "sale":  # an insert, or a delete of the row with that id
            row = rest[0]
            if row[0] in sales:
                reference.apply("-", "sales", sales.pop(row[0]))
            else:
                reference.apply("+", "sales", row)
                sales[row[0]] = row
        elif kind == "shop":  # a shop's region, set or moved (if the view reads shops)
            if not any(source.name == "shops" for source in program.sources):
                continue
            shop, region = rest
            if shop in shops:
                reference.apply("-", "shops", (shop, shops.pop(shop)))
            reference.apply("+", "shops", (shop, region))
            shops[shop] = region
        else:
            maps = {m: dict(store.data) for m, store in reference.maps.items()}
            whole = read_groups(reference, view)
            got = rows.read(maps, lambda whole=whole: dict(whole))
            assert _counted(got) == _counted(list(whole.values()))
            read_again += rows.groups_read
    return read_again


@pytest.mark.parametrize("name", sorted(BY_GROUP))
def test_only_a_view_read_by_group_is_read_by_group(name: str) -> None:
    program, _ = compile_views(SCHEMA, [(name, BY_GROUP[name])], table_from_create)
    assert group_keyed_maps(program.views[0]) is not None
    for other in sorted(WHOLE):
        program, _ = compile_views(SCHEMA, [(other, WHOLE[other])], table_from_create)
        assert group_keyed_maps(program.views[0]) is None, other


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted({**BY_GROUP, **WHOLE})), st.lists(change, max_size=40))
def test_rows_kept_across_epochs_equal_every_group_read_again(name: str, changes) -> None:
    _run(name, {**BY_GROUP, **WHOLE}[name], changes)


def test_an_epoch_reads_again_only_the_groups_that_changed() -> None:
    changes: list[tuple[Any, ...]] = [("shop", 0, "north"), ("shop", 1, "south")]
    changes += [("sale", (i, i % 2, ITEMS[i % 3], Decimal("1.00"), 1)) for i in range(6)]
    changes += [("epoch",), ("sale", (9, 0, "a", Decimal("2.50"), None)), ("epoch",)]
    # six groups at the first epoch (a whole read), one at the second, none at the last
    assert _run("join", BY_GROUP["join"], changes) == 6 + 1 + 0
