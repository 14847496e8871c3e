"""A view row's aggregate state: its layout, the delta one joined tuple contributes, and the
values a user reads (one helper per aggregate kind, as pg_ivm does).

State fields, all mergeable by ``aggview.merge`` (numbers add, dicts are multisets):
``_count`` rows in the group; ``n<i>`` non-NULL arguments of aggregate i; ``s<i>`` the sum of
aggregate i in storage form (scaled integers for DECIMAL, so sums are exact); ``m<i>`` the
ordered multiset {JSON storage value: multiplicity} for MIN, MAX and COUNT(DISTINCT), so that
deleting the current minimum needs no rescan of the base table.
"""

from __future__ import annotations

import decimal
import json
from collections.abc import Callable, Mapping
from typing import Any

from aggview import errors
from aggview.keycodec import decode_key, encode_key
from aggview.schema import Column, ColumnType, TableSchema, from_storage, to_storage
from cumulus.expressions import compile_expr, compile_predicate
from cumulus.plan import ViewPlan

Row = dict[str, Any]
Lookup = Callable[[str, str], Any]
NO_GROUP_KEY = b"\x00"  # the single row of a view without GROUP BY
_EXACT = decimal.Context(prec=120)
_BOOL = ColumnType("BOOL")
_ZERO = {"INT": 0, "DECIMAL": 0, "FLOAT": 0.0, "TEXT": "", "DATE": 0, "BOOL": False}


def _to_state(column_type: ColumnType, value: Any) -> Any:
    """A SUM/AVG argument in storage form: exact scaled integer for DECIMAL."""
    if column_type.kind == "DECIMAL":
        scaled = _EXACT.multiply(decimal.Decimal(value), decimal.Decimal(10) ** column_type.scale)
        if scaled != scaled.to_integral_value():
            raise errors.InvalidArgument(f"value {value} has more than {column_type.scale} places")
        return int(scaled)
    if column_type.kind == "FLOAT":
        return float(value)
    return int(value)


