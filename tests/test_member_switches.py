"""Switches of their own (issue #42): each coordinating member stamps its commits' updates with
their commit timestamps and dispatches them through its own switch, in its own time; epochs cut
at a timestamp the caller picks, each switch closing it once its member has dispatched all it
committed up to it. Driven here as state machines on the simulator (no servers): every
committed epoch equals the reference interpreter over the updates up to its cut, in timestamp
order, whatever order the members' dispatches arrive in; at rest the newest values equal
everything fed; a member's dispatch held back makes corrective updates; a member that closes
the epoch before its last dispatch is caught."""

from __future__ import annotations

import concurrent.futures
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profiles import examples
from test_cumulus_runtime import PROGRAMS, _program, interpreted, random_stream
from test_m3_differential import schemas_for

from aggview import errors
from aggview.wire import ltm_pb2 as lpb
from coordinator.cumulus_view import CumulusView
from coordinator.member_switch import CHUNK, MemberSwitch, cut_of, stamp
from cumulus.compiler import compile_sql
from cumulus.m3.program import Program
from cumulus.runtime.node import ProtocolError
from cumulus.runtime.simulator import Network, Simulator, Update


def run_members(
    program: Program,
    stream: list[Update],
    *,
    members: int,
    nodes: int,
    mode: str,
    seed: int,
    network: Network | None = None,
    slow: int | None = None,
    early_end: bool = False,
    batch: int = 1,
) -> tuple[Simulator, list[int]]:
    """Update i commits at timestamp i + 1 at a random member; each member dispatches its
    commits in timestamp order when it gets to them (``slow``: that member far behind the
    others); epochs open at the newest commit now and then, and at the end. Checks every
    committed epoch against the interpreter; returns the runtime and the cuts checked.
    ``early_end``: member 0 closes each epoch as soon as it opens (the mutation: EPOCH END
    before its last dispatch at or below the cut). ``batch``: a member dispatches up to that
    many of its commits at once, each node's share as one message."""
    rng = random.Random(seed)
    sim = Simulator(
        program,
        nodes=nodes,
        switches=members,
        mode=mode,
        stamped=True,
        network=network,
        batch=batch,
    )
    queues: list[list[tuple[int, Update]]] = [[] for _ in range(members)]
    counters: list[int] = []
    checked: list[int] = []
    open_cut: int | None = None
    closed: set[int] = set()

    def check(cut: int) -> None:
        prefix = [u for c, u in zip(counters, stream[: len(counters)], strict=True) if c <= cut]
        assert sim.snapshot(cut) == (cut, interpreted(program, prefix)), f"epoch {cut}"
        checked.append(cut)

    def try_close() -> None:
        nonlocal open_cut
        if open_cut is None:
            return
        for member, queue in enumerate(queues):
            if member not in closed and (not queue or queue[0][0] > open_cut):
                closed.add(member)
                sim.close_switch(member, open_cut)
        if len(closed) == members:
            sim.deliver()
            assert sim.epochs.committed == open_cut
            check(open_cut)
            open_cut = None

    def dispatch(member: int) -> None:
        take = 1 if batch == 1 else rng.randint(1, batch)
        sim.feed_stamped(member, queues[member][:take])
        del queues[member][:take]

    pending = list(enumerate(stream))
    # ends with an epoch holding everything (conservative FETCHes wait for every switch to go
    # past them: the last ones, for the last epoch's END)
    while pending or any(queues) or open_cut is not None or sim.epochs.committed < len(counters):
        roll = rng.random()
        if pending and roll < 0.4:
            i, update = pending.pop(0)
            member = rng.randrange(members)
            counters.append(i + 1)
            queues[member].append((i + 1, update))
        elif open_cut is None and counters and roll < 0.5 and counters[-1] > sim.epochs.committed:
            open_cut, closed = counters[-1], set()
            sim.open_at(open_cut)
            if early_end:
                closed.add(0)
                sim.close_switch(0, open_cut)
        else:
            ready = [m for m, q in enumerate(queues) if q]
            if slow is not None and len(ready) > 1 and slow in ready and rng.random() < 0.9:
                ready.remove(slow)
            if ready:
                dispatch(rng.choice(ready))
        try_close()
    sim.deliver()
    assert sim.maps() == interpreted(program, stream)  # at rest, the newest values: all of it
    return sim, checked


