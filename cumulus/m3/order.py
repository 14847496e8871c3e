"""The order a product of M3 factors is evaluated in, shared by the reference interpreter, the
statement compiler (``cumulus.m3.codegen``) and the runtime: one plan, so every evaluator
multiplies the same factors in the same order and binds the same loop variables."""

from __future__ import annotations

from collections.abc import Sequence

from aggview import errors
from cumulus.m3.exprs import vars_of
from cumulus.m3.program import (
    Factor,
    Guard,
    Lift,
    MapExtreme,
    MapLift,
    MapRef,
    Rel,
    Value,
    lift_keys,
)


def produced(factor: Factor) -> set[str]:
    """Variables a factor binds."""
    if isinstance(factor, MapLift):
        return {factor.var}
    if isinstance(factor, MapRef):
        return set(factor.keys)
    if isinstance(factor, Rel):
        return set(factor.args)
    if isinstance(factor, Lift):
        return {factor.var}
    return set()


def needed(factor: Factor) -> set[str]:
    if isinstance(factor, MapExtreme):  # its slice's prefix, and the change it counts
        return set(lift_keys(factor)) | set(vars_of(list(factor.adjust or ())))
    if isinstance(factor, MapLift):  # a point read: every key bound first
        return set(factor.keys)
    if isinstance(factor, Guard):
        return set(vars_of(factor.pred))
    if isinstance(factor, Value | Lift):
        return set(vars_of(factor.expr))
    return set()


def plan_order(body: Sequence[Factor], bound: set[str], where: str) -> list[Factor]:
    """The order to evaluate a product in: conditions and values as soon as their variables
    are bound (guards first, they may stop early), then the lookup with most keys bound."""
    remaining, order, bound = list(body), [], set(bound)
    while remaining:
        ready = [
            f
            for f in remaining
            if isinstance(f, Guard | Value | Lift | MapLift) and needed(f) <= bound
        ]
        if ready:
            pick = next((f for f in ready if isinstance(f, Guard)), ready[0])
        else:
            lookups = [
                f for f in remaining if isinstance(f, MapRef | Rel) and not isinstance(f, MapLift)
            ]
            if not lookups:
                missing = sorted(set().union(*(needed(f) for f in remaining)) - bound)
                raise errors.InvalidArgument(
                    f"{where}: variable {missing[0]} is bound by no trigger argument, map or "
                    "relation"
                )

            pick = max(lookups, key=lambda f, bound=bound: _rank(f, bound))
        order.append(pick)
        remaining.remove(pick)
        bound |= produced(pick)
    return order


def _rank(factor: MapRef | Rel, bound: set[str]) -> tuple[bool, int]:
    keys = factor.keys if isinstance(factor, MapRef) else factor.args
    return all(k in bound for k in keys), sum(k in bound for k in keys)
