"""Client operations turned into row operations (``coordinator.convert.row_op``): the bounds an
ADD carries for its columns, made once per table's schema, and keys checked by name."""

from __future__ import annotations

import pytest

from aggclient.rows import Transaction
from aggview import errors
from aggview.rowcodec import decode_json
from aggview.schema import Column, ColumnType, TableSchema
from coordinator.convert import Limits, row_op


def _schema(score_type: str) -> TableSchema:
    columns = (
        Column("id", ColumnType.from_json("INT"), False),
        Column("n", ColumnType.from_json("INT"), False),
        Column("score", ColumnType.from_json(score_type), False),
    )
    return TableSchema("t", "t1", columns, ("id",))


def _add(schema: TableSchema, key: dict, values: dict) -> dict:
    tx = Transaction()
    tx.add("t", key, values)
    return decode_json(row_op(tx.operations[0], lambda name: schema, Limits()).limits)


def test_an_add_carries_each_column_s_bound_for_the_schema_it_was_made_under() -> None:
    narrow = _schema("DECIMAL(5,2)")
    assert _add(narrow, {"id": 1}, {"n": 1, "score": "1.00"}) == {"n": 2**63, "score": 10**5}
    assert _add(narrow, {"id": 2}, {"score": "1.00"}) == {"score": 10**5}
    # the same table id under another schema (its columns changed): that schema's bounds
    wide = _schema("DECIMAL(30,2)")
    assert _add(wide, {"id": 1}, {"n": 1, "score": "1.00"}) == {"n": 2**63, "score": 10**30}
    assert _add(narrow, {"id": 1}, {"n": 1, "score": "1.00"}) == {"n": 2**63, "score": 10**5}


@pytest.mark.parametrize(
    ("key", "reason"),
    [({}, "missing id"), ({"id": 1, "n": 2}, "extra n"), ({"n": 2}, "missing id; extra n")],
)
def test_a_key_that_is_not_the_primary_key_is_refused_naming_what_differs(
    key: dict, reason: str
) -> None:
    with pytest.raises(errors.InvalidArgument, match=reason):
        _add(_schema("INT"), key, {"n": 1})