@settings(
    max_examples=examples(10, 40), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    name=st.sampled_from(sorted(PROGRAMS)),
    members=st.integers(2, 3),
    nodes=st.integers(1, 3),
    mode=st.sampled_from(["speculative", "conservative"]),
    reorder=st.one_of(st.none(), st.integers(0, 10**6)),
    seed=st.integers(0, 10**6),
    length=st.integers(1, 60),
    batch=st.sampled_from([1, 1, 3, 8]),
)
def test_every_epoch_of_member_switches_equals_the_interpreter_at_its_cut(
    name: str,
    members: int,
    nodes: int,
    mode: str,
    reorder: int | None,
    seed: int,
    length: int,
    batch: int,
) -> None:
    """Each member's commits in batches too (``batch``): every epoch still exact."""
    program = _program(name)
    stream = random_stream(program, random.Random(seed), length)
    sim, checked = run_members(
        program,
        stream,
        members=members,
        nodes=nodes,
        mode=mode,
        seed=seed,
        network=Network(reorder),
        batch=batch,
    )
    if mode == "conservative":
        assert sum(n.stats.corrective_sent for n in sim.nodes) == 0


def test_a_member_held_back_makes_corrective_updates_and_stays_exact() -> None:
    """Member 1 dispatches far behind member 0: its updates reach the nodes after reads at
    later timestamps were served, and are corrected; every epoch is still exact."""
    program = _program("with_deletes")
    stream = random_stream(program, random.Random(7), 200)
    sim, checked = run_members(
        program, stream, members=2, nodes=2, mode="speculative", seed=7, slow=1
    )
    assert sum(n.stats.corrective_sent for n in sim.nodes) > 0
    assert len(checked) > 3


def test_conservative_member_switches_wait_instead() -> None:
    program = _program("with_deletes")
    stream = random_stream(program, random.Random(7), 200)
    sim, checked = run_members(
        program, stream, members=2, nodes=2, mode="conservative", seed=7, slow=1
    )
    assert sum(n.stats.corrective_sent for n in sim.nodes) == 0
    assert sum(n.stats.deferred_fetches for n in sim.nodes) > 0
    assert len(checked) > 3


@pytest.mark.parametrize("mode", ["speculative", "conservative"])
def test_an_epoch_end_before_the_members_last_dispatch_is_caught(mode: str) -> None:
    """The mutation of the epoch cut: member 0 says EPOCH END before dispatching all it
    committed up to the cut. Its switch refuses the late update (the nodes would have
    committed an epoch missing it)."""
    program = _program("with_deletes")
    stream = random_stream(program, random.Random(3), 200)
    with pytest.raises((errors.FailedPrecondition, ProtocolError, AssertionError)):
        run_members(program, stream, members=2, nodes=2, mode=mode, seed=3, slow=0, early_end=True)


def test_a_switch_refuses_a_counter_at_or_below_its_last() -> None:
    program = _program("with_deletes")
    sim = Simulator(program, nodes=2, switches=2, stamped=True)
    row: Any = [1, 2]
    sim.feed_stamped(0, [(5, ("+", "r", row))])
    with pytest.raises(errors.FailedPrecondition):
        sim.feed_stamped(0, [(5, ("+", "r", row))])
    sim.feed_stamped(1, [(3, ("+", "r", row))])  # another switch: its own order


