"""Reading Cumulus views with hybrid consistency: a committed read is exactly the stream's prefix
up to its cut, a tentative one catches up at rest; slices and roll-ups; clear errors."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_cumulus_replay import SCHEMA, dashboard_stream

from aggview import errors
from coordinator.catalog import table_from_create
from cumulus.m3.interpreter import Interpreter
from cumulus.m3.readout import read_view
from cumulus.runtime.reads import read
from cumulus.runtime.replay import compile_views, read_stream
from cumulus.runtime.simulator import Network, Simulator

BY_CATEGORY = (
    "SELECT c.name, p.cat_id, SUM(e.cost) AS cost, COUNT(*) AS n, MAX(e.cost) AS top "
    "FROM events e JOIN products p ON e.prod_id = p.id JOIN categories c ON p.cat_id = c.id "
    "GROUP BY c.name, p.cat_id"
)


def _key(rows: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(sorted(r.items())) for r in rows)


def test_committed_reads_equal_the_prefix_and_tentative_reads_catch_up(tmp_path: Path) -> None:
    program, _ = compile_views(SCHEMA, [("v", BY_CATEGORY)], table_from_create)
    path = dashboard_stream(tmp_path / "s.csv", seed=9, length=700)
    stream = [update for _, update in read_stream(path, program, ",")]
    view = program.views[0]
    reads = []

    def on_commit(cut: int) -> None:
        order = sorted(range(len(simulator.stamped)), key=lambda i: simulator.stamped[i])
        reference = Interpreter(program)
        for i in order:
            if simulator.stamped[i][0] <= cut:
                reference.apply(*stream[i])
        got = read(simulator, "v")
        assert got.ts == cut and got.consistency == "committed"
        assert _key(got.rows) == _key(read_view(reference, view))
        tentative = read(simulator, "v", consistency="tentative")
        assert tentative.ts is None
        reads.append(got)

    simulator = Simulator(
        program, nodes=3, switches=2, network=Network(seed=4), epoch_every=60.0, on_commit=on_commit
    )
    report = simulator.run(stream)
    assert len(reads) > 3 and report.corrective > 0
    final = read(simulator, "v")
    assert _key(final.rows) == _key(read(simulator, "v", consistency="tentative").rows)

    sliced = read(simulator, "v", where={"name": ["cat 1", "cat 2"]})
    assert sliced.rows and {r["name"] for r in sliced.rows} <= {"cat 1", "cat 2"}
    assert _key(sliced.rows) == _key([r for r in final.rows if r["name"] in ("cat 1", "cat 2")])
    rolled = read(simulator, "v", group_by=["name"])
    for row in rolled.rows:
        parts = [r for r in final.rows if r["name"] == row["name"]]
        assert row["n"] == sum(r["n"] for r in parts)
        assert row["cost"] == sum(r["cost"] for r in parts)
        assert row["top"] == max(r["top"] for r in parts)


def test_reads_that_cannot_be_answered_are_named(tmp_path: Path) -> None:
    avg = "SELECT p.cat_id, AVG(p.price) AS mean FROM products p GROUP BY p.cat_id"
    program, _ = compile_views(SCHEMA, [("v", BY_CATEGORY), ("a", avg)], table_from_create)
    simulator = Simulator(program, nodes=2)
    simulator.run([])
    for call, message in (
        (lambda: read(simulator, "nope"), "no Cumulus view 'nope'"),
        (lambda: read(simulator, "v", consistency="fresh"), "consistency is one of"),
        (lambda: read(simulator, "v", where={"cost": 1}), "sliced on its group columns"),
        (lambda: read(simulator, "v", group_by=["day"]), "rolls up to some of its group"),
        (lambda: read(simulator, "a", group_by=[]), "a.mean is AVG"),
    ):
        with pytest.raises(errors.AggviewError, match=message):
            call()
