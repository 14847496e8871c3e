"""Canonical forms of map definitions, so that equivalent maps are one map (seed 003: "Some paths
produce maps based on equivalent queries; DBToaster detects these and reuses the same map").

Two definitions are equivalent when one is the other with its variables renamed and its factors
reordered. Every variable occurs in a relation atom (or is bound by a lift over them), so an
order of the atoms fixes a naming: v0, v1, ... in order of first occurrence. The canonical text
is the smallest text over the orders of atoms of the same relation (atoms of different relations
are sorted by name); definitions are small, so trying the permutations is cheap.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from cumulus.m3.exprs import rename
from cumulus.m3.printer import expr_text
from cumulus.m3.program import AggSum, Factor, Guard, Lift, MapExtreme, MapLift, Rel, Value


@dataclass(frozen=True)
class Canonical:
    text: str
    names: dict[str, str]  # the definition's variable -> its canonical name


def _orders(atoms: list[Rel]) -> Iterator[list[Rel]]:
    groups: dict[str, list[Rel]] = {}
    for atom in sorted(atoms, key=lambda a: a.relation):
        groups.setdefault(atom.relation, []).append(atom)
    for choice in itertools.product(*(itertools.permutations(g) for g in groups.values())):
        yield [atom for group in choice for atom in group]


def _text(factor: Factor, names: dict[str, str]) -> str:
    if isinstance(factor, Guard):
        return "{" + expr_text(rename(factor.pred, names)) + "}"
    if isinstance(factor, Value):
        return "<" + expr_text(rename(factor.expr, names)) + ">"
    if isinstance(factor, MapLift):
        keys = ",".join(names.get(k, "_") for k in factor.keys)  # _: a MIN/MAX's placeholder
        kind = factor.extreme if isinstance(factor, MapExtreme) else ""
        return f"({names[factor.var]} ^= {kind}{factor.name}[{keys}])"
    assert isinstance(factor, Lift)
    return f"({names[factor.var]} ^= {expr_text(rename(factor.expr, names))})"


def _lifted_text(lift: Lift | MapLift, names: dict[str, str]) -> str:
    """What a lift binds, in canonical names (its variable named after it)."""
    if isinstance(lift, MapLift):
        kind = lift.extreme if isinstance(lift, MapExtreme) else ""
        return f"{kind}{lift.name}[{','.join(names.get(k, k) for k in lift.keys)}]"
    return expr_text(rename(lift.expr, names))


def canonical(definition: AggSum) -> Canonical:
    atoms = [f for f in definition.body if isinstance(f, Rel)]
    others = [f for f in definition.body if not isinstance(f, Rel)]
    lifts = [f for f in others if isinstance(f, Lift | MapLift)]
    best: Canonical | None = None
    for order in _orders(atoms):
        names: dict[str, str] = {}
        for atom in order:
            for arg in atom.args:
                names.setdefault(arg, f"v{len(names)}")
        # lift variables occur in no atom: name them in the order of their (renamed) terms
        for lift in sorted(lifts, key=lambda f: _lifted_text(f, names)):
            names.setdefault(lift.var, f"v{len(names)}")
        parts = [f"{a.relation}({','.join(names[x] for x in a.args)})" for a in order]
        parts.append("[" + ",".join(sorted(names[k] for k in definition.keys)) + "]")
        parts += sorted(_text(f, names) for f in others)
        text = " ".join(parts)
        if best is None or text < best.text:
            best = Canonical(text, names)
    assert best is not None
    return best
