"""Column types, schemas and every rule of the Python value <-> storage form conversion."""

from __future__ import annotations

import datetime
import json
import re
from decimal import Decimal

import pytest

from aggview.errors import InvalidArgument, TypeMismatch, UnknownColumn
from aggview.schema import (
    Column,
    ColumnType,
    TableSchema,
    from_storage,
    key_to_storage,
    prefix_to_storage,
    row_to_storage,
    to_storage,
)

INT = ColumnType("INT")
FLOAT = ColumnType("FLOAT")
TEXT = ColumnType("TEXT")
DATE = ColumnType("DATE")
BOOL = ColumnType("BOOL")
MONEY = ColumnType("DECIMAL", 12, 2)


def col(type_: ColumnType, nullable: bool = True, name: str = "c") -> Column:
    return Column(name, type_, nullable)


# --- column types ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("INT", "INT"),
        ("integer", "INT"),
        ("BigInt", "INT"),
        ("smallint", "INT"),
        ("DECIMAL", "DECIMAL(18,0)"),
        ("decimal(10,2)", "DECIMAL(10,2)"),
        (" NUMERIC ( 38 , 38 ) ", "DECIMAL(38,38)"),
        ("DECIMAL(7)", "DECIMAL(7,0)"),
        ("numeric", "DECIMAL(18,0)"),
        ("FLOAT", "FLOAT"),
        ("double", "FLOAT"),
        ("REAL", "FLOAT"),
        ("double  precision", "FLOAT"),
        ("TEXT", "TEXT"),
        ("varchar", "TEXT"),
        ("VARCHAR(255)", "TEXT"),
        ("string", "TEXT"),
        ("CHAR(3)", "TEXT"),
        ("date", "DATE"),
        ("BOOL", "BOOL"),
        ("boolean", "BOOL"),
    ],
)
def test_parse_spellings(text: str, expected: str) -> None:
    parsed = ColumnType.parse(text)
    assert str(parsed) == expected
    assert ColumnType.parse(str(parsed)) == parsed


@pytest.mark.parametrize(
    "text",
    [
        "BLOB",
        "TIMESTAMP",
        "INT(4)",
        "DECIMAL(0,0)",
        "DECIMAL(39,0)",
        "DECIMAL(5,6)",
        "DECIMAL(1,2,3)",
        "DECIMAL(",
        "VARCHAR(1,2)",
        "DOUBLE TROUBLE",
        "",
        "FLOAT(8)",
        "DATE()",
    ],
)
def test_parse_refuses(text: str) -> None:
    with pytest.raises(InvalidArgument):
        ColumnType.parse(text)


def test_parse_error_names_the_type() -> None:
    with pytest.raises(InvalidArgument, match=re.escape("unsupported column type 'BLOB'")):
        ColumnType.parse("BLOB")


def test_column_type_fields() -> None:
    assert ColumnType.parse("DECIMAL(10,2)") == ColumnType("DECIMAL", 10, 2)
    assert ColumnType("DECIMAL") == ColumnType("DECIMAL", 18, 0)
    assert ColumnType("INT").precision is None
    with pytest.raises(InvalidArgument):
        ColumnType("INT", 5)
    with pytest.raises(InvalidArgument):
        ColumnType("STRING")
    assert ColumnType.from_json(MONEY.to_json()) == MONEY
    assert MONEY.to_json() == "DECIMAL(12,2)"


# --- table schemas ---------------------------------------------------------------------------


def accounts() -> TableSchema:
    return TableSchema.build(
        "accounts",
        "tbl_1",
        [
            Column("region", TEXT),
            Column("id", INT),
            Column("balance", MONEY, nullable=False),
            Column("opened", DATE),
            Column("active", BOOL),
            Column("score", FLOAT),
        ],
        ["region", "id"],
    )


def three_key() -> TableSchema:
    return TableSchema.build(
        "t",
        "t1",
        [Column("a", INT), Column("b", TEXT), Column("c", DATE), Column("x", INT)],
        ("a", "b", "c"),
    )


def test_build_forces_key_columns_not_null() -> None:
    schema = accounts()
    assert schema.column("region").nullable is False
    assert schema.column("id").nullable is False
    assert schema.column("opened").nullable is True
    assert schema.key_types == (TEXT, INT)
    assert schema.column_names == ("region", "id", "balance", "opened", "active", "score")
    assert TableSchema.build("t", "t1", [Column("id", INT)], "id").primary_key == ("id",)


