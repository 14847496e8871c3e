"""The Cumulus runtime on the simulator: at quiescence every map equals the reference
interpreter's over the same stream, for 1-4 DW nodes, 1-3 switches, with and without
reordering; corrections are 0 with one switch (FIFO links) and repair everything when several
switches' messages overtake each other."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profiles import examples
from test_m3_differential import programs_for
from test_views_differential import random_row as view_row
from test_views_differential import view_select, view_specs

from aggview import errors
from cumulus.m3.interpreter import Interpreter
from cumulus.m3.parser import parse_program
from cumulus.m3.program import Program, Source
from cumulus.runtime.messages import Dispatch
from cumulus.runtime.node import ProtocolError
from cumulus.runtime.placement import Placement
from cumulus.runtime.simulator import Network, Report, Simulator, Update
from cumulus.runtime.switch import Switch

FIXTURES = Path(__file__).parent / "m3_fixtures"

# A join with deletes: q[a] = SUM(c) over r(a, b) JOIN s(b, c), higher-order (no relation read).
WITH_DELETES = """
CREATE STREAM r(a int NOT NULL, b int NOT NULL);
CREATE STREAM s(b int NOT NULL, c int NOT NULL);

DECLARE MAP q(int)[][a:int] := AggSum([a], r(a, b) * s(b, c) * c);
DECLARE MAP q_r(int)[][b:int] := AggSum([b], s(b, c) * c);
DECLARE MAP q_s(int)[][b:int, a:int] := AggSum([b, a], r(a, b));

DECLARE QUERY q := q(int)[][a];

