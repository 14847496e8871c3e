"""A view row's aggregate state: its layout, the delta one joined tuple contributes, and the
values a user reads (each aggregate kind's rules are ``cumulus.aggregates``).

State fields, all mergeable by ``aggview.merge`` (numbers add, dicts are multisets):
``_count`` rows in the group; per aggregate i, its kind's fields (``cumulus.aggregates``) with
i appended: ``n<i>`` non-NULL arguments; ``s<i>`` the sum in storage form (scaled integers for
DECIMAL, so sums are exact); ``m<i>`` the ordered multiset {JSON storage value: multiplicity}
for MIN, MAX and COUNT(DISTINCT), so that deleting the current minimum needs no rescan of the
base table. COUNT(*) reads ``_count``.
"""

from __future__ import annotations

import decimal
import json
from collections.abc import Callable, Mapping
from typing import Any

from aggview import errors
from aggview.keycodec import decode_key, encode_key
from aggview.schema import Column, ColumnType, TableSchema, from_storage, to_storage
from cumulus.aggregates import RULES, Kind, M, N, S
from cumulus.expressions import compile_expr, compile_predicate
from cumulus.plan import MULTIPLICITY, ViewPlan

Row = dict[str, Any]
Lookup = Callable[[str, str], Any]
NO_GROUP_KEY = b"\x00"  # the single row of a view without GROUP BY
_EXACT = decimal.Context(prec=120)
_BOOL = ColumnType("BOOL")
_ZERO = {"INT": 0, "DECIMAL": 0, "FLOAT": 0.0, "TEXT": "", "DATE": 0, "BOOL": False}
# the Python type of a stored value, by column kind: what a group key holds as it is stored,
# and what a sum's state holds (INT and scaled DECIMAL: exact; FLOAT is converted)
_KEY_KINDS = {"INT": int, "DECIMAL": int, "DATE": int, "TEXT": str, "BOOL": bool}
_SUM_KINDS = {"INT": int, "DECIMAL": int}
CONVERT = object()  # ``ViewState._stored``: the value is not taken as stored


def sum_state(column_type: ColumnType, value: Any) -> Any:
    """A SUM/AVG argument (or a sum of them) in storage form: exact scaled integer for
    DECIMAL."""
    if column_type.kind == "DECIMAL":
        scaled = _EXACT.multiply(decimal.Decimal(value), decimal.Decimal(10) ** column_type.scale)
        if scaled != scaled.to_integral_value():
            raise errors.InvalidArgument(f"value {value} has more than {column_type.scale} places")
        return int(scaled)
    if column_type.kind == "FLOAT":
        return float(value)
    return int(value)


def _sum_value(column_type: ColumnType, stored: Any) -> Any:
    """A sum in storage form as an exact number (a float for FLOAT)."""
    if column_type.kind == "FLOAT":
        return stored
    return decimal.Decimal(stored).scaleb(-(column_type.scale or 0), _EXACT)


