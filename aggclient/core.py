"""What a client decides, without I/O: where a transaction goes, who leads, which members are
silent, and when a commit still unanswered is given up on (outcome unknown).

``Client`` (blocking) and ``AsyncClient`` (asyncio) are thin shells over one
:class:`ClientCore`: they do the calls, the core decides. A decision that needs an answer from
the cluster is a *plan*, a generator that yields what it needs to know (:class:`Ask`: a
``Members`` call to a member; :class:`Describe`: a table's schema) and is sent the answer; it
returns its decision. Each shell drives plans with its own kind of call (:func:`step`), and a
test drives them with answers of its own, without a server. The clock is passed in for the
same reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from aggclient.routing import Router
from aggview import errors
from aggview.status import silent_members
from aggview.wire import client_pb2 as pb

T = TypeVar("T")

# A commit unanswered this long makes the client ask the member whether it still answers at
# all (a cheap ``Members`` call, given as long): a member that does not, cut off from the
# network or stopped, is given up on (outcome unknown) and routed around, instead of being
# waited for until the call's deadline or the network heals. A member that answers, however
# slow the commit, is waited for. Two seconds each: at 1 s, members of a cluster starved of
# CPU (four test workers on two cores) missed both and clients gave up on healthy members.
SILENT_AFTER = 2.0
# Sooner than that, and again every half second, another member is asked whether its prober
# hears the coordinating member silent (a member cut off is heard so by the others about a
# second into the cut): the cluster's view, not a guess from one slow call.
ASK_OTHERS_AFTER = 1.0
ASK_OTHERS_EVERY = 0.5
# the codes of a call nobody answered (an error the server sent back is an answer)
SILENT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
RELEARN_EVERY = 1.0  # seconds between two rounds of asking who leads


class OutcomeUnknown(errors.Unavailable):
    """A member that answered neither a commit nor a probe, or that the others hear silent:
    the commit was given up on, and whether it committed is unknown."""


@dataclass(frozen=True)
class Ask:
    """A plan's question: a ``Members`` call to ``member`` (None: the address the client was
    given) within ``timeout`` s. Answered with the ``MembersReply``, or the status code of
    the call that failed."""

    member: int | None
    timeout: float


@dataclass(frozen=True)
class Describe:
    """A plan's question: ``Describe`` of ``table`` at the address given. Answered with the
    ``DescribeReply``, or None when it failed (no such table yet)."""

    table: str


Answer = Any  # pb.MembersReply | grpc.StatusCode for an Ask; pb.DescribeReply | None
Plan = Generator[Ask | Describe, Answer, T]


@dataclass(frozen=True)
class Done:
    """A plan's decision (what :func:`step` gives once the plan has returned)."""

    value: Any


def step(plan: Plan[Any], answer: Answer) -> Ask | Describe | Done:
    """Sends ``plan`` the answer to its last question (None to start it): its next question,
    or its decision. What both shells' drivers are made of."""
    try:
        return plan.send(answer)
    except StopIteration as done:
        return Done(done.value)


def answered(answer: Answer) -> bool:
    """Whether an ``Ask`` was answered at all (an error the member sent back is an answer)."""
    return isinstance(answer, pb.MembersReply) or answer not in SILENT_CODES


class CommitWatch:
    """The checks on one commit in flight at ``member`` (None: the address given), as
    ``Client`` has made them since issue 45: after ``ASK_OTHERS_AFTER`` and every
    ``ASK_OTHERS_EVERY`` another member is asked whether it hears ``member`` silent; after
    ``silent_after`` the member itself is asked whether it answers at all. Either verdict
    gives the commit up (:class:`OutcomeUnknown`)."""

    def __init__(self, core: ClientCore, member: int | None, silent_after: float) -> None:
        self.core = core
        self.member = member
        self.silent_after = silent_after
        now = core.clock()
        self.ask_at = now + ASK_OTHERS_AFTER
        self.probe_at = now + silent_after

    def wait(self) -> float:
        """How long to wait for the answer before the next check."""
        return max(0.0, min(self.ask_at, self.probe_at) - self.core.clock())

    def checks(self) -> Plan[OutcomeUnknown | None]:
        """The checks due now: the error to give the commit up with, or None (wait on)."""
        now = self.core.clock()
        if now >= self.ask_at:
            self.ask_at = now + ASK_OTHERS_EVERY
            if (yield from self.core.others_hear_silent(self.member)):
                return OutcomeUnknown(
                    f"member {self.member}, coordinating this transaction, did not answer "
                    "and the others hear it silent: its outcome is unknown"
                )
        if now >= self.probe_at:
            if not answered((yield Ask(self.member, self.core.probe_timeout))):
                return OutcomeUnknown(
                    "the member coordinating this transaction did not answer for "
                    f"{self.silent_after + self.core.probe_timeout:g}s: its outcome is unknown"
                )
            self.probe_at = self.core.clock() + self.silent_after
        return None


