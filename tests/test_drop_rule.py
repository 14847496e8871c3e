"""When a primary stops waiting for a copy of its log that does not answer
(``ltm.replication.DropRule``, over ``coordinator.quorum.Reachability``): after a short wait when
the copy's member is silent and the rest of the cluster is not, never when this member is the
one cut off, and not over and over for a copy that is only slow."""

from __future__ import annotations

from coordinator.quorum import Reachability
from ltm.replication import DROP_AFTER, SHIP_TIMEOUT, DropRule


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def rule_for(members: int = 3) -> tuple[FakeClock, Reachability, DropRule]:
    """Member 0's rule for its copy at member 1 (member 2, and more, the others)."""
    clock = FakeClock()
    reach = Reachability(members, me=0, clock=clock)
    for m in range(1, members):
        reach.heard(m, at=clock.now - 0.05)  # everyone answered just before the flush
    return clock, reach, DropRule(reach, member=1)


def test_a_silent_copy_is_dropped_after_the_short_wait_not_the_timeout() -> None:
    clock, reach, rule = rule_for()
    sent = clock.now
    clock.now = sent + 0.15
    reach.heard(2, at=sent + 0.12)  # the other member answers a probe sent after the flush
    assert not rule.give_up(sent, clock.now)  # not waited long enough yet
    clock.now = sent + DROP_AFTER
    assert rule.give_up(sent, clock.now)
    assert DROP_AFTER < 0.5 < SHIP_TIMEOUT


def test_a_copy_that_answers_probes_keeps_the_full_timeout() -> None:
    """A slow disk under an answering member: its flush is slow, the copy not gone."""
    clock, reach, rule = rule_for()
    sent = clock.now
    reach.heard(1, at=sent + 0.15)
    reach.heard(2, at=sent + 0.15)
    clock.now = sent + SHIP_TIMEOUT - 0.01
    assert not rule.give_up(sent, clock.now)


def test_a_member_cut_off_from_every_other_never_drops_its_copy_early() -> None:
    """Its copy's silence is its own isolation: the majority may be failing its partition
    over to that copy, so the record must keep naming it in sync."""
    clock, reach, rule = rule_for()
    sent = clock.now
    for step in range(1, 40):
        clock.now = sent + 0.05 * step
        reach.failed(1, at=clock.now - 1.0)
        reach.failed(2, at=clock.now - 1.0)
        assert not rule.give_up(sent, clock.now)


def test_probes_sent_just_before_a_cut_do_not_count_as_a_whole_network() -> None:
    """A flush already waiting when the cut came: the other member's answer to a probe sent
    within ``DROP_MARGIN`` of the flush may predate the cut."""
    clock, reach, rule = rule_for()
    sent = clock.now
    reach.heard(2, at=sent + 0.05)
    clock.now = sent + 1.0
    assert not rule.give_up(sent, clock.now)
    reach.heard(2, at=sent + 0.2)
    assert rule.give_up(sent, clock.now)


def test_five_members_need_two_others_and_two_members_leave_it_to_the_store() -> None:
    clock, reach, rule = rule_for(members=5)
    sent = clock.now
    clock.now = sent + 0.5
    reach.heard(2, at=sent + 0.2)
    assert not rule.give_up(sent, clock.now)  # 2 of 5
    reach.heard(4, at=sent + 0.2)
    assert rule.give_up(sent, clock.now)  # 3 of 5, the copy's member not among them
    clock, reach, rule = rule_for(members=2)
    clock.now += 0.5
    assert rule.give_up(100.0, clock.now)  # as ``has_majority``: the store arbitrates


def test_a_copy_dropped_is_resynced_only_once_its_member_answers_again() -> None:
    """A resync to a cut member would hold the log's flushes under its lock: it waits for
    an answer to a probe sent after the drop."""
    clock, reach, rule = rule_for()
    sent = clock.now
    reach.heard(2, at=sent + 0.15)
    clock.now = sent + DROP_AFTER
    assert rule.give_up(sent, clock.now)
    rule.dropped(sent, clock.now)
    dropped = clock.now
    reach.failed(1, at=sent + 0.2)  # a cut: its probes go unanswered
    reach.heard(1, at=dropped - 0.05)  # a late answer to a probe sent before the drop
    clock.now += 3.0
    assert not rule.may_resync(clock.now)
    reach.heard(1, at=clock.now - 0.1)  # healed
    assert rule.may_resync(clock.now)
    assert rule.wait(clock.now) == DROP_AFTER  # it was gone, not slow: no backoff


def slow_copy_drops(flushes: int, rule_of: DropRule | None = None) -> int:
    """A copy under CPU starvation: its member acknowledges each flush 0.5 s after it went
    and answers each probe 0.55 s after it was sent (every 0.2 s), so no probe sent during
    a flush's wait is answered within it; the third member answers at once. The flushes go
    one after another, each after the last one's acknowledgement or, once dropped, after
    the resync (once the copy answered a probe sent after the drop). How many drops."""
    clock = FakeClock()
    reach = Reachability(3, me=0, clock=clock)
    rule = rule_of or DropRule(reach, member=1)
    rule.hearing = reach
    start, drops = clock.now, 0

    def tick(now: float) -> None:
        clock.now = now
        probe = start
        while probe <= now:
            if probe + 0.01 <= now:
                reach.heard(2, at=probe)
            if probe + 0.55 <= now:
                reach.heard(1, at=probe)
            probe += 0.2

    sent = start + 1.0
    for _ in range(flushes):
        now, acked = sent, sent + 0.5
        while now < acked:
            now = round(now + 0.05, 3)
            tick(now)
            if rule.give_up(sent, now):
                drops += 1
                rule.dropped(sent, now)
                while not rule.may_resync(now):  # then resynced at once
                    now = round(now + 0.05, 3)
                    tick(now)
                break
        sent = now + 0.01
    return drops


def test_a_slow_but_answering_copy_is_not_dropped_over_and_over() -> None:
    """Dropped once after the short wait; its probes were late, none unanswered, so it was
    slow, not gone: the next drop waits twice as long, longer than the copy takes."""
    assert slow_copy_drops(20) == 1


def test_the_backoff_doubles_up_to_the_timeout_and_calms_down() -> None:
    clock, reach, rule = rule_for()
    waits = []
    for _ in range(5):  # each drop found only slow (no probe unanswered)
        sent = clock.now
        rule.dropped(sent, clock.now + 0.3)
        clock.now += 1.0
        reach.heard(1, at=clock.now - 0.1)
        assert rule.may_resync(clock.now)
        waits.append(rule.wait(clock.now))
    assert waits == [0.6, 1.2, SHIP_TIMEOUT, SHIP_TIMEOUT, SHIP_TIMEOUT]
    clock.now += rule.calm
    assert rule.wait(clock.now) == DROP_AFTER
