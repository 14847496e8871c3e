"""One row operation applied to a row, with its conditions: pure functions, the part of a
prepare that decides what a row becomes (or why the vote is no)."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aggview.rowcodec import decode_json, decode_row, encode_json
from aggview.wire import ltm_pb2 as pb
from ltm.rows import Row

RowId = tuple[str, bytes]  # (store table id, encoded key)
Outcome = pb.Vote.Outcome

_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


@dataclass(slots=True)
class LocalSub:
    """A sub-transaction for a participant in the coordinator's own process: the fields of a
    ``SubTransaction`` the prepare reads, its operations the coordinator's own (a wire
    message copies each one it is given); ``message()`` is the wire form, for another
    process."""

    ts: int
    ops: list[pb.RowOp] = field(default_factory=list)
    want_images: bool = False

    def message(self) -> pb.SubTransaction:
        return pb.SubTransaction(ts=self.ts, ops=self.ops, want_images=self.want_images)


class VoteNo(Exception):
    """A sub-transaction cannot commit; carries the vote's outcome and the row it is about."""

    def __init__(self, outcome: int, message: str, row: RowId | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.row = row


def _infinite(value: Any) -> bool:
    """A FLOAT sum past 1.8e308: JSON (and SQL) have no infinity."""
    return isinstance(value, float) and not math.isfinite(value)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def apply_op(op: pb.RowOp, before: Row | None, current: Row | None, row_id: RowId) -> Row | None:
    """One operation on a row; conditions see the row as it was before the transaction."""
    if op.require:
        _check_conditions(decode_json(op.require), before, row_id)
    kind = op.kind
    if kind in (pb.RowOp.PUT, pb.RowOp.BACKFILL):
        return decode_row(op.values)
    if kind == pb.RowOp.INSERT:
        if current is not None:
            raise VoteNo(Outcome.ALREADY_EXISTS, "a row with this key already exists", row_id)
        return decode_row(op.values)
    if current is None:
        raise VoteNo(Outcome.NOT_FOUND, "no row with this key", row_id)
    if kind == pb.RowOp.DELETE:
        return None
    changes = decode_row(op.values) or {}
    if kind == pb.RowOp.UPDATE:
        return {**current, **changes}
    if kind == pb.RowOp.ADD:
        limits = decode_json(op.limits) or {}
        if not isinstance(limits, dict):
            raise VoteNo(Outcome.INVALID, "malformed limits: a JSON object expected", row_id)
        row = dict(current)
        for column, delta in changes.items():
            value = row.get(column)
            if value is None:
                raise VoteNo(Outcome.INVALID, f"cannot add to column {column}: it is NULL", row_id)
            try:
                value += delta
            except TypeError:
                raise VoteNo(
                    Outcome.INVALID, f"cannot add {delta!r} to column {column}", row_id
                ) from None
            limit = limits.get(column)
            try:
                over = (limit is not None and abs(value) >= limit) or _infinite(value)
            except TypeError:
                raise VoteNo(Outcome.INVALID, f"cannot add to column {column}", row_id) from None
            if over:
                raise VoteNo(Outcome.INVALID, f"adding to column {column} overflows it", row_id)
            row[column] = value
        return row
    raise VoteNo(Outcome.INVALID, f"unknown operation kind {kind}", row_id)


def _check_conditions(
    conditions: Sequence[Sequence[Any]], before: Row | None, row_id: RowId
) -> None:
    if not isinstance(conditions, list) or not all(
        isinstance(c, list) and len(c) == 3 and isinstance(c[0], str) and isinstance(c[1], str)
        for c in conditions
    ):
        raise VoteNo(Outcome.INVALID, "malformed conditions: [column, op, value] lists", row_id)
    if before is None:
        raise VoteNo(Outcome.CONDITION_FAILED, "the row does not exist", row_id)
    for column, op, value in conditions:
        actual = before.get(column)
        compare = _COMPARE.get(op)
        if compare is None:
            raise VoteNo(Outcome.INVALID, f"unknown comparison {op!r}", row_id)
        try:
            holds = actual is not None and value is not None and compare(actual, value)
        except TypeError:
            raise VoteNo(
                Outcome.INVALID, f"cannot compare column {column} with {value!r}", row_id
            ) from None
        if not holds:
            # structured, so the coordinator can show the values as the user typed them
            detail = encode_json([column, op, value, actual]).decode()
            raise VoteNo(Outcome.CONDITION_FAILED, detail, row_id)