class ViewState:
    """Everything about one view that maintenance and reads evaluate, compiled once."""

    def __init__(self, plan: ViewPlan, table: Callable[[str], TableSchema]) -> None:
        self.plan = plan
        self.schemas: dict[str, TableSchema] = {t.alias: table(t.table) for t in plan.tables}
        self.group_types = [ColumnType.parse(g.type) for g in plan.group_by]
        self.args = [compile_expr(a.arg) if a.arg is not None else None for a in plan.aggregates]
        self.arg_types = [
            ColumnType.parse(a.arg_type) if a.arg_type else None for a in plan.aggregates
        ]
        self.result_types = [ColumnType.parse(a.result_type) for a in plan.aggregates]
        self.filters = [compile_predicate(f) for f in plan.filters]
        self.having = compile_predicate(plan.having) if plan.having else None
        self._types: dict[tuple[str, str], ColumnType] = {}

    # ------------------------------------------------------------------ maintenance

    def column_type(self, alias: str, column: str) -> ColumnType:
        found = self._types.get((alias, column))
        if found is None:
            found = self._types[(alias, column)] = self.schemas[alias].column(column).type
        return found

    def lookup(self, binding: Mapping[str, Row]) -> Lookup:
        """Python values of a joined tuple, converted from storage form on demand."""

        def value(alias: str, column: str) -> Any:
            stored = binding[alias].get(column)
            return None if stored is None else from_storage(self.column_type(alias, column), stored)

        return value

    def passes(self, lookup: Lookup) -> bool:
        return all(check(lookup) for check in self.filters)

    def group_key(self, lookup: Lookup) -> bytes:
        return self.encode_group([lookup(g.ref.alias, g.ref.column) for g in self.plan.group_by])

    def encode_group(self, values: list[Any]) -> bytes:
        """Group values (Python, a leading part of the GROUP BY columns for a slice) as an
        order-preserving view key. Each value is preceded by a presence flag, because SQL
        puts all NULLs of a GROUP BY column into one group (NULL sorts first)."""
        if not self.plan.group_by:
            return NO_GROUP_KEY
        types: list[ColumnType] = []
        stored: list[Any] = []
        for group, column_type, value in zip(
            self.plan.group_by, self.group_types, values, strict=False
        ):
            types += [_BOOL, column_type]
            if value is None:
                stored += [False, _ZERO[column_type.kind]]
            else:
                column = Column(group.name, column_type)
                stored += [True, to_storage(column, value, table=self.plan.name)]
        return encode_key(types, stored)

    def tuple_delta(self, lookup: Lookup, sign: int) -> Row:
        delta: Row = {"_count": sign}
        for i, aggregate in enumerate(self.plan.aggregates):
            argument = self.args[i]
            if argument is None:
                continue
            value = argument(lookup)
            if value is None:
                continue
            kind = aggregate.kind
            if kind == "count":
                delta[f"n{i}"] = sign
            elif kind in ("sum", "avg"):
                arg_type = self.arg_types[i]
                assert arg_type is not None
                delta[f"s{i}"] = sign * _to_state(self.result_state_type(i), value)
                delta[f"n{i}"] = sign
            else:  # min, max, count_distinct
                arg_type = self.arg_types[i]
                assert arg_type is not None
                stored = to_storage(Column("v", arg_type), value, table=self.plan.name)
                delta[f"m{i}"] = {json.dumps(stored): sign}
        return delta

    def result_state_type(self, i: int) -> ColumnType:
        """The type a SUM/AVG accumulates in: the argument's scale, exactly."""
        arg_type = self.arg_types[i]
        assert arg_type is not None
        return arg_type

    # ------------------------------------------------------------------ reads

    def decode_group(self, key: bytes) -> dict[str, Any]:
        if not self.plan.group_by:
            return {}
        types = [t for column_type in self.group_types for t in (_BOOL, column_type)]
        values = decode_key(types, key)
        return {
            g.name: from_storage(t, values[2 * i + 1]) if values[2 * i] else None
            for i, (g, t) in enumerate(zip(self.plan.group_by, self.group_types, strict=True))
        }

    def finalize(self, key: bytes, state: Row) -> dict[str, Any] | None:
        """The row a user reads (SELECT order), or None if HAVING rejects the group or it has
        no rows. A group exists while its ``_count`` is positive: a stored state may outlive
        its rows with a FLOAT sum that did not cancel to exactly 0 (partial rows added in
        another order than they were written; -1.1e-13 was seen), and a view without GROUP BY
        has its one row always."""
        if self.plan.group_by and state.get("_count", 0) <= 0:
            return None
        values = self.decode_group(key)
        for i, aggregate in enumerate(self.plan.aggregates):
            values[aggregate.name] = self._value(i, aggregate.kind, state)
        if self.having is not None and not self.having(lambda _alias, name: values.get(name)):
            return None
        return {name: values[name] for name in self.plan.output}

    def _value(self, i: int, kind: str, state: Row) -> Any:
        count = state.get(f"n{i}", 0)
        if kind == "count_star":
            return state.get("_count", 0)
        if kind == "count":
            return count
        if kind in ("sum", "avg"):
            if not count:
                return None
            total = state.get(f"s{i}", 0)
            state_type = self.result_state_type(i)
            result_type = self.result_types[i]
            if state_type.kind == "FLOAT":
                return total / count if kind == "avg" else float(total)
            exact = decimal.Decimal(total).scaleb(-(state_type.scale or 0), _EXACT)
            if kind == "avg":
                exact = _EXACT.divide(exact, count)
            if result_type.kind == "INT":
                return int(exact)
            if result_type.kind == "FLOAT":
                return float(exact)
            quantum = decimal.Decimal(1).scaleb(-(result_type.scale or 0))
            return exact.quantize(quantum, rounding=decimal.ROUND_HALF_EVEN, context=_EXACT)
        multiset = state.get(f"m{i}") or {}
        if kind == "count_distinct":
            return len(multiset)
        if not multiset:
            return None
        arg_type = self.arg_types[i]
        assert arg_type is not None
        stored = [json.loads(v) for v in multiset]
        return from_storage(arg_type, min(stored) if kind == "min" else max(stored))
