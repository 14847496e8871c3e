"""A member that stops answering (cut off from the network, or stopped) must not hold the
others' clients and in-doubt rows until it is back (issue 45: the majority stays available).

- A client whose commit went to a member that answers nothing gives up on it within about
  ``silent_after`` plus a probe (the outcome is unknown) and routes around it, instead of
  waiting for the call's deadline or for the network to heal.
- A participant asking about in-doubt transactions does not ask a member whose decision log
  its own member holds, and asks the others at once: a silent coordinator whose log was
  adopted costs nothing, and one still being waited for costs one timeout, not one each.
- A member's streams to a member its prober hears silent (a second without an answer) fail
  at once as unavailable, the prepares to its partitions and the clock stream to it as the
  leader, instead of when TCP gives up (never, for a stopped process on loopback: its kernel
  still acknowledges)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pausing import paused
from polling import wait_for

from aggclient import AsyncClient, Client
from aggclient.client import Transaction
from agglauncher.cluster import LocalCluster
from aggview import errors
from aggview.wire import ltm_pb2 as lpb
from coordinator.outcomes import ask_outcomes
from loadgen import transfers
from tests.test_failover import member_logs_copied, replicated_cluster, status

ACCOUNTS = 30


@pytest.fixture
def quiet_failover(tmp_path: Path) -> Iterator[LocalCluster]:
    # nothing moves while member 2 is paused: what is measured is the client alone
    with replicated_cluster(tmp_path / "data", failover_after=60.0) as cluster:
        yield cluster


@contextlib.contextmanager
def loaded(cluster: LocalCluster) -> Iterator[Client]:
    """A client (20 s deadline) of a cluster with the transfer tables, every log copied, every
    member heard by the others' probers (silence is only noticed in a member heard once: on a
    busy machine a member up for less than a second may not have been yet)."""
    with Client(cluster.address, timeout=20) as client:
        transfers.create(client, "accounts", "ledger", ACCOUNTS)
        wait_for("every log copied", lambda: member_logs_copied(cluster, [0, 1, 2]))
        wait_for("every member heard by the others", lambda: all_heard(cluster))
        yield client


def all_heard(cluster: LocalCluster) -> bool:
    members = set(range(cluster.processes))
    return all(set(status(cluster, m).reaches) == members for m in members)


def process_of(cluster: LocalCluster, member: int) -> subprocess.Popen[bytes]:
    process = cluster.member(member).process
    assert process is not None
    return process


def account_on(client: Client, member: int) -> int:
    """An account whose row the client routes to ``member``."""
    router = client._routing()
    for account in range(ACCOUNTS):
        tx = Transaction()
        tx.add("accounts", {"id": account}, {"balance": 0})
        if router.member_for(tx.operations) == member:
            return account
    raise AssertionError(f"no account on member {member}")


def touch(client: Client, *accounts: int) -> None:
    with client.transaction() as tx:
        for account in accounts:
            tx.add("accounts", {"id": account}, {"balance": 0})


def unavailable_within(
    seconds: float, call: Callable[[], object], match: str | None = None
) -> None:
    """``call`` fails as unavailable, and within ``seconds`` (a silent member's doing)."""
    started = time.monotonic()
    with pytest.raises(errors.Unavailable, match=match):
        call()
    waited = time.monotonic() - started
    assert waited < seconds, f"waited {waited:.1f}s for a silent member"


def test_a_client_gives_up_on_a_silent_member_and_routes_around_it(
    quiet_failover: LocalCluster,
) -> None:
    """Member 2 is paused (its kernel still accepts the connection: the call just hangs, as
    with a host cut off). A commit routed to it fails as unavailable within a few seconds,
    not at the 20 s deadline, once another member says its prober hears member 2 silent
    (before that: once member 2 left a probe of the client's own unanswered, seconds later);
    the same client then commits through the others at once."""
    cluster = quiet_failover
    with loaded(cluster) as client:
        on_2, on_0 = account_on(client, 2), account_on(client, 0)
        touch(client, on_2)  # the channel to member 2 is open
        with paused(process_of(cluster, 2), cluster=cluster):
            unavailable_within(6.0, lambda: touch(client, on_2), match="others hear it silent")
            started = time.monotonic()
            touch(client, on_0)
            assert time.monotonic() - started < 2.0
            assert client.last_member == 0
        wait_for("member 2 answering again", lambda: _touched(client, on_2), 30)


def test_prepares_to_a_silent_members_partition_fail_once_the_prober_hears_it_silent(
    quiet_failover: LocalCluster,
) -> None:
    """Member 0 coordinates a transaction with a row on member 2 (paused): its prepare to
    partition 2 fails as unavailable about a second into the silence, so the client hears
    "unavailable" within seconds; before, the prepare waited on the stream until the
    client's 20 s deadline (on loopback TCP never gives up on a stopped process). The
    answers name member 2 as silent, so the client sends its next transaction on member 2's
    row elsewhere."""
    cluster = quiet_failover
    with loaded(cluster) as client:
        on_0, on_2 = account_on(client, 0), account_on(client, 2)
        touch(client, on_2)  # the streams to member 2 are open
        with paused(process_of(cluster, 2), cluster=cluster):
            # on a tie the first row's member coordinates
            unavailable_within(6.0, lambda: touch(client, on_0, on_2))
            assert client.last_member == 0
            started = time.monotonic()
            touch(client, on_0)  # member 0's own partition is not held by it
            assert time.monotonic() - started < 2.0
            # member 0's answers said member 2 is silent: a transaction on member 2's row
            # goes to another member and fails there at once, instead of waiting out member
            # 2's silence in the client (seconds)
            unavailable_within(2.0, lambda: touch(client, on_2), match="does not answer probes")
            assert client.last_member != 2
        wait_for("member 2 answering again", lambda: _touched(client, on_2), 30)


def test_a_followers_clock_stream_to_a_silent_leader_fails_and_comes_back(
    quiet_failover: LocalCluster,
) -> None:
    """The leader (member 0) is paused and nobody takes over (failover after 60 s): a
    transaction at member 2 on its own row, which needs a timestamp from the leader, fails as
    unavailable within seconds (the clock stream ends once member 2's prober hears the leader
    silent; before, the request waited on the stream until the client's deadline). Resumed,
    the leader grants again on a new stream."""
    cluster = quiet_failover
    with loaded(cluster) as client:
        on_2 = account_on(client, 2)
        touch(client, on_2)
        with paused(process_of(cluster, 0), cluster=cluster):
            unavailable_within(6.0, lambda: touch(client, on_2))
        wait_for("member 2 granting again", lambda: _touched(client, on_2), 30)


def _touched(client: Client, account: int) -> bool:
    try:
        touch(client, account)
    except errors.Unavailable:
        return False
    return True


async def touch_async(client: AsyncClient, *accounts: int) -> None:
    async with client.transaction() as tx:
        for account in accounts:
            tx.add("accounts", {"id": account}, {"balance": 0})


async def unavailable_within_async(
    seconds: float, call: Callable[[], Awaitable[object]], match: str | None = None
) -> None:
    """As :func:`unavailable_within`, for an ``AsyncClient``'s call."""
    started = time.monotonic()
    with pytest.raises(errors.Unavailable, match=match):
        await call()
    waited = time.monotonic() - started
    assert waited < seconds, f"waited {waited:.1f}s for a silent member"


async def answering_again(client: AsyncClient, account: int, timeout: float = 30.0) -> None:
    """Polls a transaction on ``account`` until it commits (the member resumed)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await touch_async(client, account)
            return
        except errors.Unavailable:
            assert time.monotonic() < deadline, "timed out waiting for the member to answer"
            await asyncio.sleep(0.05)


def with_member_paused(
    cluster: LocalCluster, member: int, warm: int, body: Callable[[AsyncClient], Awaitable[None]]
) -> None:
    """``body(client)`` with an ``AsyncClient`` (20 s deadline) whose streams are open (a
    transaction on account ``warm`` first), ``member`` paused; then ``warm`` commits again."""

    async def run() -> None:
        async with AsyncClient(cluster.address, timeout=20) as client:
            await touch_async(client, warm)
            with paused(process_of(cluster, member), cluster=cluster):
                await body(client)
            await answering_again(client, warm)

    asyncio.run(run())


async def commits_at_once(client: AsyncClient, account: int, member: int) -> None:
    """A transaction on ``account`` commits within 2 s, coordinated by ``member``."""
    started = time.monotonic()
    await touch_async(client, account)
    assert time.monotonic() - started < 2.0
    assert client.last_member == member


def test_an_async_client_gives_up_on_a_silent_member_and_routes_around_it(
    quiet_failover: LocalCluster,
) -> None:
    """As :func:`test_a_client_gives_up_on_a_silent_member_and_routes_around_it`, with an
    ``AsyncClient``, whose transactions go on a stream per member: a transaction on the
    stream to paused member 2 fails as unavailable within seconds, once another member says
    it hears member 2 silent (not at the 20 s deadline), and the next goes to member 0."""
    cluster = quiet_failover
    with loaded(cluster) as setup:
        on_2, on_0 = account_on(setup, 2), account_on(setup, 0)

    async def body(client: AsyncClient) -> None:
        await unavailable_within_async(
            6.0, lambda: touch_async(client, on_2), match="others hear it silent"
        )
        await commits_at_once(client, on_0, member=0)

    with_member_paused(cluster, 2, on_2, body)


def test_an_async_client_routes_around_a_member_a_failed_answer_hears_silent(
    quiet_failover: LocalCluster,
) -> None:
    """As :func:`test_prepares_to_a_silent_members_partition_fail_once_the_prober_hears_it_silent`,
    with an ``AsyncClient``: its stream's answer carries no trailing metadata, so the client
    asks the member that answered "unavailable" (``Members``) which members it hears silent,
    and sends the next transaction on member 2's row elsewhere, where it fails at once."""
    cluster = quiet_failover
    with loaded(cluster) as setup:
        on_0, on_2 = account_on(setup, 0), account_on(setup, 2)

    async def body(client: AsyncClient) -> None:
        await unavailable_within_async(6.0, lambda: touch_async(client, on_0, on_2))
        assert client.last_member == 0
        await commits_at_once(client, on_0, member=0)
        await unavailable_within_async(
            2.0, lambda: touch_async(client, on_2), match="does not answer probes"
        )
        assert client.last_member != 2

    with_member_paused(cluster, 2, on_2, body)


class _Manager:
    """What ``ask_outcomes`` reads of a member: member 1, holding member 0's decision log."""

    member = 1
    members = ["m0", "m1", "m2"]

    async def answering_for(self) -> list[int]:
        return [0]

    def outcome(self, ts: int) -> int:
        return lpb.OutcomeReply.ABORTED


def test_an_outcome_question_skips_a_member_whose_log_is_held_here() -> None:
    """Member 0 (cut off) never answers; member 1 holds its log, member 2 answers at once:
    the outcome is known without waiting for member 0 (it used to wait out a 5 s timeout)."""
    asked: list[int] = []

    def query(member: int, answer: Any) -> Any:
        async def ask(timestamps: list[int]) -> Any:
            asked.append(member)
            if answer is None:
                await asyncio.sleep(30)
            return answer

        return ask

    others = [
        (0, query(0, None)),
        (2, query(2, lpb.OutcomeReply(outcomes=[lpb.OutcomeReply.ABORTED]))),
    ]

    async def run() -> list[bool | None]:
        return await asyncio.wait_for(ask_outcomes(_Manager(), others, [7]), 2)  # type: ignore[arg-type]

    assert asyncio.run(run()) == [False]
    assert asked == [2]
