"""An update's statements at one node as one generated function over the node's own maps.

Where a node reads every slice an update's statements need from its own maps, the reads can
never be revised (one switch whose messages arrive in order: ``Node.log_reads`` is off) and
nothing written at or after the update's timestamp is in those maps yet, the state just before
the update is the maps' current values. The statements are then what the reference
interpreter's trigger is (``cumulus.m3.codegen.compile_trigger``): every statement's delta from
the same state, read in place (a point a ``dict.get``, a slice a walk of the map's index on
its bound positions) with no slice copied, no PUSH to itself and no operation kept. The node
writes the deltas at the update's timestamp, as it writes an operation's result.

The generated code is ``cumulus.m3.codegen``'s, so its semantics are the runtime's statement
code's; ``tests/test_cumulus_runtime.py`` runs random programs both ways.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cumulus.m3.codegen import INDENT, Gen, finish, tuple_code, write_deltas
from cumulus.m3.program import MapRef, Rel
from cumulus.m3.value_kinds import Typing
from cumulus.runtime.maplog import MapLog
from cumulus.runtime.messages import Key
from cumulus.runtime.placement import Step, relation_map

Deltas = tuple[dict[Key, Any], ...]  # per statement, in the order given


class LogAccess:
    """Reads a node's maps in place: their current values and their indexes."""

    def __init__(self, log_of: Callable[[str], MapLog]) -> None:
        self._log_of = log_of
        self._factors: dict[int, MapRef | Rel] = {}

    def _log(self, position: int) -> MapLog:
        factor = self._factors[position]
        name = factor.name if isinstance(factor, MapRef) else relation_map(factor.relation)
        return self._log_of(name)

    def prologue(self, gen: Gen, position: int, factor: MapRef | Rel) -> None:
        self._factors[position] = factor

    def point(self, gen: Gen, position: int, key: str, value: str) -> None:
        current = gen.const(self._log(position).current, "cur")
        gen.line(f"{value} = {current}.get({key})")

    def scan(
        self, gen: Gen, position: int, bound: tuple[int, ...], values: list[str]
    ) -> tuple[str, str]:
        log = self._log(position)
        current = gen.const(log.current, "cur")
        full, value = gen.temp("k"), gen.temp("x")
        if not bound:
            gen.line(f"for {full}, {value} in {current}.items():")
            return full, value
        index = gen.const(log.index(bound), "ix")  # every key ever written: zeros skipped
        gen.line(f"for {full} in {index}.get({tuple_code(values)}, ()):")
        gen.line(f"{INDENT}{value} = {current}.get({full})")
        gen.line(f"{INDENT}if {value} is None:")
        gen.line(f"{INDENT * 2}continue")
        return full, value


def fuse(
    steps: Sequence[Step],
    args: tuple[str, ...],
    typing: Typing | None,
    log_of: Callable[[str], MapLog],
) -> Callable[[Key], Deltas]:
    """``run(values)``: each step's delta (zeros included) from the maps as they are now."""
    gen = Gen(counting=False, typing=typing)
    parts = [(step.body, step.target_keys, f"statement {step.number}") for step in steps]
    outs = write_deltas(gen, args, parts, LogAccess(log_of))
    gen.line(f"return {tuple_code(outs)}")
    return finish(gen, "def run(_values):", "run")