ON + r(a, b) {
    q[][a] += q_r[][b];
    q_s[][b, a] += 1;
}
ON - r(a, b) {
    q[][a] += -1 * q_r[][b];
    q_s[][b, a] += -1;
}
ON + s(b, c) {
    q[][a] += c * q_s[][b, a];
    q_r[][b] += c;
}
ON - s(b, c) {
    q[][a] += -1 * c * q_s[][b, a];
    q_r[][b] += -1 * c;
}
"""

PROGRAMS = {
    "seed003_q3": (FIXTURES / "seed003_q3.m3").read_text(),
    "seed002_ex1": (FIXTURES / "seed002_ex1.m3").read_text(),
    "with_deletes": WITH_DELETES,
}


def _program(name: str, replicas: int = 0) -> Program:
    """The named program, its i-th relation replicated (``Source.replicated``) where bit i of
    ``replicas`` is set: where maps live must never change what they hold."""
    return replicated(parse_program(PROGRAMS[name]), replicas)


def replicated(program: Program, replicas: int) -> Program:
    sources = [
        replace(s, replicated=bool(replicas >> i & 1)) for i, s in enumerate(program.sources)
    ]
    return replace(program, sources=tuple(sources))


def copies_agree(simulator: Simulator, cut: int | None = None) -> bool:
    """Every node holds the same entries of each replicated map (newest, or at ``cut``;
    FLOAT sums to their last bits, added in another order)."""
    for name in simulator.placement.replicated:
        if cut is None:
            copies = [node.entries(name) for node in simulator.nodes]
        else:
            copies = [node.snapshot(name, cut) for node in simulator.nodes]
        if not all(close_enough({name: c}, {name: copies[0]}) for c in copies):
            return False
    return True


def random_row(source: Source, rng: random.Random) -> list[Any]:
    row: list[Any] = []
    for column in source.columns:
        kind = column.type.kind
        if kind == "INT":
            row.append(rng.randrange(6))
        elif kind == "DECIMAL":
            scale = column.type.scale or 0
            row.append(Decimal(rng.randrange(1, 500)).scaleb(-scale))
        else:
            row.append(rng.choice(["x", "y"]))
    return row


def random_stream(program: Program, rng: random.Random, length: int) -> list[Update]:
    """Inserts in random order over every relation (children before parents as often as not),
    and, where the program has delete triggers, deletes of rows inserted earlier."""
    live: list[tuple[str, list[Any]]] = []
    stream: list[Update] = []
    deletable = {t.relation for t in program.triggers if t.sign == "-"}
    insertable = [s for s in program.sources if program.trigger("+", s.name)]
    for _ in range(length):
        if live and rng.random() < 0.3 and any(r in deletable for r, _ in live):
            choices = [i for i, (r, _) in enumerate(live) if r in deletable]
            relation, row = live.pop(rng.choice(choices))
            stream.append(("-", relation, row))
        else:
            source = rng.choice(insertable)
            row = random_row(source, rng)
            live.append((source.name, row))
            stream.append(("+", source.name, row))
    return stream


def interpreted(program: Program, stream: list[Update]) -> dict[str, dict[Any, Any]]:
    reference = Interpreter(program)
    for sign, relation, row in stream:
        reference.apply(sign, relation, row)
    return {m.name: dict(reference.maps[m.name].data) for m in program.maps}


@settings(
    max_examples=examples(20, 40), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    name=st.sampled_from(sorted(PROGRAMS)),
    nodes=st.integers(1, 4),
    switches=st.integers(1, 3),
    reorder=st.one_of(st.none(), st.integers(0, 10**6)),
    seed=st.integers(0, 10**6),
    length=st.integers(1, 120),
    replicas=st.integers(0, 7),
)
def test_at_quiescence_every_map_equals_the_interpreter(
    name: str,
    nodes: int,
    switches: int,
    reorder: int | None,
    seed: int,
    length: int,
    replicas: int,
) -> None:
    program = _program(name, replicas)
    stream = random_stream(program, random.Random(seed), length)
    simulator = Simulator(program, nodes=nodes, switches=switches, network=Network(reorder))
    report = simulator.run(stream)
    assert simulator.maps() == interpreted(program, stream)
    assert copies_agree(simulator)
    if switches == 1:
        assert report.corrective == 0  # FIFO from the one switch: every node knows its PUTs


@settings(
    max_examples=examples(20, 40), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    name=st.sampled_from(sorted(PROGRAMS)),
    nodes=st.integers(1, 4),
    switches=st.integers(1, 3),
    reorder=st.one_of(st.none(), st.integers(0, 10**6)),
    mode=st.sampled_from(["speculative", "conservative"]),
    epoch_every=st.sampled_from([3.0, 10.0, 40.0]),
    seed=st.integers(0, 10**6),
    length=st.integers(1, 120),
    batch=st.sampled_from([1, 1, 2, 5, 24]),
    replicas=st.integers(0, 7),
)
def test_every_committed_epoch_equals_the_interpreter_over_its_prefix(
    name: str,
    nodes: int,
    switches: int,
    reorder: int | None,
    mode: str,
    epoch_every: float,
    seed: int,
    length: int,
    batch: int,
    replicas: int,
) -> None:
    """Epochs close while updates and corrections are in flight; each commit's snapshot is the
    stream's prefix up to the cut in timestamp order, exactly. A message for a committed
    timestamp arriving after the commit would raise ProtocolError in the node. With batches
    (a switch's ``batch`` updates per message to a node, a node's replies one message per
    destination) in flight across epoch ends and reordered between links, the same."""
    program = _program(name, replicas)
    stream = random_stream(program, random.Random(seed), length)
    simulator, report, checked = run_checking_epochs(
        program,
        stream,
        nodes=nodes,
        switches=switches,
        network=Network(reorder),
        mode=mode,
        epoch_every=epoch_every,
        batch=batch,
    )
    assert checked and checked == sorted(set(checked))
    assert simulator.snapshot() == (checked[-1], simulator.maps())  # at rest: committed = newest
    assert checked[-1] == max(ts[0] for ts in simulator.stamped)
    assert simulator.log_sizes() == {"write_log_entries": 0, "read_log_entries": 0, "operations": 0}
    if mode == "conservative" or switches == 1:
        assert report.corrective == 0  # reads wait for every earlier write, or FIFO from one


def run_checking_epochs(
    program: Program, stream: list[Update], **options: Any
) -> tuple[Simulator, Report, list[int]]:
    """The stream run on a simulator (``options``), every committed epoch's snapshot checked
    to equal the interpreter over the stream's prefix up to its cut (in timestamp order)."""
    checked: list[int] = []

    def on_commit(cut: int) -> None:
        order = sorted(range(len(simulator.stamped)), key=lambda i: simulator.stamped[i])
        prefix = [stream[i] for i in order if simulator.stamped[i][0] <= cut]
        assert simulator.snapshot(cut) == (cut, interpreted(program, prefix))
        assert copies_agree(simulator, cut)
        checked.append(cut)

    simulator = Simulator(program, on_commit=on_commit, **options)
    return simulator, simulator.run(stream), checked


# a distributed run to draw (``exact_at_every_epoch``): 2-3 switches, links reordering or not
RUNS = {
    "nodes": st.integers(1, 4),
    "switches": st.integers(2, 3),
    "reorder": st.one_of(st.none(), st.integers(0, 10**6)),
    "epoch_every": st.sampled_from([3.0, 10.0]),
}


def exact_at_every_epoch(
    program: Program, stream: list[Update], reorder: int | None, **options: Any
) -> None:
    """The stream's updates of the program's relations on a simulator (``options``, links
    reordering with seed ``reorder``): every committed epoch equals the interpreter over its
    prefix, and so do the final maps."""
    read = {source.name for source in program.sources}
    stream = [u for u in stream if u[1] in read]
    network = Network(reorder)
    simulator, _, checked = run_checking_epochs(program, stream, network=network, **options)
    assert (checked or not stream) and simulator.maps() == interpreted(program, stream)


