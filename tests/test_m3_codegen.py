"""Statements compiled to Python (``cumulus.m3.codegen``) against the evaluators they replace:
the reference interpreter's closures (``Interpreter(compiled=False)``) and the runtime's walk
over pushed tables (``CompiledStep.walk``). Random views from the views' own generator (NULLs,
CASE/COALESCE/IN/LIKE/OR guards and values, theta joins, every aggregate kind), compiled to M3,
random streams of inserts, deletes and updates; after every update the maps must be equal
exactly: same keys, same values, same Python types, same DECIMAL digits.
"""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from profiles import examples
from test_cumulus_runtime import compiled_cases
from test_m3_differential import TRICKY, programs_for
from test_readlog import matches
from test_views_differential import random_row

from aggview.schema import Column, ColumnType
from cumulus.m3.interpreter import Interpreter
from cumulus.m3.parser import parse_program
from cumulus.m3.program import Guard, MapDecl, MapRef, Program, Source, Statement, Trigger, Value
from cumulus.m3.value_kinds import typing_of
from cumulus.runtime.evaluate import CompiledStep
from cumulus.runtime.placement import Placement, relation_map
from cumulus.runtime.simulator import Network, Simulator, Update

Exact = dict[str, dict[Any, tuple[str, str]]]


def exact(stores: dict[str, Any]) -> Exact:
    """Maps with each value as (type, digits): 1.0 and 1.00 differ, 1 and 1.0 too."""
    return {
        name: {key: (type(v).__name__, str(v)) for key, v in store.data.items()}
        for name, store in stores.items()
    }


def check_runtime_steps(program: Program, interp: Interpreter, update: Update) -> None:
    """Every step of the update's trigger, generated and walked over the slices a read node
    would push (each read's entries matching its pattern at the update's values), gives the
    same result."""
    sign, relation, row = update
    values = interp.check(sign, relation, row)
    placement = Placement(program, 1)
    index = next(
        i for i, t in enumerate(program.triggers) if (t.sign, t.relation) == (sign, relation)
    )
    args = program.triggers[index].args
    typing = typing_of(program, program.triggers[index])
    for step in placement.steps[index]:
        tables = {}
        for read in step.reads:
            name = read.map[1:] if read.map.startswith("@") else read.map
            stores = interp.relations if read.map == relation_map(name) else interp.maps
            pattern = placement.pattern_of(read.keys, args)(values)
            tables[read.factor] = {
                key: value for key, value in stores[name].data.items() if matches(pattern, key)
            }
        compiled = CompiledStep(step, args, typing)  # as a node compiles it
        assert hasattr(compiled.run, "source")  # generated, not the walk
        got, want = compiled.run(values, tables), compiled.walk(values, tables)
        assert {k: (type(v), str(v)) for k, v in got.items()} == {
            k: (type(v), str(v)) for k, v in want.items()
        }, compiled.run.source


# what the generated code takes a kind's values to be (``cumulus.m3.value_kinds``)
ASSUMED = {"INT": int, "DECIMAL": Decimal}


def assert_kinds_hold(program: Program, maps: dict[str, Any]) -> None:
    """Every map's values and keys are what the generated code assumes: the value kind's type
    (INT and DECIMAL, the kinds its arithmetic relies on), each key of its kind or None, and
    never None where the map's definition says so."""
    for trigger in program.triggers:
        typing = typing_of(program, trigger)
        for name, kind, keys in typing.maps:
            for key, value in maps[name].data.items():
                if kind in ASSUMED:
                    assert type(value) is ASSUMED[kind], (name, key, value)
                for (key_kind, never_null), part in zip(keys, key, strict=True):
                    if part is None:
                        assert not never_null, (name, key)
                    elif key_kind in ASSUMED:
                        assert type(part) is ASSUMED[key_kind], (name, key)