class ViewState:
    """Everything about one view that maintenance and reads evaluate, compiled once."""

    def __init__(self, plan: ViewPlan, table: Callable[[str], TableSchema]) -> None:
        self.plan = plan
        if plan.nested:  # a cumulus view's subqueries: their rows as tables
            from cumulus.view_rows import row_schema, rows_id  # (view_rows reads this module)

            nested, outer = {n.name: n for n in plan.nested}, table

            def table(name: str) -> TableSchema:  # noqa: F811 (the outer lookup, wrapped)
                found = nested.get(name)
                return outer(name) if found is None else row_schema(found, rows_id(0, name))

        self.schemas: dict[str, TableSchema] = {t.alias: table(t.table) for t in plan.tables}
        self.group_types = [ColumnType.parse(g.type) for g in plan.group_by]
        self.args = [compile_expr(a.arg) if a.arg is not None else None for a in plan.aggregates]
        self.arg_types = [
            ColumnType.parse(a.arg_type) if a.arg_type else None for a in plan.aggregates
        ]
        self.result_types = [ColumnType.parse(a.result_type) for a in plan.aggregates]
        self.rules = [RULES[a.kind] for a in plan.aggregates]
        self.filters = [compile_predicate(f) for f in plan.filters]
        self.having = compile_predicate(plan.having) if plan.having else None
        self.groups = [compile_expr(g.source()) for g in plan.group_by]
        self.derived = [(d.name, compile_expr(d.expr)) for d in plan.derived]
        self._types: dict[tuple[str, str], ColumnType] = {}
        # aliases of views read as tables (``cumulus.view_rows``): a row counts ``__count`` times
        self.weighted = [a for a, s in self.schemas.items() if s.primary_key == (MULTIPLICITY,)]
        # a UNION ALL's other branches, each compiled as its own SELECT into the same groups
        self.branches = [ViewState(b, table) for b in plan.branches]
        # A group or a SUM/AVG argument that is a bare column of the same type is its stored
        # value already: taken as it is, not converted to Python and back (a DECIMAL sum
        # went through Decimal twice per joined tuple). (alias, column, Python type), or None.
        self._stored_groups = [
            self._same_column(g.source(), t, _KEY_KINDS)
            for g, t in zip(plan.group_by, self.group_types, strict=True)
        ]
        self._key_types = [t for column_type in self.group_types for t in (_BOOL, column_type)]
        self._stored_sums = [
            self._same_column(a.arg, self.arg_types[i], _SUM_KINDS) if rule.keeps_sum else None
            for i, (a, rule) in enumerate(zip(plan.aggregates, self.rules, strict=True))
        ]

    def _same_column(
        self, expr: Mapping[str, Any] | None, wanted: ColumnType | None, kinds: Mapping[str, type]
    ) -> tuple[str, str, type] | None:
        """(alias, column, the Python type of its stored values) if ``expr`` is a bare column
        of exactly type ``wanted``, of one of ``kinds``."""
        ref = expr.get("col") if expr is not None else None
        if wanted is None or wanted.kind not in kinds or not isinstance(ref, list) or len(ref) != 2:
            return None
        alias, column = ref
        try:
            if self.column_type(alias, column) != wanted:
                return None
        except (KeyError, errors.AggviewError):  # not a column of a table here: evaluated
            return None
        return alias, column, kinds[wanted.kind]

    @staticmethod
    def _stored(found: tuple[str, str, type] | None, binding: Mapping[str, Row] | None) -> Any:
        """The stored value ``found`` names in ``binding`` (None for NULL), or ``CONVERT``
        where it is not taken as stored: no binding, no such column, or a value not of its
        kind (converted instead, which says what is wrong)."""
        if found is None or binding is None:
            return CONVERT
        alias, column, kind = found
        value = binding[alias].get(column)
        return value if value is None or type(value) is kind else CONVERT

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

    def group_key(self, lookup: Lookup, binding: Mapping[str, Row] | None = None) -> bytes:
        """The group a joined tuple (its ``lookup``; and its stored ``binding``, when at hand)
        falls in."""
        if binding is not None and self.plan.group_by:
            stored: list[Any] = []
            for found, column_type in zip(self._stored_groups, self.group_types, strict=True):
                value = self._stored(found, binding)
                if value is CONVERT:
                    break
                stored += [False, _ZERO[column_type.kind]] if value is None else [True, value]
            else:
                return encode_key(self._key_types, stored)
        return self.encode_group([group(lookup) for group in self.groups])

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

    def tuple_delta(
        self, lookup: Lookup, sign: int, binding: Mapping[str, Row] | None = None
    ) -> Row:
        """What one joined tuple (its ``lookup``; and its stored ``binding``, when at hand)
        adds to its group's state, ``sign`` -1: takes away."""
        delta: Row = {"_count": sign}
        for i, rule in enumerate(self.rules):
            argument = self.args[i]
            if argument is None:
                continue
            value = self._stored(self._stored_sums[i], binding)  # a sum's state already
            if value is CONVERT:
                value = argument(lookup)
                if value is None:
                    continue
                if rule.keeps_sum:
                    value = sum_state(self.result_state_type(i), value)
                elif rule.keeps_values:
                    arg_type = self.arg_types[i]
                    assert arg_type is not None
                    stored = to_storage(Column("v", arg_type), value, table=self.plan.name)
                    value = json.dumps(stored)
            elif value is None:
                continue
            for field, part in rule.delta(value, sign).items():
                delta[f"{field}{i}"] = part
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
            values[aggregate.name] = self._value(i, state)
        for name, evaluate in self.derived:  # over the group and aggregate values
            values[name] = evaluate(lambda _alias, column: values.get(column))
        if self.having is not None and not self.having(lambda _alias, name: values.get(name)):
            return None
        return {name: values[name] for name in self.plan.output}

    def _value(self, i: int, state: Row) -> Any:
        rule = self.rules[i]
        if rule.kind is Kind.COUNT_STAR:
            fields = {N: state.get("_count", 0)}
        else:
            fields = {f: state[f"{f}{i}"] for f in rule.fields if f"{f}{i}" in state}
        if S in fields:
            fields[S] = _sum_value(self.result_state_type(i), fields[S])
        if M not in fields:
            return rule.finish(fields, self.result_types[i])
        fields[M] = {json.loads(v): n for v, n in fields[M].items()}
        arg_type = self.arg_types[i]
        assert arg_type is not None
        return rule.finish(fields, self.result_types[i], lambda v: from_storage(arg_type, v))