@settings(
    max_examples=examples(15, 30), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    name=st.sampled_from(sorted(PROGRAMS)),
    nodes=st.integers(1, 4),
    switches=st.integers(1, 3),
    mode=st.sampled_from(["speculative", "conservative"]),
    seed=st.integers(0, 10**6),
    length=st.integers(2, 120),
    split=st.floats(0, 1),
    replicas=st.integers(0, 7),
)
def test_maps_preloaded_from_a_snapshot_then_fed_equal_the_interpreter(
    name: str,
    nodes: int,
    switches: int,
    mode: str,
    seed: int,
    length: int,
    split: float,
    replicas: int,
) -> None:
    """A view over tables that hold rows: the maps over the snapshot are computed outside
    the runtime and preloaded; the updates after it run the protocol on top. Every commit
    equals the interpreter over snapshot + prefix, and a preload after updates is refused."""
    program = _program(name, replicas)
    stream = random_stream(program, random.Random(seed), length)
    cut = int(split * length)
    simulator = Simulator(program, nodes=nodes, switches=switches, mode=mode)
    simulator.preload(interpreted(program, stream[:cut]))
    assert simulator.snapshot() == (0, interpreted(program, stream[:cut]))
    middle = (cut + length) // 2  # fed, not committed: at rest, the newest values hold it
    simulator.feed(stream[cut:middle])
    simulator.deliver()
    assert simulator.maps() == interpreted(program, stream[:middle])
    assert simulator.snapshot() == (0, interpreted(program, stream[:cut]))  # no epoch yet
    simulator.run(stream[middle:])
    assert simulator.snapshot()[1] == interpreted(program, stream) == simulator.maps()
    assert copies_agree(simulator)
    if cut < length:
        with pytest.raises(ProtocolError, match="preload after updates"):
            simulator.preload(interpreted(program, stream[:1]))


def test_conservative_mode_waits_where_speculation_corrects() -> None:
    """The same reordered stream over two switches: speculative corrects, conservative defers
    reads instead and corrects nothing; both end equal to the interpreter."""
    program = _program("seed003_q3")
    stream = random_stream(program, random.Random(3), 300)
    want = interpreted(program, stream)
    runs = {}
    for mode in ("speculative", "conservative"):
        simulator = Simulator(program, nodes=3, switches=2, network=Network(seed=5), mode=mode)
        runs[mode] = simulator.run(stream)
        assert simulator.maps() == want
        runs[mode + "_deferred"] = sum(n.stats.deferred_fetches for n in simulator.nodes)
    assert runs["speculative"].corrective > 0 and runs["conservative"].corrective == 0
    assert runs["conservative_deferred"] > runs["speculative_deferred"]


def test_a_node_with_a_log_limit_asks_for_epochs() -> None:
    program = _program("seed002_ex1")
    stream = random_stream(program, random.Random(1), 200)
    counts = []
    for limit in (None, 20):
        simulator = Simulator(program, nodes=2, log_limit=limit)
        counts.append(len(simulator.run(stream).epochs))
        assert simulator.maps() == interpreted(program, stream)
    assert counts[0] == 1 and counts[1] > 3  # only the last epoch, or many along the way


def test_reordering_across_switches_corrects_and_converges() -> None:
    program = _program("seed003_q3")
    stream = random_stream(program, random.Random(3), 300)
    expected = interpreted(program, stream)
    quiet = Simulator(program, nodes=3, switches=2)
    assert quiet.run(stream).corrective == 0
    assert quiet.maps() == expected
    shuffled = Simulator(program, nodes=3, switches=2, network=Network(seed=5))
    report = shuffled.run(stream)
    assert report.corrective > 0
    assert report.max_depth >= 1
    assert shuffled.maps() == expected


def test_a_held_put_is_overtaken_by_a_later_read_and_corrected() -> None:
    """Switch 0's PUT of m_o[7] (a customer) is held; switch 1's order for that customer reads
    m_o[7] first, as 0, so the order's writes are wrong until the late PUT's corrective."""
    program = _program("seed003_q3")
    stream: list[Update] = [
        ("+", "customer", [7, "c", 1, Decimal("1.00")]),  # switch 0, ts (1, 0)
        ("+", "orders", [7, 70, 2]),  # switch 1, ts (1, 1): reads m_o[7]
        ("+", "lineitem", [70, Decimal("5.50")]),  # switch 0, ts (2, 0)
    ]

    def hold(src: tuple[str, int], dst: tuple[str, int], message: Any) -> float:
        held = isinstance(message, Dispatch) and message.ts == (1, 0) and message.puts
        return 100.0 if src == ("switch", 0) and held else 0.0

    simulator = Simulator(program, nodes=1, switches=2, network=Network(hold=hold))
    report = simulator.run(stream)
    assert report.corrective >= 1
    assert simulator.maps() == interpreted(program, stream)
    assert simulator.maps()["m"] == {(70, 2): Decimal("5.50")}


