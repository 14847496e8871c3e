"""The majority rule (``coordinator.quorum``): who counts as reachable, and when a member may
act on another's silence."""

from __future__ import annotations

from coordinator.quorum import Reachability


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