def test_a_members_switch_releases_in_its_timestamp_order_and_ends_after_its_dispatches() -> None:
    """The member side (``MemberSwitch``): a commit waits only for this member's older
    undecided timestamps; an EPOCH END for T goes after every dispatch at or below T; a big
    transaction goes in parts; batches stay until acknowledged."""
    switch = MemberSwitch(1)
    image = lpb.RowImage(table="t", key=b"k", after=b"{}")
    switch.committed(12, [image])
    switch.committed(10, [image])
    assert switch.release(oldest=11) == [
        lpb.SwitchRequest(member=1, seq=1, commits=[lpb.SwitchCommit(ts=10, changes=[image])])
    ]
    assert switch.ask(12, oldest=11) == []  # 12 is held behind 11, still undecided
    out = switch.release(oldest=None)
    assert [r.seq for r in out] == [2, 0] and out[1].epoch_end == 12
    assert [c.ts for c in out[0].commits] == [12]
    switch.committed(20, [image] * (CHUNK + 1))
    parts = switch.release(oldest=None)
    assert [(len(r.commits[0].changes), r.commits[0].more) for r in parts] == [
        (CHUNK, True),
        (1, False),
    ]
    switch.acked(3)
    assert sorted(switch.unacked) == [4]
    assert cut_of(12) >= stamp(12, 5) > cut_of(11)


def test_a_commit_of_unknown_outcome_closes_no_epoch_until_the_runtimes_reload() -> None:
    """A transaction whose decision's write failed may have committed and is not sent: an
    EPOCH END past it would close an epoch without it (a view that drifts), so none goes
    until the runtimes load again from a snapshot, which has it if it committed."""
    switch = MemberSwitch(0)
    image = lpb.RowImage(table="t", key=b"k", after=b"{}")
    switch.committed(5, [image])
    assert [r.epoch_end for r in switch.ask(4, oldest=7)] == [0, 4]  # 5's batch, then END
    switch.committed(8, [image])
    switch.outcome_unknown(7)
    assert [(r.seq, r.epoch_end) for r in switch.release(oldest=None)] == [(2, 0)]  # no END
    assert switch.ask(9, oldest=None) == []
    switch.reloaded()
    assert switch.ask(9, oldest=None) == [lpb.SwitchRequest(member=0, epoch_end=9)]


def test_a_leading_member_reloads_its_runtimes_when_a_commit_s_outcome_is_unknown() -> None:
    """The leader's own switch asks for the reload in process; a follower's begins a fresh
    stream (the leader reloads for a member it saw before)."""
    from coordinator.member_switch import SwitchLink

    reloads: list[str] = []
    link = SwitchLink(0, lambda: None, lambda: None, _deliver_nothing, None, reload=reloads.append)
    link.outcome_unknown(7)
    assert reloads == ["the outcome of 7 is unknown"]
    assert link.switch.broken is None and not link.switch.fresh
    follower = SwitchLink(1, lambda: None, lambda: "10.0.0.1:1", _deliver_nothing, None)
    follower.switch.fresh = False
    follower.outcome_unknown(7)
    assert follower.switch.broken == 7 and follower.switch.fresh


async def _deliver_nothing(member: int, request: lpb.SwitchRequest) -> None:
    pass


def test_an_epoch_given_up_by_its_waiter_leaves_the_runtime_working() -> None:
    """A refresher cancelled mid-epoch (an ALTER or DROP stops it) cancels the epoch's future;
    the worker that settles it later must live on: every later epoch, and the view's drop,
    wait for that worker (it died of InvalidStateError, and a DROP hung)."""
    schemas = schemas_for(["a"])
    plan = compile_sql(
        "CREATE MATERIALIZED VIEW v WITH (refresh = 'cumulus') AS "
        "SELECT g, SUM(x) AS s FROM a GROUP BY g",
        schemas.__getitem__,
    )
    view = CumulusView(plan, schemas, members=2)
    row = {"id": 1, "k": 1, "g": "x", "v": 100, "x": 2, "f": 0.5}
    view.load({"a": []}, 10)
    try:
        view.post(0, [(11, [("a", None, row)])])
        given_up = view.open_epoch(20)
        given_up.cancel()  # before the members end it: its waiter went away
        view.end(0, 20)
        view.end(1, 20)
        view.post(1, [(21, [("a", None, {**row, "id": 2, "x": 3})])])
        nxt = view.open_epoch(30)
        view.end(0, 30)
        view.end(1, 30)
        assert nxt.result(timeout=10) == 30
        assert view.query([], None) == ([{"g": "x", "s": 5}], 30)
    except concurrent.futures.TimeoutError:
        raise AssertionError(f"the worker is gone: alive={view._worker.is_alive()}") from None
    finally:
        view.close()