def test_a_bad_stream_row_is_named_and_changes_nothing() -> None:
    program = _program("with_deletes")
    simulator = Simulator(program, nodes=2)
    simulator.run([("+", "r", [1, 2]), ("+", "s", [2, 3])])
    before = simulator.maps()
    for bad, message in (
        (("+", "nope", [1]), "nope"),
        (("+", "r", [1]), r"r\(1,\)|arity|2 values|columns"),
        (("+", "r", ["x", 2]), "'x'|INT|int"),
    ):
        with pytest.raises(errors.AggviewError, match=message):
            simulator.run([bad])
        assert simulator.maps() == before


# --------------------------------------------------------------------------- seed scenarios

FIGURE_5 = """
CREATE STREAM a(k int NOT NULL);
CREATE STREAM b(k int NOT NULL, j int NOT NULL);
CREATE STREAM c(j int NOT NULL);

DECLARE MAP mr(int)[][k:int] := AggSum([k], a(k));
DECLARE MAP mw(int)[][j:int] := AggSum([j], a(k) * b(k, j));
DECLARE MAP mc(int)[][] := AggSum([], a(k) * b(k, j) * c(j));

ON + a(k) {
    mr[][k] += 1;
}
ON + b(k, j) {
    mw[][j] += mr[][k];
}
ON + c(j) {
    mc[][] += mw[][j];
}
"""  # c's trigger reads mw, so mw is partitioned by its key as in the figure (not partial)


def test_seed_000_figure_5_a_late_put_corrects_every_later_read() -> None:
    """Seed 000 Figure 5: the read node holds mr; PUTs at 2 and 10; FETCHes at 7, 9, 11 are
    answered with mr as of 2, 2 and 10; a late PUT at 6 sends one corrective naming the three
    reads, and the writer's mw ends as if everything had come in order."""
    from cumulus.runtime.messages import Corrective, Push, Settled
    from cumulus.runtime.node import Node
    from cumulus.runtime.placement import Placement
    from cumulus.runtime.switch import Switch

    program = parse_program(FIGURE_5)
    placement = Placement(program, nodes=2)
    reader, writer = Node(placement, 0), Node(placement, 1)
    switch = Switch(placement, 0)
    assert placement.node_of("mr", (0,)) == 0 and placement.node_of("mw", (1,)) == 1

    def deliver(ts: tuple[int, int], trigger: int, args: tuple[int, ...]) -> list[Any]:
        out = []
        for node, message in switch.dispatch(ts, trigger, args):
            target = reader if node == 0 else writer
            out += target.handle(message)
        return out

    assert deliver((2, 0), 0, (0,)) == []
    assert deliver((10, 0), 0, (0,)) == []
    answers = {}
    for ts in ((7, 0), (9, 0), (11, 0)):
        (destination, push), *_ = deliver(ts, 1, (0, 1))
        assert destination == 1 and isinstance(push, Push)
        answers[ts[0]] = dict(push.slices[0].entries)
        assert writer.handle(push) == []
    assert answers == {7: {(0,): 1}, 9: {(0,): 1}, 11: {(0,): 2}}
    assert writer.entries("mw") == {(1,): 4}  # 1 + 1 + 2

    (destination, corrective), *more = deliver((6, 0), 0, (0,))
    assert not more and destination == 1 and isinstance(corrective, Corrective)
    assert corrective.write_ts == (6, 0) and corrective.delta == 1 and corrective.depth == 1
    assert sorted(r.ts for r in corrective.reads) == [(7, 0), (9, 0), (11, 0)]
    assert writer.handle(corrective) == [(0, Settled(1))]  # applied, and caused nothing more
    assert writer.entries("mw") == {(1,): 7}  # 2 + 2 + 3: mr as it should have been read
    assert reader.handle(Settled(1)) == []


# --------------------------------------------------------------------------- compiled views


@st.composite
def compiled_cases(
    draw: st.DrawFn,
    specs: st.SearchStrategy[dict[str, Any]] | None = None,
    select: Callable[[dict[str, Any], list[str]], str] = view_select,
) -> tuple[Program, list[Update], int, int, int | None]:
    """A random view (the views' own generator, or ``specs`` written by ``select``) compiled
    to M3, a random stream of inserts, deletes and updates (a delete and an insert) over its
    tables, and a schedule."""
    spec = draw(specs if specs is not None else view_specs())
    names = [f"t{i}" for i in range(spec["tables"])]
    depth = draw(st.sampled_from([None, 1]))
    program = programs_for(select(spec, names), names)[depth]
    # the compiler replicates the relations joined on their keys; any choice must hold
    program = replicated(program, draw(st.integers(0, 2 ** len(program.sources) - 1)))
    rng = random.Random(spec["seed"])
    names = [s.name for s in program.sources]  # a self-join reads fewer tables than drawn
    rows: dict[str, dict[int, dict[str, Any]]] = {n: {} for n in names}
    stream: list[Update] = []
    for step in range(draw(st.integers(1, 60))):
        table = rng.choice(names)
        if rows[table] and rng.random() < 0.35:
            row_id = rng.choice(sorted(rows[table]))
            stream.append(("-", table, rows[table].pop(row_id)))
            if rng.random() < 0.5:  # an UPDATE: the delete, then the new row
                rows[table][row_id] = {**view_row(rng, row_id), "id": row_id}
                stream.append(("+", table, rows[table][row_id]))
        else:
            rows[table][1000 + step] = view_row(rng, 1000 + step)
            stream.append(("+", table, rows[table][1000 + step]))
    nodes, switches = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    return program, stream, nodes, switches, draw(st.one_of(st.none(), st.integers(0, 10**6)))


