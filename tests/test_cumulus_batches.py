"""Batches (issue #42 item 2): a switch's messages to a node, and a node's to another, go as one
``Batch`` that the node takes in order in one call. A batch's updates give the maps that one
message each gives; batches of several switches overtaking each other still make corrective
updates and end exact. Epochs over batches in flight: the prefix tests of
``test_cumulus_runtime`` (one stamp per switch) and ``test_member_switches`` (members' stamps),
with ``batch``."""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from profiles import examples
from test_cumulus_runtime import PROGRAMS, _program, interpreted, random_stream

from cumulus.runtime.messages import Batch, Dispatch
from cumulus.runtime.node import Node
from cumulus.runtime.placement import Placement
from cumulus.runtime.simulator import Network, Simulator, Update
from cumulus.runtime.switch import Switch


def _one_node_maps(name: str, stream: list[Update], sizes: list[int], mode: str) -> Any:
    """One node fed a switch's Dispatches in batches of the given sizes (1: one by one)."""
    program = _program(name)
    placement = Placement(program, 1)
    switch, node = Switch(placement, 0), Node(placement, 0, mode=mode, ordered=True)
    messages = [m for update in stream for _, m in switch.update(*update)[1]]
    at = 0
    for size in sizes:
        if at >= len(messages):
            break
        part, at = messages[at : at + size], at + size
        assert node.handle(part[0] if len(part) == 1 else Batch(tuple(part))) == []
    while at < len(messages):
        assert node.handle(messages[at]) == []
        at += 1
    return {m.name: node.entries(m.name) for m in program.maps}


@settings(
    max_examples=examples(20, 40), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    name=st.sampled_from(sorted(PROGRAMS)),
    mode=st.sampled_from(["speculative", "conservative"]),
    seed=st.integers(0, 10**6),
    length=st.integers(1, 80),
    sizes=st.lists(st.integers(1, 20), max_size=20),
)
def test_a_batch_on_a_node_gives_the_maps_of_its_messages_one_by_one(
    name: str, mode: str, seed: int, length: int, sizes: list[int]
) -> None:
    stream = random_stream(_program(name), random.Random(seed), length)
    one_by_one = _one_node_maps(name, stream, [], mode)
    assert _one_node_maps(name, stream, sizes, mode) == one_by_one
    assert one_by_one == interpreted(_program(name), stream)


def test_batches_of_two_switches_overtaking_each_other_are_corrected() -> None:
    """Reordering between the switches' batches: late writes, correctives, exact maps."""
    program = _program("seed003_q3")
    stream = random_stream(program, random.Random(3), 300)
    expected = interpreted(program, stream)
    for batch in (4, 16):
        simulator = Simulator(program, nodes=3, switches=2, network=Network(seed=5), batch=batch)
        report = simulator.run(stream)
        assert report.corrective > 0
        assert simulator.maps() == expected
        assert report.messages["Batch"] > 0


def test_a_held_batch_is_overtaken_by_another_switchs_and_corrected() -> None:
    """Switch 0's batch holding the PUT of m_o[7] is held; switch 1's batch with an order for
    that customer reads m_o[7] first, as 0, and the late write's corrective repairs it."""
    program = _program("seed003_q3")
    stream: list[Update] = [
        ("+", "customer", [7, "c", 1, Decimal("1.00")]),  # switch 0, ts (1, 0)
        ("+", "orders", [7, 70, 2]),  # switch 1, ts (1, 1): reads m_o[7]
        ("+", "lineitem", [70, Decimal("5.50")]),  # switch 0, ts (2, 0)
        ("+", "orders", [7, 71, 3]),  # switch 1, ts (2, 1)
    ]

    def holds_customer(message: Any) -> bool:
        inner = message.messages if isinstance(message, Batch) else (message,)
        return any(isinstance(m, Dispatch) and m.ts == (1, 0) and m.puts for m in inner)

    def hold(src: tuple[str, int], dst: tuple[str, int], message: Any) -> float:
        return 100.0 if src == ("switch", 0) and holds_customer(message) else 0.0

    simulator = Simulator(program, nodes=1, switches=2, network=Network(hold=hold), batch=2)
    report = simulator.run(stream)
    assert report.messages["Batch"] >= 2
    assert report.corrective >= 1
    assert simulator.maps() == interpreted(program, stream)
