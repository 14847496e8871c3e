"""A statement evaluated at its writer over the slices its read nodes pushed.

The same product the reference interpreter computes (same factor order, same guards, lifts and
exact arithmetic from ``cumulus.m3``), except that each map factor reads the table of entries
received for it rather than a whole map: the collation of seed 001 ("a set of tables, one for
each map reference ... the natural join"), with loop variables bound by the table's keys.

Each step is compiled once into straight-line Python (``cumulus.m3.codegen``, with
``TableAccess`` reading the received tables): ``CompiledStep.run``. ``walk`` is the same product
by a walk over the factors, kept for a step Python cannot compile (nested past its limits) and
as the oracle the generated code is tested against.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from cumulus.expressions import add, mul
from cumulus.m3.codegen import (
    INDENT,
    Gen,
    accumulate,
    finish,
    tuple_code,
    unpack,
    write_product,
)
from cumulus.m3.exprs import Env, compile_guard, compile_value, extreme_of
from cumulus.m3.order import plan_order, produced
from cumulus.m3.program import Factor, Guard, Lift, MapExtreme, MapLift, MapRef, Rel, Value
from cumulus.m3.value_kinds import Typing
from cumulus.runtime.messages import Key
from cumulus.runtime.placement import Step

Tables = dict[int, dict[Key, Any]]  # factor position -> the entries received for it


class TableAccess:
    """Reads the tables a writer was pushed: a point is ``dict.get``; a slice scans its table
    once (checking the bound positions), or, inside a loop, an index on the bound positions
    built at its first use in the run.

    A pushed table holds only the slice read for the factor's pattern: its entries' keys equal
    the trigger's arguments wherever the factor's key is one (a corrective revises only keys
    of that pattern). Those positions are not checked again, so a slice bound by arguments
    alone is one pass over its table even inside a loop, with no index."""

    def __init__(self, body: Sequence[Factor], args: Sequence[str]) -> None:
        self._given: dict[int, frozenset[int]] = {}  # per factor, its positions set by args
        for position, factor in enumerate(body):
            if isinstance(factor, MapRef | Rel):
                keys = factor.keys if isinstance(factor, MapRef) else factor.args
                self._given[position] = frozenset(i for i, k in enumerate(keys) if k in args)

    def prologue(self, gen: Gen, position: int, factor: MapRef | Rel) -> None:
        gen.line(f"_tab{position} = _tables.get({position}, _EMPTY)")
        gen.line(f"_tix{position} = None")

    def point(self, gen: Gen, position: int, key: str, value: str) -> None:
        gen.line(f"{value} = _tab{position}.get({key})")

    def scan(
        self, gen: Gen, position: int, bound: tuple[int, ...], values: list[str]
    ) -> tuple[str, str]:
        given = self._given.get(position, frozenset())
        if given:
            kept = [(i, v) for i, v in zip(bound, values, strict=True) if i not in given]
            bound, values = tuple(i for i, _ in kept), [v for _, v in kept]
        full, value = gen.temp("k"), gen.temp("x")
        if not bound or not gen.in_loop:  # one pass needs no index
            gen.line(f"for {full}, {value} in _tab{position}.items():")
            for i, local in zip(bound, values, strict=True):
                gen.line(f"{INDENT}if {full}[{i}] != {local}:")
                gen.line(f"{INDENT * 2}continue")
            return full, value
        gen.line(f"if _tix{position} is None:")
        gen.line(f"{INDENT}_tix{position} = _index(_tab{position}, {bound!r})")
        gen.line(f"for {full}, {value} in _tix{position}.get({tuple_code(values)}, ()):")
        return full, value


@functools.lru_cache(maxsize=1024)
def generate(
    step: Step, args: tuple[str, ...], typing: Typing | None = None
) -> Callable[[Key, Tables], dict[Key, Any]]:
    """``run(args, tables)``: the step as generated Python, compiled once per (step, args,
    typing); with the trigger's ``typing``, INT arithmetic inline and no NULL tests of values
    never NULL."""
    gen = Gen(namespace={"_EMPTY": {}, "_index": _index}, counting=False, typing=typing)
    unpack(gen, args, "_args")
    gen.line("_out = {}")

    def emit(gen: Gen, acc: str) -> None:
        accumulate(gen, "_out", gen.key(step.target_keys), acc)

    where = f"statement {step.number} of {step.target}"
    write_product(gen, step.body, args, TableAccess(step.body, args), emit, where)
    gen.line("return {k: v for k, v in _out.items() if v != 0}")
    return finish(gen, "def run(_args, _tables):", "run")


class CompiledStep:
    """A step's product, planned and compiled once: ``run(args, tables)`` -> {target key: value}
    (generated code; ``walk`` where Python cannot compile it)."""

    def __init__(self, step: Step, args: tuple[str, ...], typing: Typing | None = None) -> None:
        self.step = step
        self.args = args
        # one writer: the target's first key is an argument, so the switch sent the PUT only
        # to the node holding it
        self.single_writer = not step.target_keys or step.target_keys[0] in args
        try:
            self.run = generate(step, args, typing)
        except (SyntaxError, RecursionError):
            self.run = self.walk
        order = plan_order(step.body, set(args), f"statement {step.number} of {step.target}")
        positions = [next(i for i, f in enumerate(step.body) if f is factor) for factor in order]
        seen = set(args)
        self._plan: list[tuple[int, Any, frozenset[str]]] = []
        for position in positions:
            factor = step.body[position]
            compiled: Any = None
            if isinstance(factor, Guard):
                compiled = compile_guard(factor.pred)
            elif isinstance(factor, Value | Lift):
                compiled = compile_value(factor.expr)
            self._plan.append((position, compiled, frozenset(seen)))
            seen |= produced(factor)
        self._target_keys = step.target_keys

    def walk(self, args: Key, tables: Tables) -> dict[Key, Any]:
        """The product by a walk over the planned factors (the pre-generation evaluator)."""
        env = dict(zip(self.args, args, strict=True))
        out: dict[Key, Any] = {}
        body, plan, target_keys = self.step.body, self._plan, self._target_keys

        def go(i: int, env: Env, acc: Any) -> None:
            if i == len(plan):
                key = tuple(env[k] for k in target_keys)
                old = out.get(key)
                out[key] = acc if old is None else add(old, acc)
                return
            position, compiled, before = plan[i]
            factor = body[position]
            if isinstance(factor, Guard):
                if compiled(env):
                    go(i + 1, env, acc)
            elif isinstance(factor, Value):
                value = compiled(env)
                if value is not None and value != 0:
                    go(i + 1, env, mul(acc, value))
            elif isinstance(factor, Lift):
                value = compiled(env)  # NULL binds: a group key may be NULL
                if factor.var in before:
                    if value == env[factor.var]:
                        go(i + 1, env, acc)
                else:
                    go(i + 1, {**env, factor.var: value}, acc)
            elif isinstance(factor, MapExtreme):  # a nested MIN or MAX over its slice
                prefix = tuple(env[k] for k in factor.keys[:-1])
                entries = [(k, v) for k, v in tables.get(position, {}).items() if k[:-1] == prefix]
                adjust = factor.adjust
                adjusted = None
                if adjust is not None:
                    adjusted = (compile_value(adjust[0])(env), compile_value(adjust[1])(env))
                value = extreme_of(entries, factor.extreme, adjusted)
                if factor.var in before:
                    if value == env[factor.var]:
                        go(i + 1, env, acc)
                else:
                    go(i + 1, {**env, factor.var: value}, acc)
            elif isinstance(factor, MapLift):  # a nested aggregate's value: 0 without an entry
                value = tables.get(position, {}).get(tuple(env[k] for k in factor.keys), 0)
                if factor.var in before:
                    if value == env[factor.var]:
                        go(i + 1, env, acc)
                else:
                    go(i + 1, {**env, factor.var: value}, acc)
            else:  # a map, or a relation read through its relation map
                keys = factor.keys if isinstance(factor, MapRef) else factor.args
                table = tables.get(position, {})
                if all(k in before for k in keys):  # a point lookup
                    value = table.get(tuple(env[k] for k in keys))
                    if value is not None:
                        go(i + 1, env, mul(acc, value))
                    return
                nxt: Callable[[Env, Any], None] = lambda e, a: go(i + 1, e, a)  # noqa: E731
                bound = tuple(j for j, k in enumerate(keys) if k in before)
                if not bound or i not in scanned:  # one pass needs no index
                    scanned.add(i)
                    _scan(table.items(), keys, env, acc, nxt)
                    return
                index = indexes.get(i)
                if index is None:  # scanned again inside a loop: index it once
                    index = indexes[i] = _index(table, bound)
                _scan(index.get(tuple(env[keys[j]] for j in bound), ()), keys, env, acc, nxt)

        scanned: set[int] = set()
        indexes: dict[int, dict[Key, list[tuple[Key, Any]]]] = {}
        go(0, dict(env), 1)
        return {k: v for k, v in out.items() if v != 0}


def _index(table: dict[Key, Any], bound: tuple[int, ...]) -> dict[Key, list[tuple[Key, Any]]]:
    """A received table's entries by the values at the positions the plan has bound."""
    index: dict[Key, list[tuple[Key, Any]]] = {}
    for full, value in table.items():
        index.setdefault(tuple(full[j] for j in bound), []).append((full, value))
    return index


def _scan(
    entries: Iterable[tuple[Key, Any]],
    keys: tuple[str, ...],
    env: Env,
    acc: Any,
    nxt: Callable[[Env, Any], None],
) -> None:
    """Each entry that fits the variables bound so far, with its open variables bound."""
    for full, value in list(entries):
        bound = dict(env)
        fits = True
        for k, v in zip(keys, full, strict=True):
            if k in bound:
                if bound[k] != v:
                    fits = False
                    break
            else:
                bound[k] = v
        if fits:
            nxt(bound, mul(acc, value))
