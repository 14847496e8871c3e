"""Which member a client sends a transaction to: the one hosting most of its rows, so that
its sub-transactions there are direct calls and a one-row transaction commits with one
durable write. Learnt from any server (``Members``) and the tables' schemas (``Describe``);
whatever cannot be placed (an unknown table, a bad key) goes to the address the client was
given, whose answer then says what is wrong."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

from aggview import errors
from aggview.keycodec import table_key
from aggview.partition_map import partition_of
from aggview.schema import TableSchema
from aggview.values import from_value
from aggview.wire import client_pb2 as pb

UNREACHABLE_FOR = 5.0  # seconds a member that did not answer gets no routed transaction


class Router:
    """Pure: the clients fetch what it lacks (``unknown``) and hand it over (``learn``)."""

    def __init__(self, members: Sequence[str], partitions: int, leader: int = 0) -> None:
        self.members = list(members)
        self.partitions = partitions
        self.leader = leader  # keeps the catalog; another member after a takeover
        self._schemas: dict[str, TableSchema | None] = {}
        self._unreachable: dict[int, float] = {}  # member -> until when it is avoided

    @property
    def routes(self) -> bool:
        return len(self.members) > 1

    def unreachable(self, member: int | None, now: float) -> None:
        """``member`` did not answer (it may be dead, its partitions moving to others): its
        transactions go to the leader for a while. Any member coordinates any transaction;
        routing only saves messages."""
        if member is not None:
            self._unreachable[member] = now + UNREACHABLE_FOR

    def avoided(self, member: int | None, now: float) -> bool:
        """Whether ``member`` did not answer lately (see :meth:`unreachable`)."""
        return member is not None and now < self._unreachable.get(member, 0.0)

    def member_for(self, operations: Sequence[pb.Operation], now: float = 0.0) -> int | None:
        """The member hosting most of the rows (the first row's on a tie), unless it did not
        answer lately (then the leader, or if that did not either, any that did); None: no
        idea."""
        member = self._hosting_most(operations)
        if member is None or not self.avoided(member, now):
            return member
        answering = [m for m in range(len(self.members)) if not self.avoided(m, now)]
        if self.leader in answering or not answering:
            return self.leader
        return answering[0]

    def _hosting_most(self, operations: Sequence[pb.Operation]) -> int | None:
        counts: Counter[int] = Counter()
        for op in operations:
            member = self._member_of(op)
            if member is None:
                return None
            counts[member] += 1
        if not counts:
            return None
        best = max(counts.values())
        return next(m for m in counts if counts[m] == best)

    def _member_of(self, op: pb.Operation) -> int | None:
        schema = self._schemas.get(op.table)
        if schema is None:
            return None
        columns = (op.values if op.kind == pb.Operation.INSERT else op.key).columns
        if any(c not in columns for c in schema.primary_key):  # (``[]`` would add a column)
            return None
        try:  # only the key is decoded, not the whole row
            key = table_key(schema, {c: from_value(columns[c]) for c in schema.primary_key})
        except (KeyError, errors.AggviewError, TypeError, ValueError):
            return None
        return partition_of(schema.table_id, key, self.partitions) % len(self.members)

    def unknown(self, operations: Sequence[pb.Operation]) -> set[str]:
        """Tables whose schema is needed to place these operations."""
        return {op.table for op in operations if op.table not in self._schemas}

    def learn(self, table: str, reply: pb.DescribeReply | None) -> None:
        """What ``Describe`` said of a table (None: it failed, e.g. no such table yet)."""
        if reply is None:
            return  # not remembered: the table may be created later
        is_table = reply.kind == pb.DescribeReply.TABLE and reply.schema_json
        self._schemas[table] = (
            TableSchema.from_json(json.loads(reply.schema_json)) if is_table else None
        )
