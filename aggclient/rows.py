"""What the clients send and get back, without I/O: rows and their snapshots' timestamps, a
transaction's buffered operations, the SQL of a query-layer call, and the reads at a held
snapshot (``Snapshot``, shared by both clients: an ``AsyncClient``'s reads are awaited)."""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from aggview import errors
from aggview.values import fill_row, from_row, to_value
from aggview.wire import client_pb2 as pb

if TYPE_CHECKING:  # the shells import this module
    from aggclient.client import Client

_COMPARISONS = {"==": pb.EQ, "!=": pb.NE, "<": pb.LT, "<=": pb.LE, ">": pb.GT, ">=": pb.GE}
Require = Mapping[str, tuple[str, Any]]


class Row(dict):  # type: ignore[type-arg]
    """A row as a dict, with the timestamp of the snapshot it was read from."""

    timestamp: int = 0


class Rows(list):  # type: ignore[type-arg]
    """Rows from one consistent snapshot, with its timestamp (and a message for SQL); or,
    ``tentative``, a cumulus view's newest values, which may mix timestamps (``timestamp``:
    the last change fed to its runtime)."""

    timestamp: int = 0
    message: str = ""
    tentative: bool = False
    columns: list[str]
    results: list[Rows]  # SQL's BEGIN READ ONLY; SELECT …; COMMIT: one per SELECT


def _conditions(require: Require | None) -> list[pb.Condition]:
    out = []
    for column, spec in (require or {}).items():
        if not (isinstance(spec, tuple) and len(spec) == 2 and spec[0] in _COMPARISONS):
            raise errors.InvalidArgument(
                f"require[{column!r}] must be (op, value) with op one of "
                f"{', '.join(_COMPARISONS)}; got {spec!r}"
            )
        out.append(pb.Condition(column=column, op=_COMPARISONS[spec[0]], value=to_value(spec[1])))
    return out


class Transaction:
    """Buffers operations; the whole transaction is sent once, when the ``with`` block ends."""

    def __init__(self) -> None:
        self.operations: list[pb.Operation] = []
        self.timestamp: int | None = None

    def insert(self, table: str, row: Mapping[str, Any]) -> None:
        op = pb.Operation(kind=pb.Operation.INSERT, table=table)
        fill_row(op.values, row, table)
        self.operations.append(op)

    def update(
        self,
        table: str,
        key: Mapping[str, Any],
        changes: Mapping[str, Any],
        *,
        require: Require | None = None,
    ) -> None:
        self._keyed(pb.Operation.UPDATE, table, key, changes, require)

    def add(
        self,
        table: str,
        key: Mapping[str, Any],
        deltas: Mapping[str, Any],
        *,
        require: Require | None = None,
    ) -> None:
        self._keyed(pb.Operation.ADD, table, key, deltas, require)

    def delete(self, table: str, key: Mapping[str, Any], *, require: Require | None = None) -> None:
        self._keyed(pb.Operation.DELETE, table, key, {}, require)

    def _keyed(
        self,
        kind: int,
        table: str,
        key: Mapping[str, Any],
        values: Mapping[str, Any],
        require: Require | None,
    ) -> None:
        # the rows set where the operation holds them, not built and copied in
        op = pb.Operation(kind=kind, table=table)
        fill_row(op.key, key, table)
        fill_row(op.values, values, table)
        if require:
            op.require.extend(_conditions(require))
        self.operations.append(op)


CONSISTENCY = ("committed", "tentative")


def tentative(consistency: str) -> bool:
    """``consistency``: 'committed' (one timestamp's exact answer) or 'tentative' (a cumulus
    view's newest values; every other view answers as committed)."""
    if consistency not in CONSISTENCY:
        raise errors.InvalidArgument(
            f"consistency must be 'committed' or 'tentative'; got {consistency!r}"
        )
    return consistency == "tentative"