def test_unknown_column() -> None:
    with pytest.raises(UnknownColumn, match=re.escape("table accounts has no column 'nope'")):
        accounts().column("nope")


@pytest.mark.parametrize(
    ("columns", "key", "message"),
    [
        ([], ["id"], "at least one column"),
        ([Column("id", INT), Column("id", TEXT)], ["id"], "two columns named 'id'"),
        ([Column("id", INT)], [], "must have a primary key"),
        ([Column("id", INT)], ["other"], "'other' is not a column"),
        ([Column("id", INT)], ["id", "id"], "repeats"),
        ([Column("", INT)], ["id"], "non-empty"),
    ],
)
def test_build_validates(columns: list[Column], key: list[str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        TableSchema.build("t", "t1", columns, key)


def test_direct_construction_refuses_nullable_key() -> None:
    with pytest.raises(InvalidArgument, match="must be NOT NULL"):
        TableSchema("t", "t1", (Column("id", INT),), ("id",))


def test_float_key_is_allowed() -> None:
    schema = TableSchema.build("t", "t1", [Column("f", FLOAT)], ["f"])
    assert schema.key_types == (FLOAT,)


def test_schema_json_round_trip() -> None:
    schema = accounts()
    data = json.loads(json.dumps(schema.to_json()))
    assert TableSchema.from_json(data) == schema
    assert data["columns"][2] == {"name": "balance", "type": "DECIMAL(12,2)", "nullable": False}
    assert data["primary_key"] == ["region", "id"]


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"name": "t"},
        {"name": "t", "table_id": "t1", "columns": "x", "primary_key": []},
        {"name": "t", "table_id": "t1", "columns": [{"name": "a"}], "primary_key": ["a"]},
        {
            "name": "t",
            "table_id": "t1",
            "columns": [{"name": "a", "type": "BLOB"}],
            "primary_key": ["a"],
        },
    ],
)
def test_schema_from_json_refuses_malformed(data: object) -> None:
    with pytest.raises(InvalidArgument):
        TableSchema.from_json(data)


# --- to_storage / from_storage ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("type_", "value", "stored", "back"),
    [
        (INT, 42, 42, 42),
        (INT, -(2**63), -(2**63), -(2**63)),
        (INT, 2**63 - 1, 2**63 - 1, 2**63 - 1),
        (MONEY, Decimal("12.5"), 1250, Decimal("12.50")),
        (MONEY, Decimal("1.50"), 150, Decimal("1.50")),
        (MONEY, Decimal("1.500000"), 150, Decimal("1.50")),
        (MONEY, "1.50", 150, Decimal("1.50")),
        (MONEY, " -0.07 ", -7, Decimal("-0.07")),
        (MONEY, "1e2", 10000, Decimal("100.00")),
        (MONEY, 7, 700, Decimal("7.00")),
        (MONEY, Decimal("-0"), 0, Decimal("0.00")),
        (MONEY, Decimal("0E-50"), 0, Decimal("0.00")),
        (MONEY, Decimal("9999999999.99"), 999999999999, Decimal("9999999999.99")),
        (MONEY, Decimal("1.2E+3"), 120000, Decimal("1200.00")),
        (ColumnType("DECIMAL", 38, 0), "9" * 38, 10**38 - 1, Decimal("9" * 38)),
        (ColumnType("DECIMAL", 38, 38), "0." + "1" * 38, int("1" * 38), Decimal("0." + "1" * 38)),
        (ColumnType("DECIMAL"), 123, 123, Decimal(123)),
        (FLOAT, 1.5, 1.5, 1.5),
        (FLOAT, 3, 3.0, 3.0),
        (FLOAT, float("inf"), float("inf"), float("inf")),
        (TEXT, "héllo\x00", "héllo\x00", "héllo\x00"),
        (DATE, datetime.date(1970, 1, 2), 1, datetime.date(1970, 1, 2)),
        (DATE, datetime.date(1969, 12, 31), -1, datetime.date(1969, 12, 31)),
        (DATE, "2024-02-29", 19782, datetime.date(2024, 2, 29)),
        (DATE, datetime.date.min, -719162, datetime.date.min),
        (BOOL, True, True, True),
        (BOOL, False, False, False),
    ],
)
def test_conversions(type_: ColumnType, value: object, stored: object, back: object) -> None:
    got = to_storage(col(type_), value, table="t")
    assert got == stored and type(got) is type(stored)
    assert json.loads(json.dumps(got)) == got
    result = from_storage(type_, got)
    assert result == back and type(result) is type(back)
    if isinstance(back, Decimal):
        assert str(result) == str(back)  # exactly `scale` fractional digits


