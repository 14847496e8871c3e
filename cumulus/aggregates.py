"""The aggregate kinds: one ``Rule`` each, which every back end reads -- the view path
(``cumulus.aggstate``: sync and async views, the coordinator's query layer), the M3 compiler and
read-out (``cumulus.m3``), the Cumulus runtime's roll-ups (``cumulus.runtime.reads``) and the
Spark layer (``aggspark``). Type rules are in ``cumulus.typerules``.

A kind's state is a dict of at most three fields, merged by ``aggview.merge.combine`` (numbers
add, dicts are multisets):

- ``n``: the non-NULL arguments (COUNT(*): the rows, NULL or not);
- ``s``: their sum (SUM, AVG);
- ``m``: the multiset {value: multiplicity} (MIN, MAX, COUNT(DISTINCT)), so retracting the
  current minimum needs no rescan.

A back end keeps the fields its own way (``aggstate``: ``n<i>``, ``s<i>`` in scaled integers,
``m<i>`` keyed by JSON; M3: a map each) and hands them to ``Rule.finish`` in this form: ``s`` an
exact number (int, Decimal) or a float; ``m`` keyed by anything that orders as the values do,
with ``decode`` turning the key MIN or MAX picks into the value.

Empty groups: COUNT is 0; SUM, AVG, MIN and MAX are NULL without a non-NULL argument; COUNT
(DISTINCT) is 0. A multiset holds the values with a positive multiplicity.

Names: the members of ``Kind``. Their values are the plan's persisted spelling (``"sum"``,
``"count_star"``), their names the M3 text's (``SUM``, ``COUNT_DISTINCT``; M3 has no
COUNT_STAR: it is a COUNT of the rows map).
"""

from __future__ import annotations

import decimal
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from aggview import errors
from aggview.merge import combine, normalized
from aggview.schema import ColumnType
from cumulus.expressions import add
from cumulus.typerules import FLOAT, INT, avg_type, sum_type

State = dict[str, Any]
N, S, M = "n", "s", "m"  # the state's fields
_EXACT = decimal.Context(prec=120)


class Kind(enum.StrEnum):
    COUNT_STAR = "count_star"
    COUNT = "count"
    SUM = "sum"
    AVG = "avg"
    MIN = "min"
    MAX = "max"
    COUNT_DISTINCT = "count_distinct"


def _same(value: Any) -> Any:
    return value


def present(state: Mapping[str, Any]) -> list[Any]:
    """The values of a state's multiset (a positive multiplicity)."""
    return [v for v, n in (state.get(M) or {}).items() if n > 0]


def finish_sum(kind: Kind, total: Any, count: int, result: ColumnType) -> Any:
    """SUM or AVG of ``count`` values adding up to ``total`` (exact, or a float), in ``result``:
    NULL over no value; DECIMAL rounded half-even to the result's scale."""
    if not count:
        return None
    if result.kind == "FLOAT":
        return float(total) / count if kind is Kind.AVG else float(total)
    exact = Decimal(total)
    if kind is Kind.AVG:
        exact = _EXACT.divide(exact, count)
    if result.kind == "INT":
        return int(exact)
    quantum = Decimal(1).scaleb(-(result.scale or 0))
    return exact.quantize(quantum, rounding=decimal.ROUND_HALF_EVEN, context=_EXACT)


def _count(kind: Kind, state: Mapping[str, Any], result: ColumnType, decode: Callable) -> Any:
    return int(state.get(N, 0))


def _sum(kind: Kind, state: Mapping[str, Any], result: ColumnType, decode: Callable) -> Any:
    return finish_sum(kind, state.get(S, 0), state.get(N, 0), result)


def _extreme(kind: Kind, state: Mapping[str, Any], result: ColumnType, decode: Callable) -> Any:
    values = present(state)
    if not values:
        return None
    return decode(min(values) if kind is Kind.MIN else max(values))