def sql_rows(reply: pb.SqlReply) -> Rows:
    order = list(reply.columns)
    rows = Rows(Row(_ordered(from_row(r), order)) for r in reply.rows)
    rows.timestamp, rows.message, rows.columns = reply.timestamp, reply.message, list(reply.columns)
    rows.tentative = reply.tentative
    rows.results = [sql_rows(r) for r in reply.results]  # a read-only block's SELECTs
    return rows


def scan_rows(reply: pb.ScanReply | pb.ViewReply) -> Rows:
    order = list(reply.columns)
    rows = Rows(Row(_ordered(from_row(r), order)) for r in reply.rows)
    for row in rows:
        row.timestamp = reply.timestamp
    rows.timestamp, rows.columns = reply.timestamp, list(reply.columns)
    rows.tentative = getattr(reply, "tentative", False)
    return rows


def _ordered(values: dict[str, Any], order: list[str]) -> dict[str, Any]:
    """Columns in declaration (or SELECT) order: the wire's map has none."""
    return {c: values[c] for c in order if c in values} if order else values


def get_row(reply: pb.GetReply) -> Row | None:
    if not reply.found:
        return None
    row = Row(from_row(reply.row))
    row.timestamp = reply.timestamp
    return row


def query_sql(
    view: str,
    where: Mapping[str, Any] | None = None,
    rollup: Sequence[str] | None = None,
    order_by: Sequence[str] = (),
    limit: int = 0,
) -> str:
    """The SQL of a query-layer call (see ``Client.query``), every value a quoted literal."""
    names = [view, *(where or {}), *(rollup or ()), *(c.lstrip("-") for c in order_by)]
    for name in names:
        if not _IDENTIFIER.match(name):
            raise errors.InvalidArgument(f"invalid name {name!r}: letters, digits and _")
    terms = []
    for column, wanted in (where or {}).items():
        if wanted is None:
            terms.append(f"{column} IS NULL")
        elif isinstance(wanted, list | set | frozenset):
            terms.append(f"{column} IN ({', '.join(_sql_literal(v) for v in wanted)})")
        elif isinstance(wanted, tuple):
            low, high = wanted
            terms.append(f"{column} BETWEEN {_sql_literal(low)} AND {_sql_literal(high)}")
        else:
            terms.append(f"{column} = {_sql_literal(wanted)}")
    sql = f"SELECT * FROM {view}"
    if terms:
        sql += " WHERE " + " AND ".join(terms)
    if rollup is not None:
        sql += f" GROUP BY {', '.join(rollup) or '()'}"
    if order_by:
        sql += " ORDER BY " + ", ".join(
            f"{c[1:]} DESC" if c.startswith("-") else c for c in order_by
        )
    if limit:
        sql += f" LIMIT {int(limit)}"
    return sql


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def _sql_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float | Decimal):
        return str(value)
    if isinstance(value, datetime.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise errors.InvalidArgument(f"cannot compare with {value!r} ({type(value).__name__})")


class Snapshot:
    """Reads at one held timestamp (``Client.snapshot``; ``AsyncClient.snapshot`` gives an
    :class:`~aggclient.aio.AsyncSnapshot`, the same reads, awaited): each read is the
    client's own, at the snapshot's timestamp."""

    def __init__(self, client: Client, timestamp: int) -> None:
        self.client = client
        self.timestamp = timestamp

    def get(self, table: str, key: Mapping[str, Any]) -> Row | None:
        return self.client.get(table, key, as_of=self.timestamp)

    def scan(self, table: str, prefix: Mapping[str, Any] | None = None, *, limit: int = 0) -> Rows:
        return self.client.scan(table, prefix, limit=limit, as_of=self.timestamp)

    def view(self, name: str, where: Mapping[str, Any] | None = None) -> Rows:
        return self.client.view(name, where, as_of=self.timestamp)

    def sql(self, statement: str) -> Rows:
        return self.client.sql(statement, as_of=self.timestamp)

    def query(self, view: str, where: Mapping[str, Any] | None = None, **how: Any) -> Rows:
        return self.client.query(view, where, as_of=self.timestamp, **how)
