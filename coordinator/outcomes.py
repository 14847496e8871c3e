"""Outcome questions about transactions in doubt: answered for other members' participants
(``OutcomeServicer``), and asked of every member for this member's (presumed abort)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from aggview.net import CONTROL_OPTIONS
from aggview.security import TlsDir, member_channel, member_metadata
from aggview.status import grpc_method
from aggview.wire import ltm_pb2 as lpb
from aggview.wire import ltm_pb2_grpc as lpb_grpc
from coordinator.transactions import TransactionManager

log = logging.getLogger("coordinator.service")  # the member's log, as before the split


class OutcomeServicer(lpb_grpc.TransactionOutcomeServicer):
    def __init__(self, manager: TransactionManager) -> None:
        self.manager = manager

    @grpc_method
    async def Query(self, request: lpb.OutcomeRequest, context: object) -> lpb.OutcomeReply:
        answers_for = await self.manager.answering_for()
        return lpb.OutcomeReply(
            outcomes=[self.manager.outcome(ts) for ts in request.ts], answers_for=answers_for
        )


# An outcome question unanswered this long counts as silence (asked again in half a second,
# see ``Participant._outcome_loop``): waiting longer kept rows of a cut-off member's in-doubt
# transactions held for seconds after another member had adopted its decision log.
OUTCOME_TIMEOUT = 1.0


def outcome_stub(address: str, tls: TlsDir | None) -> Callable[[list[int]], Awaitable[Any]]:
    stub = lpb_grpc.TransactionOutcomeStub(member_channel(address, tls, CONTROL_OPTIONS))
    metadata = member_metadata(tls)
    return lambda timestamps: stub.Query(
        lpb.OutcomeRequest(ts=timestamps), timeout=OUTCOME_TIMEOUT, metadata=metadata
    )


async def ask_outcomes(
    manager: TransactionManager,
    others: list[tuple[int, Callable[[list[int]], Awaitable[Any]]]],
    timestamps: list[int],
) -> list[bool | None]:
    """An in-process participant's question about undecided transactions. With several
    members, whichever coordinated a transaction knows it (its decision log, or in flight);
    the others say aborted. Presumed abort needs every member's answer: while one cannot be
    asked, nothing is known (None: ask again later), unless a member that adopted its
    decision log after it died, and holds it still, answers for it."""
    answered = {manager.member, *await manager.answering_for()}
    answers = [[manager.outcome(ts) for ts in timestamps]]
    silent: list[str] = []
    # A member whose decision log this member holds now is not asked: only the holder of the
    # log knows its transactions (the member itself, cut off, is fenced from it). The others
    # are asked at once, so one silent member costs one timeout, not one each.
    asked = [(member, query) for member, query in others if member not in answered]
    replies = await asyncio.gather(
        *(query(timestamps) for _, query in asked), return_exceptions=True
    )
    for (member, _), reply in zip(asked, replies, strict=True):
        if isinstance(reply, grpc.aio.AioRpcError):
            silent.append(f"member {member}: {reply.details()}")
            continue
        if isinstance(reply, BaseException):
            raise reply
        answers.append(list(reply.outcomes))
        answered |= {member, *reply.answers_for}
    unknown = not set(range(len(manager.members) or 1)) <= answered
    if unknown:
        log.info("outcome of %d transactions not known yet: %s", len(timestamps), silent)
    outcomes: list[bool | None] = []
    for said in zip(*answers, strict=True):
        if lpb.OutcomeReply.COMMITTED in said:
            outcomes.append(True)
        elif lpb.OutcomeReply.PENDING in said or unknown:
            outcomes.append(None)
        else:
            outcomes.append(False)
    return outcomes
