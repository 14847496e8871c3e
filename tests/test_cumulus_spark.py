"""The Cumulus runtime hosted by Spark: the DW nodes are the tasks of one barrier stage (local
Spark, the suite's shared session); the same stream gives the simulator's maps; too few task
slots are named before anything runs."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")  # before the project's Spark modules are imported

from test_cumulus_replay import config, dashboard_stream  # noqa: E402
from test_cumulus_runtime import _program, interpreted, random_stream  # noqa: E402

from aggspark.dw_stage import spark_nodes, task_slots  # noqa: E402
from aggview import errors  # noqa: E402
from coordinator.catalog import table_from_create  # noqa: E402
from cumulus.m3.printer import print_program  # noqa: E402
from cumulus.runtime.grpc_host import GrpcRuntime  # noqa: E402
from cumulus.runtime.replay import replay  # noqa: E402


def test_two_dw_nodes_as_a_barrier_stage_give_the_interpreters_maps(spark: Any) -> None:
    program = _program("seed003_q3")
    stream = random_stream(program, random.Random(8), 1000)
    with spark_nodes(spark, print_program(program), 2, switches=2) as addresses:
        assert len(addresses) == 2 and len(set(addresses)) == 2
        runtime = GrpcRuntime(program, addresses, switches=2, epoch_ms=50)
        try:
            runtime.feed(stream)
            runtime.finish()
            want = interpreted(program, stream)
            assert runtime.maps() == want and runtime.snapshot()[1] == want
        finally:
            runtime.close()


def test_replay_on_spark_checks(spark: Any, tmp_path: Path) -> None:
    stream = dashboard_stream(tmp_path / "updates.csv", seed=6, length=400)

    def nodes(text: str, count: int, switches: int, mode: str) -> Any:
        return spark_nodes(spark, text, count, switches=switches, mode=mode)

    options = {"host": "spark", "nodes": 2, "mode": "conservative", "check": True}
    result = replay(config(tmp_path, stream, **options), table_from_create, nodes)
    assert result.differences == []
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["host"] == "spark" and stats["corrective_updates"] == 0


def test_too_few_task_slots_are_named_before_anything_runs(spark: Any) -> None:
    slots = task_slots(spark)
    assert slots >= 2  # local[2] at least
    program = _program("seed002_ex1")
    with pytest.raises(errors.FailedPrecondition, match=f"needs {slots + 1} task slots"):
        with spark_nodes(spark, print_program(program), slots + 1):
            pytest.fail("the stage must not start")
