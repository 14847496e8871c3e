"""Equi-joins and LEFT joins on key columns of every type (a join's columns have one kind:
the compiler refuses others; DECIMALs of one scale may differ in precision): the refresh
operator's states (``cumulus.delta.view_delta``, whose lookup step reads the joined table by
the bound row's value) equal duckdb's after every batch of inserts, updates and deletes,
either table first, NULL keys among them. A key stored in one exact form (INT, DECIMAL,
TEXT, DATE) of the looked-up column's own type is looked up as it is stored, any other
converted; either way the lookup gets the looked-up column's storage form."""

from __future__ import annotations

import asyncio
import datetime
import itertools
from decimal import Decimal
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_view_language import mirror, stored_changes

from aggview import errors
from aggview.keycodec import encode_key
from aggview.merge import combine
from aggview.schema import Column, ColumnType, TableSchema, row_to_storage
from cumulus.aggstate import ViewState
from cumulus.delta import view_delta
from cumulus.m3.compiler import plan_of

# a key column's SQL type and the values rows take in it (NULL included)
KEY_TYPES: dict[str, tuple[ColumnType, list[Any]]] = {
    "INT": (ColumnType("INT"), [None, 0, 1, 2, -3]),
    "DECIMAL(8,2)": (
        ColumnType("DECIMAL", 8, 2),
        [None, Decimal("1.00"), Decimal("2.50"), Decimal("-3.00"), Decimal("0.25")],
    ),
    "DECIMAL(10,2)": (
        ColumnType("DECIMAL", 10, 2),
        [None, Decimal("1.00"), Decimal("2.50"), Decimal("-3.00"), Decimal("12345678.25")],
    ),
    "DOUBLE": (ColumnType("FLOAT"), [None, 1.0, 2.5, -3.0, 0.25]),
    "TEXT": (ColumnType("TEXT"), [None, "a", "b", "", "a\x00b"]),
    "DATE": (
        ColumnType("DATE"),
        [None, datetime.date(2024, 2, 29), datetime.date(1970, 1, 1), datetime.date(1, 1, 1)],
    ),
}
# the Python type each stores its values as: what a lookup into it must be given
STORED = {"INT": int, "DECIMAL(8,2)": int, "DECIMAL(10,2)": int, "DOUBLE": float}
STORED |= {"TEXT": str, "DATE": int}
# pairs of key types a join may compare: each with itself, and DECIMALs of one scale
PAIRS = [(t, t) for t in KEY_TYPES] + [("DECIMAL(8,2)", "DECIMAL(10,2)")]
PAIRS += [("DECIMAL(10,2)", "DECIMAL(8,2)")]
KEY = {"l": "k", "r": "j"}  # each table's join column: the names differ


def _tables(left: str, right: str) -> dict[str, TableSchema]:
    def table(name: str, number: int, key_type: str) -> TableSchema:
        columns = (
            Column("id", ColumnType("INT"), nullable=False),
            Column(KEY[name], KEY_TYPES[key_type][0]),
            Column("v", ColumnType("INT")),
        )
        return TableSchema(name, f"t{number}", columns, ("id",))

    return {"l": table("l", 1, left), "r": table("r", 2, right)}


def test_a_join_of_columns_of_two_types_is_refused_naming_them() -> None:
    tables = _tables("INT", "DOUBLE")
    with pytest.raises(errors.TypeMismatch, match="compares INT with FLOAT"):
        plan_of("SELECT COUNT(*) FROM l JOIN r ON l.k = r.j", "q", tables.__getitem__)


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, str, str, list[list[tuple[str, int, Any]]]]:
    """A pair of key types, a view joining on them, and batches of changes: (table, id, new
    row's key value or DELETE)."""
    left, right = draw(st.sampled_from(PAIRS))
    group = draw(st.sampled_from(["l.k", "r.v", "l.v"]))
    join = draw(st.sampled_from(["JOIN", "LEFT JOIN"]))
    select = (
        f"SELECT {group} AS g, COUNT(*) AS n, SUM(r.v) AS s FROM l {join} r ON l.k = r.j "
        f"GROUP BY {group}"
    )
    change = st.tuples(
        st.sampled_from(["l", "r"]),
        st.integers(0, 5),
        st.one_of(st.just("DELETE"), st.integers(0, 4)),  # an index into the type's values
    )
    batches = draw(st.lists(st.lists(change, min_size=1, max_size=3), min_size=1, max_size=12))
    return left, right, select, batches


def _snapshot(before: dict[str, dict[bytes, dict[str, Any]]], types: dict[str, str]) -> Any:
    """Rows whose column equals one of some values, read from the snapshot before the batch
    (the operator patches the changed rows in): as an index lookup, a value matches only in
    the looked-up column's own storage form."""

    async def rows_where(
        table: str, column: str | None, wanted: list[Any]
    ) -> dict[Any, list[tuple[bytes, dict[str, Any]]]]:
        rows = list(before[table].items())
        if column is None:
            return {None: rows}
        kind = STORED[types[table]]
        assert all(type(value) is kind for value in wanted), (table, wanted)
        return {w: [(k, r) for k, r in rows if r.get(column) == w] for w in wanted}

    return rows_where


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_equi_joins_on_keys_of_any_types_equal_duckdb(
    case: tuple[str, str, str, list[list[tuple[str, int, Any]]]],
) -> None:
    left, right, select, batches = case
    tables = _tables(left, right)
    types = {"l": left, "r": right}
    plan = plan_of(select, "q", tables.__getitem__)
    state = ViewState(plan, tables.__getitem__)
    con = duckdb.connect()
    for name, key_type in types.items():
        con.execute(f"CREATE TABLE {name} (id INT, {KEY[name]} {key_type}, v INT)")
    live: dict[str, dict[int, dict[str, Any]]] = {"l": {}, "r": {}}
    states: dict[bytes, dict[str, Any]] = {}
    values = itertools.count(1)
    for batch in batches:
        changed: dict[tuple[str, int], tuple[Any, Any]] = {}  # one change a row a batch
        for name, row_id, what in batch:
            old = live[name].get(row_id)
            new = None
            if what != "DELETE":
                pool = KEY_TYPES[types[name]][1]
                new = {"id": row_id, KEY[name]: pool[what % len(pool)], "v": next(values)}
            if (name, row_id) in changed or (old is None and new is None):
                continue
            changed[(name, row_id)] = (old, new)
            mirror(con, live, name, row_id, new)
        changes = stored_changes(tables, changed)
        before = {
            name: {
                encode_key(tables[name].key_types, [i]): row_to_storage(tables[name], r)
                for i, r in rows.items()
                if (name, i) not in changed
            }
            for name, rows in live.items()
        }

        rows_where = _snapshot(before, types)
        for key, delta in asyncio.run(view_delta(state, changes, rows_where)).items():
            states[key] = combine(states.get(key, {}), delta)
        want = sorted(map(repr, con.execute(select).fetchall()))
        got = [state.finalize(k, s) for k, s in states.items() if s.get("_count")]
        assert sorted(repr(tuple(r.values())) for r in got if r is not None) == want, select
