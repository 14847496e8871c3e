"""Bulk initialization with Spark SQL: every map computed from its definition over tables that
already hold rows equals the map the stream built, and a program started from it goes on like
one that saw every row."""

from __future__ import annotations

import copy
import math
import random
from typing import Any

from aggspark.m3_init import definition_sql, initial_maps, initial_relations
from cumulus.m3.interpreter import Interpreter
from cumulus.m3.program import Program
from tests.test_m3_differential import COLUMNS, TRICKY, programs_for
from tests.test_views_differential import random_row

NAMES = ["t0", "t1", "t2"]
SPARK_SCHEMA = "id BIGINT, k BIGINT, g STRING, v DECIMAL(8,2), x BIGINT, f DOUBLE"


def _close(got: dict[Any, Any], want: dict[Any, Any]) -> bool:
    """Equal, FLOAT values within rounding (Spark adds them in another order)."""
    if got.keys() != want.keys():
        return False
    return all(
        math.isclose(got[k], want[k], rel_tol=1e-9, abs_tol=1e-9)
        if isinstance(want[k], float)
        else got[k] == want[k]
        for k in want
    )


def _same_maps(a: Interpreter, b: Interpreter) -> None:
    for name in a.maps:
        assert _close(a.maps[name].data, b.maps[name].data), name


def test_spark_initialized_maps_equal_streamed_maps_and_go_on_alike(spark: Any) -> None:
    rng = random.Random(3)
    snapshot = {n: [random_row(rng, j) for j in range(12)] for n in NAMES}
    tables = {}
    for name in NAMES:
        values = [tuple(r[c] for c in COLUMNS) for r in snapshot[name]]
        frame = spark.createDataFrame(values, SPARK_SCHEMA)
        frame.createOrReplaceTempView(f"m3_{name}")
        tables[name] = f"m3_{name}"
    cases: list[Program] = []
    for select in (TRICKY[1], TRICKY[3], TRICKY[9]):
        cases.append(programs_for(select, NAMES)[None])
    cases.append(programs_for(TRICKY[9], NAMES)[1])  # reads relations: they are loaded too
    for program in cases:
        rows = copy.deepcopy(snapshot)
        loaded = Interpreter(program)
        loaded.load(initial_maps(spark, program, tables), initial_relations(spark, program, tables))
        streamed = Interpreter(program)
        for name in NAMES:
            if name in streamed.sources:
                for row in rows[name]:
                    streamed.insert(name, row)
        _same_maps(loaded, streamed)
        stores = [*loaded.maps.values(), *loaded.relations.values()]
        assert any(store.data for store in stores)  # the snapshot was not empty
        steps = random.Random(5)
        for _ in range(20):
            name = steps.choice([n for n in NAMES if n in streamed.sources])
            old = steps.choice(rows[name])
            new = {**old, "k": steps.randrange(5), "x": steps.choice([None, 1, 2])}
            for interp in (loaded, streamed):
                interp.update(name, old, new)
            rows[name][rows[name].index(old)] = new
            assert sorted(map(repr, loaded.view("q"))) == sorted(map(repr, streamed.view("q")))
        _same_maps(loaded, streamed)


def test_definition_sql_joins_on_repeated_variables_and_lifts() -> None:
    program = programs_for(TRICKY[1], NAMES)[None]  # MAX(a1.v * 2 + a0.k): a lifted value
    counts = program.map("q_agg1_cnt")
    assert counts.definition is not None
    sql = definition_sql(counts.definition, counts.value_type, program, {n: n for n in NAMES})
    assert "(`a0`.`k` = `a1`.`id`)" in sql  # the join, as an equality of the two columns
    assert "((`a1`.`v` * CAST(2 AS BIGINT)) + `a0`.`k`) AS k1" in sql  # the lifted key
    assert sql.endswith("GROUP BY k0, k1")