def test_negative_zero_float_is_stored_as_zero() -> None:
    stored = to_storage(col(FLOAT), -0.0, table="t")
    assert str(stored) == "0.0"


def test_decimal_storage_orders_like_the_numbers() -> None:
    values = ["-10.01", "-10", "-0.01", "0", "0.01", "9.99", "10"]
    stored = [to_storage(col(MONEY), v, table="t") for v in values]
    assert stored == sorted(stored)


def test_date_storage_orders_like_dates() -> None:
    dates = ["1900-01-01", "1969-12-31", "1970-01-01", "2000-02-29", "9999-12-31"]
    stored = [to_storage(col(DATE), d, table="t") for d in dates]
    assert stored == sorted(stored)


@pytest.mark.parametrize(
    ("type_", "value", "message"),
    [
        (MONEY, True, "column accounts.balance is DECIMAL(12,2); got bool True"),
        (MONEY, Decimal("1.005"), "got Decimal 1.005, which has more than 2 fractional digits"),
        (MONEY, "1.001", "got str '1.001', which has more than 2 fractional digits"),
        (MONEY, Decimal("1E-30"), "more than 2 fractional digits"),
        (MONEY, Decimal("10000000000"), "which needs more than 10 integer digits"),
        (MONEY, Decimal("-10000000000.00"), "which needs more than 10 integer digits"),
        (MONEY, Decimal("1E+1000000"), "which needs more than 10 integer digits"),
        (MONEY, Decimal("NaN"), "which is not a finite number"),
        (MONEY, Decimal("Infinity"), "which is not a finite number"),
        (MONEY, "NaN", "which is not a decimal number"),
        (MONEY, "1,5", "which is not a decimal number"),
        (MONEY, "1_000", "which is not a decimal number"),
        (MONEY, "", "which is not a decimal number"),
        (MONEY, 1.5, "is DECIMAL(12,2); got float 1.5"),
        (ColumnType("DECIMAL", 3, 3), 1, "needs more than 0 integer digits"),
        (INT, True, "column accounts.balance is INT; got bool True"),
        (INT, 1.0, "is INT; got float 1.0"),
        (INT, "1", "is INT; got str '1'"),
        (INT, Decimal(1), "is INT; got Decimal 1"),
        (INT, 2**63, "does not fit in 64 bits"),
        (INT, -(2**63) - 1, "does not fit in 64 bits"),
        (FLOAT, False, "is FLOAT; got bool False"),
        (FLOAT, "1.5", "is FLOAT; got str '1.5'"),
        (FLOAT, float("nan"), "which is not a number"),
        (FLOAT, 10**400, "too large for a FLOAT"),
        (FLOAT, Decimal("1.5"), "is FLOAT; got Decimal 1.5"),
        (TEXT, 5, "is TEXT; got int 5"),
        (TEXT, b"x", "is TEXT; got bytes b'x'"),
        (TEXT, "\ud800", "not valid Unicode"),
        (DATE, datetime.datetime(2024, 1, 1), "is DATE; got datetime 2024-01-01 00:00:00"),
        (DATE, "2024-02-30", "which is not an ISO-8601 date YYYY-MM-DD"),
        (DATE, "20240101", "which is not an ISO-8601 date"),
        (DATE, "2024-1-1", "which is not an ISO-8601 date"),
        (DATE, "2024-01-01T00:00", "which is not an ISO-8601 date"),
        (DATE, 19000, "is DATE; got int 19000"),
        (BOOL, 1, "is BOOL; got int 1"),
        (BOOL, "true", "is BOOL; got str 'true'"),
    ],
)
def test_type_mismatch_messages(type_: ColumnType, value: object, message: str) -> None:
    with pytest.raises(TypeMismatch, match=re.escape(message)) as info:
        to_storage(Column("balance", type_), value, table="accounts")
    assert f"column accounts.balance is {type_}" in str(info.value)


