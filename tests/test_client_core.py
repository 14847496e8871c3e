"""The client's decisions without a server (``aggclient.core``): its plans are driven here
with answers made up for each question, on a clock the test moves.

What both ``Client`` and ``AsyncClient`` do with a silent member is decided there once: a
commit unanswered for ``ASK_OTHERS_AFTER`` asks another member whether it hears the
coordinating member silent, then every ``ASK_OTHERS_EVERY``; after ``silent_after`` the member
itself is asked; either verdict gives the commit up with ``OutcomeUnknown``, an
``Unavailable``. The servers' side is in tests/test_silent_member.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from aggclient.core import (
    ASK_OTHERS_AFTER,
    ASK_OTHERS_EVERY,
    RELEARN_EVERY,
    Ask,
    ClientCore,
    Describe,
    Done,
    OutcomeUnknown,
    Plan,
    answered,
    step,
)
from aggclient.routing import UNREACHABLE_FOR, Router
from aggview import errors
from aggview.keycodec import table_key
from aggview.partition_map import partition_of
from aggview.schema import Column, ColumnType, TableSchema
from aggview.status import SILENT_MEMBERS_KEY
from aggview.values import to_row
from aggview.wire import client_pb2 as pb

MEMBERS = ["m0:1", "m1:1", "m2:1"]
SILENT = grpc.StatusCode.UNAVAILABLE


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def core_of(clock: Clock, *, silent_after: float | None = 2.0, address: str = "m0:1") -> Any:
    core = ClientCore(address, silent_after=silent_after, clock=clock)
    core.met(pb.MembersReply(addresses=MEMBERS, partitions=3, leader=0))
    return core


def members(leader: int = 0, silent: tuple[int, ...] = ()) -> pb.MembersReply:
    return pb.MembersReply(addresses=MEMBERS, partitions=3, leader=leader, silent=silent)


def drive(plan: Plan[Any], answer: Callable[[Any], Any]) -> tuple[Any, list[Any]]:
    """Runs ``plan`` to its decision, each question answered by ``answer``; (the decision,
    the questions asked)."""
    asked: list[Any] = []
    question = step(plan, None)
    while not isinstance(question, Done):
        asked.append(question)
        question = step(plan, answer(question))
    return question.value, asked


def insert(k: int) -> list[pb.Operation]:
    return [pb.Operation(kind=pb.Operation.INSERT, table="t", values=to_row({"k": k}))]


def described(question: Any) -> pb.DescribeReply:
    assert question == Describe("t")
    schema = TableSchema("t", "t_1", (Column("k", ColumnType("INT"), nullable=False),), ("k",))
    return pb.DescribeReply(kind=pb.DescribeReply.TABLE, schema_json=json.dumps(schema.to_json()))


def test_a_transaction_goes_to_the_member_hosting_its_rows_once_the_schema_is_known() -> None:
    """The route asks each unknown table's schema once, then places the rows; a member heard
    silent (a commit's trailing metadata) gets none of them for ``UNREACHABLE_FOR``."""
    clock = Clock()
    core = core_of(clock)
    _, asked = drive(core.route(insert(0)), described)
    assert asked == [Describe("t")]
    at_two = next(k for k in range(100) if drive(core.route(insert(k)), described)[0] == 2)
    assert drive(core.route(insert(at_two)), described) == (2, [])  # nothing asked again

    core.heard_verdict(((SILENT_MEMBERS_KEY, "2"), ("other", "x")))
    assert drive(core.route(insert(at_two)), described)[0] == 0  # the leader
    clock.now += UNREACHABLE_FOR
    assert drive(core.route(insert(at_two)), described)[0] == 2


def test_a_client_that_does_not_route_sends_everything_to_the_address_given() -> None:
    core = ClientCore("m1:1", route=False)
    assert drive(core.route(insert(0)), described) == (None, [])
    assert drive(core.relearn(), described) == (None, [])  # nobody to ask


def test_a_commit_answered_in_time_asks_nothing() -> None:
    clock = Clock()
    watch = core_of(clock).watch(2)
    assert watch.wait() == ASK_OTHERS_AFTER
    clock.now += 0.5
    assert drive(watch.checks(), pytest.fail) == (None, [])


def test_no_checks_without_silent_after() -> None:
    assert core_of(Clock(), silent_after=None).watch(2) is None


def test_the_others_hearing_the_coordinator_silent_give_the_commit_up() -> None:
    """After ``ASK_OTHERS_AFTER`` another member (the first not avoided) is asked; while it
    hears the coordinator, the commit is waited for and asked about every
    ``ASK_OTHERS_EVERY``; once it hears it silent, the commit is given up (outcome unknown)
    and the coordinator is routed around."""
    clock = Clock()
    core = core_of(clock)
    watch = core.watch(2)
    clock.now += ASK_OTHERS_AFTER
    assert drive(watch.checks(), lambda q: members()) == (None, [Ask(0, ASK_OTHERS_EVERY * 2)])
    assert watch.wait() == ASK_OTHERS_EVERY

    clock.now += ASK_OTHERS_EVERY
    error, asked = drive(watch.checks(), lambda q: members(silent=(2,)))
    assert asked == [Ask(0, ASK_OTHERS_EVERY * 2)]
    assert isinstance(error, OutcomeUnknown) and isinstance(error, errors.Unavailable)
    assert "others hear it silent" in str(error)
    assert core.router.avoided(2, clock.now)


def test_the_member_asked_is_one_not_avoided_and_its_silence_is_no_verdict() -> None:
    clock = Clock()
    core = core_of(clock)
    core.heard_silent([0])
    watch = core.watch(2)
    clock.now += ASK_OTHERS_AFTER
    assert drive(watch.checks(), lambda q: SILENT) == (None, [Ask(1, ASK_OTHERS_EVERY * 2)])
    assert not core.router.avoided(2, clock.now)


def test_a_coordinator_that_answers_no_probe_is_given_up_on() -> None:
    """After ``silent_after`` the coordinator itself is asked: one that answers anything (an
    error too) is waited for, and asked again ``silent_after`` later; one that answers
    nothing gives the commit up."""
    clock = Clock()
    core = core_of(clock)
    watch = core.watch(1)
    clock.now += 2.0

    def nobody_hears_silent(question: Ask) -> Any:
        return members() if question.member != 1 else grpc.StatusCode.FAILED_PRECONDITION

    error, asked = drive(watch.checks(), nobody_hears_silent)
    assert error is None and asked == [Ask(0, 1.0), Ask(1, core.probe_timeout)]
    assert watch.probe_at == clock.now + 2.0
    clock.now = watch.probe_at
    error, asked = drive(watch.checks(), lambda q: members() if q.member != 1 else SILENT)
    assert isinstance(error, OutcomeUnknown) and "did not answer for 4s" in str(error)


def test_a_member_that_answers_unavailable_is_not_avoided_but_one_silent_is() -> None:
    """A commit given up on: its member is asked whether it answers at all (not when the
    checks already found it silent); only one that does not is avoided. Then who leads is
    asked."""
    clock = Clock()
    core = core_of(clock)
    _, asked = drive(core.gave_up(1, errors.Unavailable("a participant")), lambda q: members())
    assert asked == [Ask(1, core.probe_timeout), Ask(None, core.probe_timeout)]
    assert not core.router.avoided(1, clock.now)

    clock.now += RELEARN_EVERY
    _, asked = drive(core.gave_up(1, errors.Unavailable("timed out")), lambda q: SILENT)
    assert asked[0] == Ask(1, core.probe_timeout)
    assert core.router.avoided(1, clock.now)

    clock.now += RELEARN_EVERY
    _, asked = drive(core.gave_up(2, OutcomeUnknown("silent")), lambda q: members())
    assert Ask(2, core.probe_timeout) not in asked
    assert core.router.avoided(2, clock.now)


def test_an_answer_that_could_not_carry_the_verdict_is_asked_for_it() -> None:
    """A Transact stream's reply has no trailing metadata: the member that answered
    "unavailable" is asked which members it hears silent, and they are routed around."""
    clock = Clock()
    core = core_of(clock)
    plan = core.gave_up(0, errors.Unavailable("prepare"), verdict_carried=False)
    drive(plan, lambda q: members(silent=(2,)))
    assert core.router.avoided(2, clock.now) and not core.router.avoided(0, clock.now)

    core = core_of(clock)  # a Commit's answer carried it: the probe's list is not used
    drive(core.gave_up(0, errors.Unavailable("prepare")), lambda q: members(silent=(2,)))
    assert not core.router.avoided(2, clock.now)


def test_relearning_asks_the_address_given_then_each_member_answering() -> None:
    """Who leads is asked of the address given, then of each member not avoided; one that
    does not answer is avoided. The address given gone, the leader serves in its place. At
    most once every ``RELEARN_EVERY``."""
    clock = Clock()
    core = core_of(clock, address="m1:1")
    core.heard_silent([2])

    def answer(question: Ask) -> Any:
        return SILENT if question.member is None else members(leader=1)

    leader, asked = drive(core.relearn(), answer)
    assert leader == 1 and core.router.leader == 1
    # the address given (member 1) did not answer: avoided; member 0 answers for it
    assert [q.member for q in asked] == [None, 0]
    assert core.router.avoided(1, clock.now) and not core.router.avoided(0, clock.now)
    assert drive(core.relearn(), answer) == (None, [])  # too soon

    clock.now += UNREACHABLE_FOR
    leader, asked = drive(core.relearn(), lambda q: members(leader=2))
    assert (leader, [q.member for q in asked]) == (None, [None])  # the address given answers


def test_an_error_sent_back_is_an_answer() -> None:
    assert answered(members())
    assert answered(grpc.StatusCode.PERMISSION_DENIED)
    assert not answered(grpc.StatusCode.UNAVAILABLE)
    assert not answered(grpc.StatusCode.DEADLINE_EXCEEDED)


def test_a_row_goes_to_the_member_of_its_keys_partition_and_stays_as_sent() -> None:
    """The route decodes only a row's key: a two-column key places the row where the servers'
    partition map does (other columns, a NULL among them, change nothing), and an operation
    without its key goes to the address given, unchanged (a map's ``[]`` would add it)."""
    schema = TableSchema(
        "t",
        "t_1",
        (
            Column("a", ColumnType("INT"), nullable=False),
            Column("b", ColumnType("TEXT"), nullable=False),
            Column("note", ColumnType("TEXT")),
        ),
        ("a", "b"),
    )
    router = Router(MEMBERS, 6)
    router.learn(
        "t", pb.DescribeReply(kind=pb.DescribeReply.TABLE, schema_json=json.dumps(schema.to_json()))
    )
    for a in range(40):
        row = {"a": a, "b": f"k{a % 3}", "note": None if a % 2 else "x"}
        op = pb.Operation(kind=pb.Operation.INSERT, table="t", values=to_row(row))
        key = table_key(schema, {"a": a, "b": row["b"]})
        assert router.member_for([op]) == partition_of("t_1", key, 6) % len(MEMBERS)
        delete = pb.Operation(
            kind=pb.Operation.DELETE, table="t", key=to_row({"a": a, "b": row["b"]})
        )
        assert router.member_for([delete]) == router.member_for([op])
    keyless = pb.Operation(kind=pb.Operation.INSERT, table="t", values=to_row({"a": 1}))
    assert router.member_for([keyless]) is None
    assert sorted(keyless.values.columns) == ["a"]
