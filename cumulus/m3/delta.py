"""One step of delta compilation (seed 003 §3.1): the delta of a map's definition for an
insert or delete of one tuple of a relation, simplified into what a statement needs.

For ``AggSum(K, R(x) * R(y) * S(z) * ...)`` and an update ±t of R, the delta is the sum over the
non-empty sets of R's occurrences of (±1)^|set| times the body with those occurrences replaced by
t (for one occurrence: ``ΔR·rest``; a self-join adds ``ΔR·ΔR``, which a delete counts +1). In each
term:

- *parameters*: the replaced atoms' variables unify with the trigger's arguments (two arguments
  in one class become an equality guard {a = b});
- *constants pulled out*: guards, values and lifts over trigger arguments only are evaluated in
  the statement, not stored;
- *factorization*: what remains splits into components that share no variable; each component
  is a sub-query of its own (seed 003's scalar subqueries m_co and m_o), materialized as a map
  keyed by its trigger arguments (unified parameters: no input keys), the left side's keys it
  holds, and the variables a mixed condition needs (those become loop variables);
- conditions mixing trigger arguments with other variables stay in the statement.

The degree of every component is below the definition's, so recursion on the new maps ends.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from aggview.schema import ColumnType
from cumulus.m3.exprs import expr_type, rename, vars_of
from cumulus.m3.program import (
    AggSum,
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

Types = dict[str, ColumnType]


@dataclass
class Component:
    """A sub-query of a delta term: ``definition`` over its own variables, read at ``lookup``
    (the statement's variables, one per key); ``inline`` is the same in the statement's
    variables, for a bounded ``--depth`` that evaluates it over the relations instead."""

    definition: AggSum
    lookup: tuple[str, ...]
    inline: tuple[Factor, ...]
    types: Types


@dataclass
class DeltaTerm:
    coef: int
    target: tuple[str, ...]
    head: list[Factor] = field(default_factory=list)  # over trigger arguments only
    components: list[Component] = field(default_factory=list)
    tail: list[Factor] = field(default_factory=list)  # conditions mixing both


class _Classes:
    """Union-find of variables; a class holding trigger arguments is named by the first."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        self.parent[self.find(a)] = self.find(b)


def factor_vars(factor: Factor) -> list[str]:
    if isinstance(factor, Rel):
        return list(factor.args)
    if isinstance(factor, Guard):
        return vars_of(factor.pred)
    if isinstance(factor, Lift):
        return [factor.var, *vars_of(factor.expr)]
    if isinstance(factor, Value):
        return vars_of(factor.expr)
    if isinstance(factor, MapExtreme):  # (its placeholder key is no variable)
        return [factor.var, *lift_keys(factor), *vars_of(list(factor.adjust or ()))]
    if isinstance(factor, MapLift):
        return [factor.var, *factor.keys]
    return list(factor.keys)


def substitute(factor: Factor, names: dict[str, str]) -> Factor:
    if isinstance(factor, Rel):
        return Rel(factor.relation, tuple(names.get(a, a) for a in factor.args))
    if isinstance(factor, Guard):
        return Guard(rename(factor.pred, names))
    if isinstance(factor, Lift):
        return Lift(names.get(factor.var, factor.var), rename(factor.expr, names))
    if isinstance(factor, Value):
        return Value(rename(factor.expr, names))
    if isinstance(factor, MapLift):
        keys = tuple(names.get(k, k) for k in factor.keys)
        var = names.get(factor.var, factor.var)
        if isinstance(factor, MapExtreme):
            adjust = factor.adjust
            if adjust is not None:
                adjust = (rename(adjust[0], names), rename(adjust[1], names))
            return MapExtreme(factor.name, keys, var, factor.extreme, adjust)
        return MapLift(factor.name, keys, var)
    if isinstance(factor, MapRef):  # in a statement
        return MapRef(factor.name, tuple(names.get(k, k) for k in factor.keys))
    raise TypeError(f"a definition holds no {factor!r}")


def fresh(base: str, taken: set[str]) -> str:
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def delta_terms(
    definition: AggSum,
    types: Types,
    relation: str,
    sign: str,
    args: tuple[str, ...],
    arg_types: tuple[ColumnType, ...],
) -> list[DeltaTerm]:
    """The delta of ``definition`` for ``sign`` one tuple ``args`` of ``relation``."""
    taken = set(args)
    apart = {v: fresh(v, taken) for v in _definition_vars(definition)}
    body = [substitute(f, apart) for f in definition.body]
    keys = tuple(apart[k] for k in definition.keys)
    types = {apart[v]: t for v, t in types.items() if v in apart}
    types.update(zip(args, arg_types, strict=True))
    occurrences = [i for i, f in enumerate(body) if isinstance(f, Rel) and f.relation == relation]
    terms = []
    for size in range(1, len(occurrences) + 1):
        for chosen in itertools.combinations(occurrences, size):
            coef = -1 if sign == "-" and size % 2 else 1
            terms.append(_term(body, keys, dict(types), set(chosen), args, coef))
    return terms


def _definition_vars(definition: AggSum) -> list[str]:
    found: dict[str, None] = dict.fromkeys(definition.keys)
    for factor in definition.body:
        found.update(dict.fromkeys(factor_vars(factor)))
    return list(found)


def _term(
    body: list[Factor],
    keys: tuple[str, ...],
    types: Types,
    chosen: set[int],
    args: tuple[str, ...],
    coef: int,
) -> DeltaTerm:
    classes = _Classes()
    for i in chosen:
        atom = body[i]
        assert isinstance(atom, Rel)
        for var, arg in zip(atom.args, args, strict=True):
            classes.union(var, arg)
    members: dict[str, list[str]] = {}
    for x in list(classes.parent):
        members.setdefault(classes.find(x), []).append(x)
    names: dict[str, str] = {}
    head: list[Factor] = []
    for group in members.values():
        params = [a for a in args if a in group]
        for x in group:
            names[x] = params[0]
        for other in params[1:]:
            head.append(Guard({"cmp": "=", "args": [{"var": params[0]}, {"var": other}]}))
    rest = [substitute(f, names) for i, f in enumerate(body) if i not in chosen]
    term = DeltaTerm(coef, tuple(names.get(k, k) for k in keys), head)
    _split(term, rest, set(args), types)
    return term


def _split(term: DeltaTerm, rest: list[Factor], bound: set[str], types: Types) -> None:
    """Sort the remaining factors into head (bound only), components and tail (mixed)."""
    bound = set(bound)
    local: list[Factor] = []
    lifted: list[Factor] = []
    growing = True
    while growing:  # lifts over bound variables, and those over what they bind in turn
        growing = False
        for factor in rest:
            if any(factor is f for f in lifted):
                continue
            if isinstance(factor, Lift) and set(vars_of(factor.expr)) <= bound:
                types.setdefault(factor.var, expr_type(factor.expr, types))
            elif not (isinstance(factor, MapLift) and set(lift_keys(factor)) <= bound):
                continue
            term.head.append(factor)
            lifted.append(factor)
            bound.add(factor.var)
            growing = True
    nested = nested_vars(rest)
    atoms = {a for f in rest if isinstance(f, Rel) for a in f.args}
    for factor in rest:
        if any(factor is f for f in lifted):
            continue
        used = set(factor_vars(factor))
        if isinstance(factor, Rel):
            local.append(factor)
        elif used <= bound:
            term.head.append(factor)
        elif used & bound or used & nested or isinstance(factor, MapLift):
            # a nested aggregate's value stays in the statement (the update may change its
            # map: read in a component's map it would be the old value), a column compared
            # with one too
            term.tail.append(factor)
        else:
            local.append(factor)
    # (a lift of a relation's column tests it: the component keeps the column)
    tail_bound = {f.var for f in term.tail if isinstance(f, Lift | MapLift) and f.var not in atoms}
    classes = _Classes()
    for n, factor in enumerate(local):
        classes.find(f"#{n}")
        for x in factor_vars(factor):
            if x not in bound:
                classes.union(f"#{n}", x)
    by_root: dict[str, list[Factor]] = {}
    for n, factor in enumerate(local):
        by_root.setdefault(classes.find(f"#{n}"), []).append(factor)
    exported = {k for k in term.target if k not in bound and k not in tail_bound}
    for factor in term.tail:
        exported |= {x for x in factor_vars(factor) if x not in bound}
    exported -= tail_bound
    for factors in by_root.values():
        term.components.append(_component(factors, bound, exported, types))


def nested_vars(body: list[Factor] | tuple[Factor, ...]) -> set[str]:
    """Variables bound to a nested aggregate's value (``MapLift``) and the lifts over them:
    what a materialized map cannot hold (its value changes with the nested maps). A variable
    of a relation is none: its lift compares (``x = (SELECT ...)``, a join edge)."""
    atoms = {a for f in body if isinstance(f, Rel) for a in f.args}  # a lift of one: a test
    found = {f.var for f in body if isinstance(f, MapLift)} - atoms
    growing = True
    while growing:
        growing = False
        for factor in body:
            if isinstance(factor, Lift) and factor.var not in found | atoms:
                if set(vars_of(factor.expr)) & found:
                    found.add(factor.var)
                    growing = True
    return found


def _component(
    factors: list[Factor], bound: set[str], exported: set[str], types: Types
) -> Component:
    """A component as a definition over its own variables: each trigger argument it reads
    becomes a key (named after the column it stands in), as do exported variables."""
    used: dict[str, None] = {}
    for factor in factors:
        used.update(dict.fromkeys(factor_vars(factor)))
    taken = {x for x in used if x not in bound}
    rename_bound: dict[str, str] = {}
    lookup: list[str] = []
    for factor in factors:
        if not isinstance(factor, Rel):
            continue
        for x in factor.args:
            if x in bound and x not in rename_bound:
                rename_bound[x] = fresh(x, taken)
                lookup.append(x)
            elif x not in bound and x in exported and x not in lookup:
                lookup.append(x)
    for factor in factors:
        if isinstance(factor, Lift) and factor.var in exported and factor.var not in lookup:
            lookup.append(factor.var)
    body = tuple(substitute(f, rename_bound) for f in factors)
    def_keys = tuple(rename_bound.get(x, x) for x in lookup)
    def_types = {rename_bound.get(x, x): types[x] for x in used if x in types}
    for factor in body:
        if isinstance(factor, Lift) and factor.var not in def_types:
            def_types[factor.var] = expr_type(factor.expr, def_types)
    return Component(AggSum(def_keys, body), tuple(lookup), tuple(factors), def_types)