def _distinct(kind: Kind, state: Mapping[str, Any], result: ColumnType, decode: Callable) -> Any:
    return len(present(state))


@dataclass(frozen=True)
class Rule:
    """One aggregate kind's rules."""

    kind: Kind
    fields: tuple[str, ...]  # the state it keeps, of N, S, M
    numeric: bool  # its argument must be a number
    # how the finished values of finer groups make a coarser group's (SUM for counts and sums);
    # None: only the state rolls up (AVG, COUNT(DISTINCT))
    rollup: Kind | None
    _finish: Callable[[Kind, Mapping[str, Any], ColumnType, Callable], Any]

    @property
    def keeps_sum(self) -> bool:
        return S in self.fields

    @property
    def keeps_values(self) -> bool:
        return M in self.fields

    def result_type(self, arg: ColumnType | None) -> ColumnType:
        """The type of the value a user reads, given the argument's (None for COUNT(*))."""
        if self.kind in (Kind.COUNT_STAR, Kind.COUNT, Kind.COUNT_DISTINCT):
            return INT
        assert arg is not None
        if self.kind is Kind.SUM:
            return sum_type(arg)
        if self.kind is Kind.AVG:
            return avg_type(arg)
        return arg  # MIN, MAX

    def rounds(self, arg: ColumnType | None) -> bool:
        """Its value is rounded (a quotient, or FLOAT arithmetic): two correct computations in
        a different order may differ in their last digits."""
        return self.kind is Kind.AVG or arg == FLOAT

    def initial(self) -> State:
        return {}

    def delta(self, value: Any, sign: int = 1) -> State:
        """What one row's argument adds to the state (``sign`` -1: takes away); NULL adds
        nothing, except to COUNT(*)."""
        if value is None and self.kind is not Kind.COUNT_STAR:
            return {}
        out: State = {}
        if S in self.fields:
            out[S] = sign * value
        if N in self.fields:
            out[N] = sign
        if M in self.fields:
            out[M] = {value: sign}
        return out

    def merge(self, state: Mapping[str, Any], value: Any, sign: int = 1) -> State:
        """The state with one row's argument added; fields at zero are dropped."""
        return normalized(combine(dict(state), self.delta(value, sign)))

    def unmerge(self, state: Mapping[str, Any], value: Any) -> State:
        """The state with one row's argument retracted."""
        return self.merge(state, value, -1)

    def finish(
        self, state: Mapping[str, Any], result: ColumnType, decode: Callable[[Any], Any] = _same
    ) -> Any:
        """The value a user reads from the state, in the result type."""
        return self._finish(self.kind, state, result, decode)

    def combine_values(self, a: Any, b: Any) -> Any:
        """Two finer groups' finished values as the coarser group's (``rollup`` kinds only);
        NULL (a group without a non-NULL argument) is skipped, as SQL's aggregates do."""
        if a is None or b is None:
            return b if a is None else a
        if self.rollup is Kind.SUM:
            return add(a, b)
        return min(a, b) if self.rollup is Kind.MIN else max(a, b)


RULES: dict[Kind, Rule] = {
    rule.kind: rule
    for rule in (
        Rule(Kind.COUNT_STAR, (N,), False, Kind.SUM, _count),
        Rule(Kind.COUNT, (N,), False, Kind.SUM, _count),
        Rule(Kind.SUM, (S, N), True, Kind.SUM, _sum),
        Rule(Kind.AVG, (S, N), True, None, _sum),
        Rule(Kind.MIN, (M,), False, Kind.MIN, _extreme),
        Rule(Kind.MAX, (M,), False, Kind.MAX, _extreme),
        Rule(Kind.COUNT_DISTINCT, (M,), False, None, _distinct),
    )
}


def rule_of(kind: str) -> Rule:
    """The rule of a kind (a ``Kind`` or its persisted spelling)."""
    try:
        return RULES[Kind(kind)]
    except ValueError:
        raise errors.InvalidArgument(f"unknown aggregate kind {kind!r}") from None
