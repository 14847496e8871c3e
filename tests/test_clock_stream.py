"""A follower's clock stream to a real leader clock on framed TCP, in one event loop: its
timestamp requests are pipelined (``clock_service.ASKS_OUT``), and what it is granted stays
unique, increasing and strictly serializable for reads."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from aggview import errors
from aggview.frames import FramedServer
from coordinator import clock_service
from coordinator.clock import Clock
from coordinator.clock_service import ClockServicer, FollowerClock
from coordinator.leadership import Lease
from coordinator.member_clock import InFlight, LeaderClock
from coordinator.timestamp_oracle import TimestampOracle
from ltm.server import framed_exchange


def _no_partition(metadata: dict[str, str]) -> Any:
    raise errors.InvalidArgument("this test serves the clock only")


async def _leader_and_follower() -> tuple[LeaderClock, FollowerClock, FramedServer]:
    meta: dict[str, str] = {}
    leader = LeaderClock(Clock(TimestampOracle(meta.get, meta.__setitem__), members=2), InFlight())
    servicer = ClockServicer(lambda: leader)
    server = await FramedServer(
        framed_exchange(_no_partition, None, {"clock": lambda hello: servicer.framed()})
    ).start("127.0.0.1", 0)
    address = f"127.0.0.1:{server.port}"
    follower = FollowerClock(
        1,
        InFlight(),
        "127.0.0.1:1",
        None,
        lambda epoch, configuration: None,
        exchanges=[address, address],
    )
    await follower.start()
    return leader, follower, server


def test_pipelined_grants_stay_unique_increasing_and_reads_see_every_finished_write() -> None:
    async def run() -> tuple[int, int, list[int]]:
        leader, follower, server = await _leader_and_follower()
        most_out = 0
        send = follower._send

        def counting_send() -> None:
            nonlocal most_out
            send()
            most_out = max(most_out, len(follower._asked_reads))

        follower._send = counting_send  # type: ignore[method-assign]
        finished: list[int] = []  # write timestamps decided before a read began
        problems: list[str] = []
        rng = random.Random(7)

        async def writer() -> None:
            last = 0
            for _ in range(40):
                ts, _epoch = await follower.next()
                if ts <= last:
                    problems.append(f"granted {ts} after {last}")
                last = ts
                await asyncio.sleep(rng.random() / 1000)
                follower.in_flight.decided(ts)
                finished.append(ts)

        async def reader() -> None:
            for _ in range(20):
                seen = max(finished, default=0)
                ts = await follower.read_timestamp()
                if ts < seen:
                    problems.append(f"read at {ts} below the finished write {seen}")
                await follower.wait_decided(ts)
                follower.in_flight.stop_reading(ts)

        async def leader_writer() -> None:
            for _ in range(40):
                ts, _epoch = await leader.next()
                await asyncio.sleep(0)
                leader.in_flight.decided(ts)

        try:
            await asyncio.gather(
                *(writer() for _ in range(12)), *(reader() for _ in range(4)), leader_writer()
            )
        finally:
            await follower.close()
            await server.close()
        assert not problems, problems[:3]
        return most_out, follower.requests, finished

    most_out, requests, finished = asyncio.run(run())
    assert len(finished) == len(set(finished)) == 12 * 40
    assert most_out == clock_service.ASKS_OUT  # requests were pipelined, never more
    assert requests < len(finished)  # and each carried several transactions' timestamps


def test_a_timestamp_asked_while_the_stream_reconnects_is_answered_or_refused() -> None:
    """A request made in the pause between a stream's end and the next stream went out on the
    stream that ended: it must fail (the caller asks again) or be granted, never wait forever
    (a member restarting while the leader moved waited so, and the cluster with it)."""

    async def run() -> list[str]:
        leader, follower, server = await _leader_and_follower()
        outcomes: list[str] = []
        try:
            await server.close()  # the leader goes: the stream ends
            for _ in range(100):
                if follower._down is not None:
                    break
                await asyncio.sleep(0.01)
            assert follower._down is not None
            asked = asyncio.ensure_future(follower.read_timestamp())  # in the pause
            server = await FramedServer(
                framed_exchange(
                    _no_partition,
                    None,
                    {"clock": lambda hello: ClockServicer(lambda: leader).framed()},
                )
            ).start("127.0.0.1", int(follower._exchanges[0].rsplit(":", 1)[1]))
            try:
                outcomes.append(f"granted {await asyncio.wait_for(asked, 10)}")
            except errors.Unavailable as exc:
                outcomes.append(f"refused: {exc}")
        finally:
            await follower.close()
            await server.close()
        return outcomes

    outcomes = asyncio.run(run())
    assert len(outcomes) == 1, outcomes


def test_a_leader_whose_lease_ran_out_grants_nothing_to_anyone() -> None:
    """No split brain: once its lease ran out (the store did not confirm its term, or a
    successor's term is there), the old leader refuses every timestamp, its own and its
    followers' (asked on their streams), so it never grants beside a successor. The grants
    resume when a read of the record confirms the lease again."""

    async def run() -> None:
        leader, follower, server = await _leader_and_follower()
        now = [100.0]
        leader.lease = Lease(2.0, clock=lambda: now[0])
        leader.lease.confirmed(99.0)
        try:
            assert (await leader.read_timestamp()) >= 0  # within the lease: granted
            granted, _ = await follower.next()
            now[0] = 101.5  # 2.5 s after the read that confirmed it
            with pytest.raises(errors.Unavailable, match="cannot confirm it still leads"):
                leader.take()
            with pytest.raises(errors.Unavailable, match="cannot confirm it still leads"):
                await leader.read_timestamp()
            with pytest.raises(errors.Unavailable):
                await asyncio.wait_for(follower.next(), 10)
            leader.lease.confirmed(101.4)  # a new read found it leading
            await follower.start()  # its stream ended with the refusal: a new one
            again, _ = await follower.next()
            assert again > granted
        finally:
            await follower.close()
            await server.close()

    asyncio.run(run())