def close_enough(got: dict[str, dict[Any, Any]], want: dict[str, dict[Any, Any]]) -> bool:
    """Equal, except that FLOAT sums may differ in their last bits (added in another order)."""
    if got.keys() != want.keys():
        return False
    for name in want:
        a, b = got[name], want[name]
        for key in a.keys() | b.keys():
            x, y = a.get(key, 0), b.get(key, 0)
            if isinstance(x, float) or isinstance(y, float):
                if abs(float(x) - float(y)) > 1e-6 * max(1.0, abs(float(y))):
                    return False
            elif x != y:
                return False
    return True


@settings(
    max_examples=examples(15, 30), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(case=compiled_cases())
def test_compiled_views_run_distributed_equal_the_interpreter(
    case: tuple[Program, list[Update], int, int, int | None],
) -> None:
    program, stream, nodes, switches, reorder = case
    simulator = Simulator(program, nodes=nodes, switches=switches, network=Network(reorder))
    report = simulator.run(stream)
    assert close_enough(simulator.maps(), interpreted(program, stream))
    assert copies_agree(simulator)
    if switches == 1:
        assert report.corrective == 0


EXAMPLE_3_3 = """
CREATE STREAM r(a int NOT NULL);
CREATE STREAM t(a int NOT NULL);
CREATE STREAM s(a int NOT NULL);

DECLARE MAP m2(int)[][a:int] := AggSum([a], r(a));
DECLARE MAP m3(int)[][a:int] := AggSum([a], t(a));
DECLARE MAP m1(int)[][a:int] := AggSum([a], r(a) * t(a) * s(a));

ON + r(a) {
    m2[][a] += 1;
}
ON + t(a) {
    m3[][a] += 1;
}
ON + s(a) {
    m1[][a] += m2[][a] * m3[][a];
}
"""


def test_seed_000_example_3_3_a_corrective_revises_every_later_update() -> None:
    """Seed 000 Example 3.3: m1[A] += m2[A] * m3[A] ran for S(1) at two timestamps; a write to
    m2[1] ordered before both arrives late: one corrective (to the node itself: reader and
    writer are one node here) adds delta * m3[1] at each of the two, as in order."""
    from cumulus.runtime.messages import Corrective
    from cumulus.runtime.node import Node
    from cumulus.runtime.placement import Placement
    from cumulus.runtime.switch import Switch

    program = parse_program(EXAMPLE_3_3)
    placement = Placement(program, nodes=1)
    node, switch = Node(placement, 0), Switch(placement, 0)
    trigger = {t.relation: i for i, t in enumerate(program.triggers)}

    def deliver(ts: tuple[int, int], relation: str) -> list[Any]:
        out, pending = [], [m for _, m in switch.dispatch(ts, trigger[relation], (1,))]
        while pending:
            replies = node.handle(pending.pop(0))
            out += [m for _, m in replies]
            pending += [m for _, m in replies]
        return out

    deliver((1, 0), "t")
    deliver((2, 0), "r")
    deliver((3, 0), "s")
    deliver((4, 0), "s")
    assert node.entries("m1") == {(1,): 2}
    sent = deliver((2, 1), "r")  # ordered after (2, 0), before both S(1): late
    correctives = [m for m in sent if isinstance(m, Corrective)]
    assert len(correctives) == 1 and correctives[0].map == "m2"
    assert sorted(r.ts for r in correctives[0].reads) == [(3, 0), (4, 0)]
    assert node.entries("m1") == {(1,): 4}
    reference = Interpreter(program)
    for relation in ("t", "r", "r", "s", "s"):  # the timestamp order
        reference.apply("+", relation, [1])
    assert node.entries("m1") == dict(reference.maps["m1"].data)


# --------------------------------------------------------------------------- seed 000 Figure 6


def _place_by_map(placement: Any, home: dict[str, int]) -> None:
    """Figure 6's placement, by map rather than by key (both maps' keys are 1)."""
    placement.node_of = lambda name, key: home[name]
    placement.nodes_for = lambda name, pattern: (home[name],)


@pytest.mark.parametrize("violation", ["atomicity", "order"])
def test_seed_000_figure_6_atomicity_and_order_violations_are_corrected_alike(
    violation: str,
) -> None:
    """Seed 000 Example 3.2 / Figure 6: S(1) at TS1 and T(1) at TS2, m1 on one node and m2 on
    the other, both holding 5 and 3 at TS0. (a) the two updates run at once: each node answers
    the other's FETCH with the TS0 value; (b) they run as T(1), S(1): node 2 answers S's FETCH
    with m2 before TS1 from its write log. Either way the node holding m1 (written earlier in the
    total order) sends the one corrective, and the maps end as if run in order."""
    from cumulus.runtime.messages import Corrective, Push, Settled
    from cumulus.runtime.node import Node
    from cumulus.runtime.placement import Placement
    from cumulus.runtime.switch import Switch

    program = parse_program((FIXTURES / "seed000_ex3_2.m3").read_text())
    placement = Placement(program, nodes=2)
    _place_by_map(placement, {"m1": 0, "m2": 1})  # the seed's DW Node 1 and Node 2
    nodes = [Node(placement, 0), Node(placement, 1)]
    nodes[0].maps["m1"].write((1,), 5, (0, 0))
    nodes[1].maps["m2"].write((1,), 3, (0, 0))
    switch = Switch(placement, 0)
    s_update = dict(switch.dispatch((1, 0), 0, (1,)))  # S(1): PUT at node 0, FETCH at node 1
    t_update = dict(switch.dispatch((2, 0), 1, (1,)))  # T(1): PUT at node 1, FETCH at node 0

    def only(replies: list[Any], kind: type) -> Any:
        assert len(replies) == 1 and isinstance(replies[0][1], kind), replies
        return replies[0]

    if violation == "atomicity":
        _, push_t = only(nodes[0].handle(t_update[0]), Push)  # m1 as of TS0, for TS2
        _, push_s = only(nodes[1].handle(s_update[1]), Push)  # m2 as of TS0, for TS1
        assert nodes[0].handle(s_update[0]) == [] and nodes[1].handle(t_update[1]) == []
        destination, corrective = only(nodes[0].handle(push_s), Corrective)  # m1 at TS1: late
        assert nodes[1].handle(push_t) == []
    else:
        assert nodes[1].handle(t_update[1]) == []
        _, push_t = only(nodes[0].handle(t_update[0]), Push)  # m1 as of TS0, for TS2
        assert nodes[1].handle(push_t) == []  # m2 at TS2 = 3 + 5
        _, push_s = only(nodes[1].handle(s_update[1]), Push)  # m2 before TS1: 3, not 8
        assert nodes[0].handle(s_update[0]) == []
        destination, corrective = only(nodes[0].handle(push_s), Corrective)
    assert dict(push_t.slices[0].entries) == {(1,): 5} and dict(push_s.slices[0].entries) == {
        (1,): 3
    }
    assert destination == 1 and corrective.map == "m1" and corrective.write_ts == (1, 0)
    assert corrective.delta == 3 and [r.ts for r in corrective.reads] == [(2, 0)]
    assert nodes[1].handle(corrective) == [(0, Settled(corrective.seq))]
    assert nodes[0].entries("m1") == {(1,): 8}  # 5 + m2 (3)
    assert nodes[1].entries("m2") == {(1,): 11}  # 3 + m1 after S (8)


# --------------------------------------------------------------------------- seed 003 Figure 3

FIGURE_3 = """
CREATE STREAM w(k int, v int);
CREATE STREAM r(k int, j int);
DECLARE MAP m_c(int)[][k:int];
DECLARE MAP out(int)[][j:int];
ON + w(k, v) {
    m_c[][k] += v;
}
ON + r(k, j) {
    out[][j] += m_c[][k];
}
"""


def test_seed_003_figure_3_reads_from_the_write_log_and_revises_later_reads() -> None:
    """Seed 003 Figure 3: m_c[2] holds +2 at <1> and +4 at <6>; a read at <3> gets 2 (not the
    current 6), at <4> and <5> too, at <7> 6. Then a write to m_c[2] ordered at <3> (behind the
    read at <3>, before those at <4>, <5>, <7>) arrives: the read log names the later reads, and
    one revising update goes to their computation node."""
    from cumulus.runtime.messages import Corrective
    from cumulus.runtime.node import Node
    from cumulus.runtime.placement import Placement
    from cumulus.runtime.switch import Switch

    program = parse_program(FIGURE_3)
    placement = Placement(program, nodes=1)
    node, switch = Node(placement, 0), Switch(placement, 0)
    for ts, value in (((1, 0), 2), ((6, 0), 4)):
        for _, message in switch.dispatch(ts, 0, (2, value)):
            assert node.handle(message) == []
    assert node.entries("m_c") == {(2,): 6}
    seen = {}
    for counter in (3, 4, 5, 7):
        for _, message in switch.dispatch((counter, 0), 1, (2, counter)):
            assert node.handle(message) == []  # its push to itself is taken in place
            seen[counter] = node.entries("out")[(counter,)]  # out[j] += m_c[2] as read
    assert seen == {3: 2, 4: 2, 5: 2, 7: 6}
    ((_, write),) = switch.dispatch((3, 1), 0, (2, 10))
    ((_, late),) = node.handle(write)
    assert isinstance(late, Corrective) and late.write_ts == (3, 1) and late.delta == 10
    assert [r.ts for r in late.reads] == [(4, 0), (5, 0), (7, 0)]
    assert node.handle(late)[0][1].seq == late.seq  # applied and settled
    assert node.entries("out") == {(3,): 2, (4,): 12, (5,): 12, (7,): 16}


def test_feeding_after_a_finish_goes_on_at_the_same_pace() -> None:
    """A second feed after finish enters its updates one per gap from where the first ended,
    not all at once (which would make a conservative node queue them all)."""
    program = _program("seed002_ex1")
    stream = random_stream(program, random.Random(2), 60)
    simulator = Simulator(program, nodes=2, network=Network(seed=1), mode="conservative")
    simulator.run(stream[:30])
    ended = simulator.now
    simulator.feed(stream[30:])
    simulator.finish()
    entered = sorted(at for at in simulator._entered.values() if at >= ended)
    assert len(entered) == 30 and entered[-1] - entered[0] >= 29 * simulator.gap
    assert simulator.maps() == interpreted(program, stream)


# m1 is written after a read on another node (m2's home); s's update reads m1 where it is
# written: a read that must wait for the pending write of an earlier update.
PENDING = """
CREATE STREAM r(x int NOT NULL, y int NOT NULL);
CREATE STREAM s(x int NOT NULL);
CREATE STREAM t(y int NOT NULL);

DECLARE MAP m1(int)[][x:int] := AggSum([x], r(x, y) * t(y));
DECLARE MAP m2(int)[][y:int] := AggSum([y], t(y));
DECLARE MAP q(int)[][x:int] := AggSum([x], s(x) * r(x, y) * t(y));

DECLARE QUERY q := q(int)[][x];

ON + t(y) {
    m2[][y] += 1;
}
ON + r(x, y) {
    m1[][x] += m2[][y];
}
ON + s(x) {
    q[][x] += m1[][x];
}
"""


def test_a_local_read_waits_for_an_earlier_write_still_pending_there() -> None:
    """One switch: r's write of m1[x] waits at x's node for a PUSH of m2[y] from y's node,
    held back; s's update, all of it at x's node, arrives meanwhile. Its read of m1[x] must
    wait for that write (with one switch no read is logged: going ahead would read 0 and meet
    a late write)."""
    program = parse_program(PENDING)
    placement = Placement(program, 2)
    x = next(v for v in range(100) if placement.node_of("m1", (v,)) == 0)
    y = next(v for v in range(100) if placement.node_of("m2", (v,)) == 1)
    stream: list[Update] = [("+", "t", [y]), ("+", "r", [x, y]), ("+", "s", [x])]

    def hold(src: tuple[str, int], dst: tuple[str, int], message: Any) -> float:
        return 100.0 if (src, dst) == (("node", 1), ("node", 0)) else 0.0

    simulator = Simulator(program, nodes=2, network=Network(hold=hold))
    simulator.run(stream)
    assert simulator.maps()["q"] == {(x,): 1} == interpreted(program, stream)["q"]
    assert sum(n.stats.deferred_fetches for n in simulator.nodes) >= 1


def _shape(name: str) -> tuple[Program, list[Update]]:
    """A benchmark's program and a stream for it: TPC-H Q3-like (customers, orders and items,
    then customers deleted and inserted again, reading the orders' maps) or the dashboard's
    star join (products, categories, events)."""
    if name == "star":
        from bench.cumulus import build_stream, compile_view

        return compile_view(), build_stream(1500, 3).updates
    from bench.cumulus_shapes import SHAPES, program_of

    tables, sql, make = SHAPES["q3"]
    again = [[c, f"c{c}", c % 25] for c in range(0, 1000, 25)]
    stream = make(1400, random.Random(3))
    stream += [("-", "customer", row) for row in again] + [("+", "customer", r) for r in again]
    return program_of(tables, sql), stream


@pytest.mark.parametrize("shape", ["q3", "star"])
def test_on_two_nodes_a_facts_update_runs_at_one_node_and_nothing_is_pushed(shape: str) -> None:
    """Where maps live (``Placement``) on the benchmarks' shapes: the view's maps are read by
    no statement, so each node keeps its part of them and their statements run where their
    reads are; a map only dimensions write is partitioned where every statement reading it
    runs at its key's node anyway (Q3's order maps, the star join's product maps), and one
    written at an open key and read only by a dimension is partial (the star join's maps by
    category). So a fact's update (an item, an event) and a product's go to one node, and no
    update waits for a slice from another node; the parts add up to the interpreter's maps,
    at quiescence and at a committed cut."""
    program, stream = _shape(shape)
    placement = Placement(program, nodes=2)
    switch = Switch(placement, 0)
    spread = {
        (relation, len(switch.update(sign, relation, row)[1])) for sign, relation, row in stream
    }
    assert {
        n for relation, n in spread if relation in ("lineitem", "orders", "events", "products")
    } == {1}
    simulator = Simulator(program, nodes=2, network=Network(None), epoch_every=50.0)
    report = simulator.run(stream)
    assert report.messages["Push"] == 0
    expected = interpreted(program, stream)
    assert simulator.maps() == expected
    assert simulator.snapshot()[1] == expected
    view_map = program.maps[0].name
    assert view_map in placement.partial
    assert all(node.entries(view_map) for node in simulator.nodes)  # the work is spread


PARTS_READ = """
CREATE STREAM f(k int NOT NULL, j int NOT NULL);
CREATE TABLE d(k int NOT NULL, g int NOT NULL);

DECLARE MAP mb(int)[][j:int, k:int] := AggSum([j, k], d(j, k));
DECLARE MAP ma(int)[][k:int] := AggSum([k], f(x, j) * d(j, k));
DECLARE MAP mc(int)[][k:int] := AggSum([k], f(x, j) * d(j, k) * j);
DECLARE MAP out(int)[][g:int] := AggSum([g], d(k, g));

ON + f(k, j) {
    ma[][k2] += mb[][j, k2];
    mc[][k2] += j * mb[][j, k2];
}
ON + d(k, g) {
    mb[][k, g] += 1;
    out[][g] += ma[][k] * mc[][k];
}
"""


@pytest.mark.parametrize("nodes, switches, seed", [(2, 1, None), (3, 2, 7), (2, 2, 11)])
def test_a_statement_reading_two_partial_maps_adds_up_their_parts(
    nodes: int, switches: int, seed: int | None
) -> None:
    """``ma`` and ``mc`` are written at an open first key and read only by the dimension's
    trigger, so they are partial; ``out`` (read by nothing, so not replicated) reads both,
    not linearly in either, so its writer gets every node's part of each by PUSH and adds
    them up. Checked against the interpreter, with updates reordered across
    switches."""
    program = parse_program(PARTS_READ)
    placement = Placement(program, nodes=nodes)
    assert placement.partial == {"ma", "mc"} and not placement.replicated
    rng = random.Random(5)
    stream: list[Update] = []
    for _ in range(300):
        if rng.random() < 0.7:
            stream.append(("+", "f", [rng.randrange(50), rng.randrange(6)]))
        else:
            stream.append(("+", "d", [rng.randrange(6), rng.randrange(4)]))
    simulator = Simulator(program, nodes=nodes, switches=switches, network=Network(seed))
    report = simulator.run(stream)
    assert report.messages["Push"] > 0
    assert simulator.maps() == interpreted(program, stream)


FLOAT_SUMS = """
CREATE STREAM f(a int NOT NULL, k int NOT NULL, x float NOT NULL);
CREATE TABLE d(k int NOT NULL);
DECLARE MAP v(float)[][];
DECLARE MAP m(int)[][a:int, k:int];
DECLARE MAP p(float)[][k:int];
DECLARE MAP out(int)[][k:int];
ON + f(a, k, x) {
    v[][] += x;
    m[][a, k] += 1;
    p[][k2] += x * m[][a, k2];
}
ON + d(k) {
    out[][k] += (s ^= p[][k]) * {s = 0};
}
"""


def test_float_sums_are_not_kept_in_parts() -> None:
    """A FLOAT map added up from nodes' parts would round in another order than the updates'
    (1e16 + 1 - 1e16 is 0 in order, 1 in parts; a guard on it flips), so FLOAT maps stay where
    their keys are and the runtime equals the interpreter exactly, not just closely (found
    by a review of the partial maps)."""
    program = parse_program(FLOAT_SUMS)
    placement = Placement(program, nodes=2)
    assert {"v", "p"}.isdisjoint(placement.partial)
    stream: list[Update] = [
        ("+", "f", [0, 5, 0.0]),
        ("+", "f", [1, 5, 0.0]),
        ("+", "f", [0, 9, 1e16]),
        ("+", "f", [1, 9, 1.0]),
        ("+", "f", [0, 9, -1e16]),
        ("+", "d", [5]),
        ("+", "d", [9]),
    ]
    simulator = Simulator(program, nodes=2, network=Network(None))
    simulator.run(stream)
    assert simulator.maps() == interpreted(program, stream)
