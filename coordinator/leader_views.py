"""Cumulus views read from any member: the leader runs a cumulus view's runtime, and a
follower forwards its clients' reads of that view there (the leader's ``Clock`` service,
``ReadView``), so the client, SQL, the query layer and subscriptions work at every member.

Pure conversions between a read (view, conditions, roll-up, tentative) and its messages, and
the follower's side of the call; the leader's side is ``ClockServicer.ReadView``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from aggview import errors
from aggview.net import GRPC_OPTIONS
from aggview.security import TlsDir, member_channel, member_metadata
from aggview.status import error_from_rpc
from aggview.values import from_row, from_value, to_row, to_value
from aggview.wire import ltm_pb2 as pb
from aggview.wire import ltm_pb2_grpc as pb_grpc
from coordinator.view_query import Condition

READ_TIMEOUT = 30.0
OPS = ("=", "in", "between", "<", "<=", ">", ">=", "!=", "is null")
Read = tuple[str, list[Condition], list[str] | None, bool]
Answer = tuple[list[dict[str, Any]], int, bool]


def request(
    view: str, conditions: Sequence[Condition], keep: Sequence[str] | None, tentative: bool
) -> pb.LeaderViewRequest:
    wire = pb.LeaderViewRequest(
        view=view, roll_up=keep is not None, keep=list(keep or ()), tentative=tentative
    )
    for c in conditions:
        if c.op == "in":
            values = list(c.value)
        elif c.op == "between":
            values = [c.value, c.high]
        elif c.op == "is null":
            values = []
        else:
            values = [c.value]
        wire.conditions.add(column=c.column, op=c.op, values=[to_value(v) for v in values])
    return wire


def read_of(wire: pb.LeaderViewRequest) -> Read:
    """The read a request asks for; a malformed one is refused, naming what is wrong."""
    conditions = []
    for c in wire.conditions:
        values = [from_value(v) for v in c.values]
        wanted = {"in": None, "between": 2, "is null": 0}.get(c.op, 1)
        if c.op not in OPS or (wanted is not None and len(values) != wanted):
            raise errors.InvalidArgument(
                f"malformed condition on {c.column!r}: {c.op!r} with {len(values)} values"
            )
        if c.op == "in":
            conditions.append(Condition(c.column, "in", values))
        elif c.op == "between":
            conditions.append(Condition(c.column, "between", values[0], values[1]))
        else:
            conditions.append(Condition(c.column, c.op, values[0] if values else None))
    keep = list(wire.keep) if wire.roll_up else None
    return wire.view, conditions, keep, wire.tentative


def reply(rows: list[dict[str, Any]], ts: int, tentative: bool) -> pb.LeaderViewReply:
    return pb.LeaderViewReply(rows=[to_row(r) for r in rows], timestamp=ts, tentative=tentative)


def answer_of(wire: pb.LeaderViewReply) -> Answer:
    return [from_row(r) for r in wire.rows], wire.timestamp, wire.tentative


class LeaderReads:
    """A follower's channel to the leader for cumulus view reads (reopened when the leader
    changes)."""

    def __init__(self, tls: TlsDir | None) -> None:
        self._tls = tls
        self._address = ""
        self._channel: grpc.aio.Channel | None = None

    async def read(
        self,
        leader: str,
        view: str,
        conditions: Sequence[Condition],
        keep: Sequence[str] | None,
        tentative: bool,
    ) -> Answer:
        if leader != self._address or self._channel is None:
            await self.close()
            self._channel = member_channel(leader, self._tls, GRPC_OPTIONS)
            self._address = leader
        stub = pb_grpc.ClockStub(self._channel)
        try:
            answer = await stub.ReadView(
                request(view, conditions, keep, tentative),
                timeout=READ_TIMEOUT,
                metadata=member_metadata(self._tls),
            )
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None
        return answer_of(answer)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