def test_long_values_are_abbreviated_in_messages() -> None:
    with pytest.raises(TypeMismatch) as info:
        to_storage(col(INT), "x" * 10_000, table="t")
    assert len(str(info.value)) < 200


def test_null_handling() -> None:
    assert to_storage(col(INT), None, table="t") is None
    assert from_storage(INT, None) is None
    with pytest.raises(TypeMismatch, match=re.escape("column t.c is NOT NULL")):
        to_storage(col(INT, nullable=False), None, table="t")


@pytest.mark.parametrize(
    ("type_", "stored"),
    [(INT, "1"), (MONEY, 1.5), (TEXT, 1), (BOOL, 1), (DATE, True), (DATE, 10**9), (FLOAT, "x")],
)
def test_from_storage_refuses_wrong_stored_types(type_: ColumnType, stored: object) -> None:
    with pytest.raises(TypeMismatch):
        from_storage(type_, stored)


# --- rows, keys and prefixes -----------------------------------------------------------------


def test_row_to_storage() -> None:
    row = {
        "region": "eu",
        "id": 7,
        "balance": Decimal("10.10"),
        "opened": "2024-01-31",
        "active": True,
    }
    assert row_to_storage(accounts(), row) == {
        "region": "eu",
        "id": 7,
        "balance": 1010,
        "opened": 19753,
        "active": True,
        "score": None,
    }


def test_row_to_storage_errors() -> None:
    schema = accounts()
    good = {"region": "eu", "id": 7, "balance": "1.00"}
    with pytest.raises(UnknownColumn, match="table accounts has no column 'color'"):
        row_to_storage(schema, {**good, "color": "red"})
    with pytest.raises(InvalidArgument, match="lacks primary key column 'id'"):
        row_to_storage(schema, {"region": "eu", "balance": "1.00"})
    with pytest.raises(TypeMismatch, match=re.escape("column accounts.balance is NOT NULL")):
        row_to_storage(schema, {"region": "eu", "id": 7})
    with pytest.raises(TypeMismatch, match=re.escape("column accounts.id is NOT NULL")):
        row_to_storage(schema, {**good, "id": None})
    with pytest.raises(TypeMismatch, match=re.escape("column accounts.id is INT; got bool True")):
        row_to_storage(schema, {**good, "id": True})
    with pytest.raises(TypeMismatch, match="does not fit in 64 bits"):
        row_to_storage(schema, {**good, "id": 2**63})
    # an int is stored as it is only in an INT column: a DECIMAL(12,2) scales it
    assert row_to_storage(schema, {**good, "balance": 3})["balance"] == 300


def test_key_to_storage() -> None:
    schema = accounts()
    assert key_to_storage(schema, {"id": 7, "region": "eu"}) == ("eu", 7)
    with pytest.raises(InvalidArgument, match="missing id"):
        key_to_storage(schema, {"region": "eu"})
    with pytest.raises(InvalidArgument, match="extra balance"):
        key_to_storage(schema, {"region": "eu", "id": 7, "balance": 1})
    with pytest.raises(InvalidArgument, match=re.escape("(region, id); missing id; extra x")):
        key_to_storage(schema, {"region": "eu", "x": 7})
    with pytest.raises(TypeMismatch, match="NOT NULL"):
        key_to_storage(schema, {"region": None, "id": 7})


def test_prefix_to_storage() -> None:
    schema = three_key()
    assert prefix_to_storage(schema, {}) == ()
    assert prefix_to_storage(schema, {"a": 1}) == (1,)
    assert prefix_to_storage(schema, {"b": "x", "a": 1}) == (1, "x")
    assert prefix_to_storage(schema, {"a": 1, "b": "x", "c": "1970-01-11"}) == (1, "x", 10)
    message = re.escape("prefix must be a leading part of the primary key (a, b, c)")
    for bad in ({"b": "x"}, {"a": 1, "c": "1970-01-01"}, {"a": 1, "x": 2}):
        with pytest.raises(InvalidArgument, match=message):
            prefix_to_storage(schema, bad)
    with pytest.raises(UnknownColumn):
        prefix_to_storage(schema, {"zz": 1})
    with pytest.raises(TypeMismatch, match="column t.a is INT"):
        prefix_to_storage(schema, {"a": "1"})