def replay_both(program: Program, stream: list[Update], runtime_steps: bool = True) -> None:
    generated = Interpreter(program, keep_relations=True)
    walked = Interpreter(program, keep_relations=True, compiled=False)
    assert all(hasattr(f, "source") for f in generated._triggers.values())
    for update in stream:
        if runtime_steps:
            check_runtime_steps(program, generated, update)
        generated.apply(*update)
        walked.apply(*update)
        assert exact(generated.maps) == exact(walked.maps), update
        assert_kinds_hold(program, walked.maps)
        assert exact(generated.relations) == exact(walked.relations)
        assert generated.counter == walked.counter  # the same entries read


@settings(
    max_examples=examples(25, 100), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(case=compiled_cases())
def test_generated_statements_equal_the_interpreters_evaluation(
    case: tuple[Program, list[Update], int, int, int | None],
) -> None:
    program, stream, _, _, _ = case
    replay_both(program, stream)


@pytest.mark.parametrize("select", TRICKY)
def test_chosen_views_at_every_depth(select: str) -> None:
    """Lifted keys, conditions across tables, division, CASE and COALESCE group keys, LIKE, IN
    with NULL, HAVING: the constructs the inline code and its fallbacks split."""
    for depth, program in programs_for(select, ["t0", "t1", "t2"]).items():
        rng = random.Random(depth or 7)
        names = [s.name for s in program.sources]
        rows: dict[str, dict[int, dict[str, Any]]] = {n: {} for n in names}
        stream: list[Update] = []
        for step in range(60):
            table = rng.choice(names)
            if rows[table] and rng.random() < 0.35:
                stream.append(("-", table, rows[table].pop(rng.choice(sorted(rows[table])))))
            else:
                rows[table][step] = random_row(rng, step)
                stream.append(("+", table, rows[table][step]))
        replay_both(program, stream)


def test_the_simulator_runs_generated_steps_and_equals_the_interpreter() -> None:
    program = programs_for(TRICKY[3], ["t0", "t1", "t2"])[None]
    rng = random.Random(5)
    stream: list[Update] = [("+", rng.choice(["t0", "t1"]), random_row(rng, i)) for i in range(80)]
    simulator = Simulator(program, nodes=3, switches=2, network=Network(seed=3))
    simulator.run(stream)
    for node in simulator.nodes:
        assert all(hasattr(s.run, "source") for steps in node.compiled for s in steps)
    reference = Interpreter(program, compiled=False)
    for update in stream:
        reference.apply(*update)
    got = simulator.maps()
    for name, store in reference.maps.items():
        assert got[name].keys() == store.data.keys()
        for key, value in store.data.items():  # FLOAT sums may differ in their last bits
            assert abs(float(got[name][key]) - float(value)) < 1e-6 * max(1, abs(float(value)))


DEEP = 22  # more nested loops than CPython compiles (20 statically nested blocks)


def test_a_statement_python_cannot_nest_falls_back_to_the_closures() -> None:
    maps = "\n".join(f"DECLARE MAP m{i}(int)[][a{i}:int];" for i in range(DEEP))
    body = " * ".join(f"m{i}[][a{i}]" for i in range(DEEP))
    text = f"""
CREATE STREAM r(a int NOT NULL);
CREATE STREAM s(b int NOT NULL);
{maps}
DECLARE MAP out(int)[][];
ON + r(a) {{
{"".join(f"    m{i}[][a] += 1;" for i in range(DEEP))}
}}
ON + s(b) {{
    out[][] += {body};
}}
"""
    program = parse_program(text)
    generated, walked = Interpreter(program), Interpreter(program, compiled=False)
    assert hasattr(generated._triggers[("+", "r")], "source")
    assert not hasattr(generated._triggers[("+", "s")], "source")  # fell back
    step = Placement(program, 1).steps[1][0]
    compiled = CompiledStep(step, ("b",))
    assert compiled.run == compiled.walk  # the runtime falls back alike
    # one key in each map, counted twice: 22 nested loops of one pass each (two keys made it
    # 2**22 passes, 38 s in CI), the product still 2**22
    for update in [("+", "r", [1]), ("+", "r", [1]), ("+", "s", [0])]:
        generated.apply(*update)
        walked.apply(*update)
    assert exact(generated.maps) == exact(walked.maps)
    assert generated.maps["out"].data == {(): 2**DEEP}


def test_decimal_digits_and_float_types_are_the_interpreters() -> None:
    """A DECIMAL times an INT keeps its scale; a FLOAT column makes the sum a float."""
    text = """
CREATE STREAM r(k int NOT NULL, v decimal(8,2) NOT NULL, f float);
DECLARE MAP s(decimal(38,2))[][k:int];
DECLARE MAP t(float)[][k:int];
ON + r(k, v, f) {
    s[][k] += v * 3;
    t[][k] += {f IS NOT NULL} * f * 2;
}
"""
    program = parse_program(text)
    generated = Interpreter(program)
    generated.apply("+", "r", [1, Decimal("1.50"), None])
    generated.apply("+", "r", [1, Decimal("0.25"), 2.0])
    assert str(generated.maps["s"].data[(1,)]) == "5.25"
    assert generated.maps["t"].data == {(1,): 4.0}


def _var(name: str) -> dict[str, Any]:
    return {"var": name}


def _lit(value: int) -> dict[str, Any]:
    return {"lit": value, "type": "INT"}


X_GT_1 = {"cmp": ">", "args": [_var("x"), _lit(1)]}
Y_EQ_2 = {"cmp": "=", "args": [_var("y"), _lit(2)]}
X_PLUS_Y_LT_3 = {"cmp": "<", "args": [{"op": "+", "args": [_var("x"), _var("y")]}, _lit(3)]}
X_IS_0 = {"not": {"cmp": "<>", "args": [_var("x"), _lit(0)]}}
PREDICATES = [  # three-valued logic where a NULL inside decides the outcome under NOT
    X_GT_1,
    {"not": {"or": [X_GT_1, Y_EQ_2]}},
    {"not": {"and": [X_GT_1, Y_EQ_2]}},
    {"not": {"or": [{"not": X_GT_1}, Y_EQ_2]}},
    {"or": [{"not": X_PLUS_Y_LT_3}, {"and": [Y_EQ_2, {"notnull": _var("x")}]}]},
    {"not": {"in": _var("x"), "values": [_lit(1), {"null": True}]}},
    {"not": {"in": {"neg": _var("y")}, "values": [_lit(-1), _lit(-2)]}},
    {"and": [{"not": {"notnull": _var("y")}}, X_IS_0]},
    {"not": {"between": _var("x"), "low": _var("y"), "high": _lit(2)}},  # a fallback
    # constants on both sides (``JOIN b ON 1 = 1``): written ``1 == 1 is True`` unparenthesized,
    # Python chained the comparisons and the guard was never true (a CI run's theta view)
    {"cmp": "=", "args": [_lit(1), _lit(1)]},
    {"and": [{"cmp": "<", "args": [_lit(1), _lit(2)]}, X_GT_1]},
]


@pytest.mark.parametrize("pred", PREDICATES)
def test_guards_are_three_valued_as_the_evaluators(pred: dict[str, Any]) -> None:
    """Every (x, y) in {NULL, 0..3}^2 through a guard alone and a guarded product: the
    generated code, the closures and the runtime's walk agree on every row."""
    int_type = ColumnType("INT")
    source = Source("r", (Column("x", int_type, True), Column("y", int_type, True)))
    counted = Statement(MapRef("out", ("x",)), (Guard(pred),))
    weighted = Statement(MapRef("sums", ("x",)), (Guard(pred), Value(_var("y")), Value(_lit(2))))
    keyed = (("x", int_type),)
    program = Program(
        (source,),
        (MapDecl("out", int_type, keyed), MapDecl("sums", int_type, keyed)),
        triggers=(Trigger("+", "r", ("x", "y"), (counted, weighted)),),
    )
    values = [None, 0, 1, 2, 3]
    replay_both(program, [("+", "r", [x, y]) for x in values for y in values])
