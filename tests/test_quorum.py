"""The majority rule (``coordinator.quorum``): who counts as reachable, and when a member may
act on another's silence."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from agglauncher.cluster import LocalCluster
from coordinator.quorum import Prober, Reachability, majority_heard


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_member_counts_itself_and_the_members_heard_within_the_window() -> None:
    clock = FakeClock()
    reach = Reachability(5, me=2, window=1.0, clock=clock)
    assert reach.reachable() == {2} and not reach.has_majority()
    reach.heard(0)
    assert not reach.has_majority()  # 2 of 5
    reach.heard(4)
    assert reach.reachable() == {0, 2, 4} and reach.has_majority()  # 3 of 5
    clock.now += 0.6
    reach.heard(0)
    clock.now += 0.6  # member 4's answer is 1.2 s old now
    assert reach.reachable() == {0, 2} and not reach.has_majority()


def test_a_wait_for_a_majority_ends_when_one_answers_and_says_so_once() -> None:
    """What a follower starting does before it touches its records (``majority_heard``)."""
    reach = Reachability(3, me=2, window=5.0)
    told: list[None] = []

    async def scenario() -> None:
        waiting = asyncio.create_task(majority_heard(reach, lambda: told.append(None), 0.01))
        await asyncio.sleep(1.5)  # past the first probes' time: it says it waits, once
        assert not waiting.done() and told == [None]
        reach.heard(0)
        await asyncio.wait_for(waiting, 1.0)
        await majority_heard(reach, lambda: told.append(None))  # heard: returns at once
        assert told == [None]

    asyncio.run(scenario())


def test_an_old_answer_never_replaces_a_newer_one() -> None:
    clock = FakeClock()
    reach = Reachability(3, me=0, window=1.0, clock=clock)
    reach.heard(1, at=99.9)
    reach.heard(1, at=98.0)  # a slow probe that was sent earlier answers later
    assert reach.has_majority()


def test_three_members_need_two_and_two_members_leave_it_to_the_store() -> None:
    clock = FakeClock()
    three = Reachability(3, me=1, window=1.0, clock=clock)
    assert not three.has_majority()
    three.heard(2)
    assert three.has_majority()
    assert Reachability(2, me=0, clock=clock).has_majority()  # see its docstring
    assert Reachability(1, me=0, clock=clock).has_majority()


def test_a_link_cut_between_two_members_is_no_majority_of_silence() -> None:
    """Member 1 no longer hears member 0 (their link is cut), but member 2 hears both: member
    0 is not silent to a majority, so member 1 deposes and moves nothing."""
    clock = FakeClock()
    reach = Reachability(3, me=1, window=1.0, clock=clock)
    reach.heard(2, reaches=[0, 1, 2])
    assert not reach.silent_to_majority(0)
    reach.heard(2, reaches=[1, 2])  # now member 2 lost it too: member 0 is cut off
    assert reach.silent_to_majority(0)


def test_a_member_heard_here_is_never_silent_and_a_minority_sees_no_majority_of_silence() -> None:
    clock = FakeClock()
    reach = Reachability(5, me=0, window=1.0, clock=clock)
    reach.heard(3, reaches=[0, 3])
    assert not reach.silent_to_majority(3)
    # members 1 and 2 answer and do not hear member 4; with this one, three of five
    assert not reach.silent_to_majority(4)  # only this one and member 3's report so far
    reach.heard(1, reaches=[0, 1, 2])
    reach.heard(2, reaches=[0, 1, 2])
    assert reach.silent_to_majority(4)
    clock.now += 2  # nobody heard for a while: this member alone is no majority
    assert not reach.silent_to_majority(4)


def test_probes_of_real_members_record_whom_each_hears(tmp_path: Path) -> None:
    """The prober as members run it, against a real replicated cluster: each member answers
    and says it hears the three, so none of them is silent to a majority."""
    with LocalCluster(tmp_path, ltms=3, processes=3, replicate=True) as cluster:
        addresses = [server.address for server in cluster.servers]

        async def probe() -> Reachability:
            reach = Reachability(4, me=3)  # an observer as a fourth member would be
            prober = Prober(reach, [*addresses, "127.0.0.1:1"], None)
            prober.start()
            try:
                deadline = time.monotonic() + 20
                while any(reach.reported(m) != {0, 1, 2} for m in range(3)):
                    assert time.monotonic() < deadline, [reach.reported(m) for m in range(3)]
                    await asyncio.sleep(0.1)
            finally:
                await prober.stop()
            return reach

        reach = asyncio.run(probe())
        assert reach.reachable() == {0, 1, 2, 3}
        assert not any(reach.silent_to_majority(m) for m in range(3))


def test_a_member_is_silent_once_heard_then_unanswered_past_the_window() -> None:
    """``silent``: never while never heard (a member starting keeps its calls' grace), nor
    while its last answer is within the window; once it left a probe unanswered after an
    answer older than the window, until it answers again."""
    clock = FakeClock()
    reach = Reachability(3, me=0, window=1.0, clock=clock)
    reach.failed(2)
    assert not reach.silent(2)  # never heard: starting, not silent
    reach.heard(2)
    clock.now += 0.5
    reach.failed(2)
    assert not reach.silent(2)  # answered half a second ago
    clock.now += 0.6  # its answer is 1.1 s old, and a probe sent since went unanswered
    assert reach.silent(2) and not reach.silent(0)
    reach.heard(1)
    assert not reach.silent(1)  # heard, never unanswered
    reach.heard(2)
    assert not reach.silent(2)