class ClientCore:
    """One client's routing state and decisions (``Router``, who leads, who is silent).

    ``route=False``: everything goes to the address given. ``silent_after``: see
    ``Client``; None: a commit is waited for up to the call's deadline."""

    def __init__(
        self,
        address: str,
        *,
        route: bool = True,
        silent_after: float | None = SILENT_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.address = address
        self.silent_after = silent_after
        self.clock = clock
        self.router: Router | None = None if route else Router([], 0)
        self.framed: list[str] = []  # the members' framed ports for transactions, if any
        self._relearn_after = 0.0

    @property
    def probe_timeout(self) -> float:
        """How long a member asked whether it answers at all is given."""
        return min(2.0, self.silent_after or 2.0)

    def met(self, reply: pb.MembersReply) -> Router:
        """What the first ``Members`` answer said (an empty one: a server from before
        members, which serves everything)."""
        if self.router is None:
            self.router = Router(reply.addresses, reply.partitions, reply.leader)
            self.framed = list(reply.transact_addresses)
        return self.router

    def framed_port(self, member: int) -> str:
        """The member's framed port for transactions ("": gRPC only)."""
        return self.framed[member] if member < len(self.framed) else ""

    def route(self, operations: Sequence[pb.Operation]) -> Plan[int | None]:
        """The member to send these operations to (None: the address given), asking the
        schemas of the tables it does not know yet. Needs the router (``met``)."""
        router = self.router
        assert router is not None, "met() first"
        if not router.routes:
            return None
        for table in sorted(router.unknown(operations)):
            router.learn(table, (yield Describe(table)))
        return router.member_for(operations, self.clock())

    def heard_silent(self, members: Sequence[int]) -> None:
        """A member said which members its prober hears silent: the next transactions are
        routed around them (``Router.unreachable``)."""
        if members and self.router is not None:
            now = self.clock()
            for member in members:
                self.router.unreachable(member, now)

    def heard_verdict(self, metadata: Any) -> None:
        """A commit's answer, ok or not: its trailing metadata's verdict (``tell_silent``)."""
        self.heard_silent(silent_members(metadata))

    def watch(self, member: int | None) -> CommitWatch | None:
        """The checks on a commit sent to ``member`` (None: no checks, see ``silent_after``)."""
        return None if self.silent_after is None else CommitWatch(self, member, self.silent_after)

    def others_hear_silent(self, member: int | None) -> Plan[bool]:
        """Whether another member's prober hears ``member`` silent (asked of the first other
        member not avoided; False when there is none or it does not answer either). If so,
        ``member`` is avoided."""
        router = self.router
        if member is None or router is None or not router.routes:
            return False
        now = self.clock()
        others = [m for m in range(len(router.members)) if m != member]
        other = next((m for m in others if not router.avoided(m, now)), None)
        if other is None:
            return False
        reply = yield Ask(other, ASK_OTHERS_EVERY * 2)
        if isinstance(reply, pb.MembersReply) and member in reply.silent:
            router.unreachable(member, self.clock())
            return True
        return False

    def gave_up(
        self, member: int | None, exc: errors.Unavailable, verdict_carried: bool = True
    ) -> Plan[int | None]:
        """A commit at ``member`` failed as unavailable (the retries spent): ``member`` is
        avoided only if it does not answer (one that answers unavailable, because a
        participant of this transaction is, coordinates the next ones as well as any other,
        and avoiding it sent them to the leader, which may be the silent one); then who
        leads is asked (:meth:`relearn`, whose decision this returns). ``verdict_carried``
        False: the answer could not say which members are silent (a ``Transact`` stream's
        reply has no trailing metadata), so the member's ``Members`` answer says it."""
        avoid = isinstance(exc, OutcomeUnknown)
        if not avoid:
            answer = yield Ask(member, self.probe_timeout)
            if not verdict_carried and isinstance(answer, pb.MembersReply):
                self.heard_silent(list(answer.silent))
            avoid = not answered(answer)
        if avoid and self.router is not None:
            self.router.unreachable(member, self.clock())
        return (yield from self.relearn())

    def relearn(self) -> Plan[int | None]:
        """A server did not answer: who leads now (another member took the lead from a dead
        one), asked of the address given and then of each member not avoided (each would
        cost a probe's timeout); one that does not answer is avoided. At most once every
        ``RELEARN_EVERY``. Returns the leader when the address given is the one gone (it
        serves what went there from now on), else None."""
        router, now = self.router, self.clock()
        if router is None or not router.routes or now < self._relearn_after:
            return None
        self._relearn_after = now + RELEARN_EVERY
        given = router.members.index(self.address) if self.address in router.members else None
        for member in [None, *range(len(router.members))]:
            index = given if member is None else member
            if router.avoided(index, now):
                continue
            reply = yield Ask(member, self.probe_timeout)
            if not isinstance(reply, pb.MembersReply):
                router.unreachable(index, self.clock())
                continue
            router.leader = reply.leader
            return None if member is None else reply.leader
        return None
