"""What code generated for a trigger may assume of its values, so that INT arithmetic is
Python's own operators and a value that is never NULL is not tested for NULL (DBToaster's
generated code is typed for the same reason).

- A trigger's arguments are the row's values as the stream's checker converted them: an INT
  column's are ``int``, a DECIMAL column's ``Decimal``, and a NOT NULL column's never None.
- A map's values are of its declared value type (its aggregate's), never None (zeros and
  absent entries are not kept); a relation's (its multiplicity) are ``int``.
- A map's key is of its declared type; it is never NULL where the map's definition binds it
  from a NOT NULL column of a relation, or guards it with IS NOT NULL (the join of the
  definition's atoms gives every entry such a value there). Anything else is unknown.

The test suite checks every map of its random programs against these assumptions after every
update (``tests/test_m3_codegen.py``), so a type rule that breaks them fails there.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from cumulus.m3.program import AggSum, Guard, MapDecl, MapRef, Program, Rel, Trigger

# (kind, never NULL): kind "INT", "DECIMAL", "FLOAT", "TEXT", "DATE", "BOOL", or None: unknown
Known = tuple[str | None, bool]
UNKNOWN: Known = (None, False)


@dataclass(frozen=True)
class Typing:
    """One trigger's assumptions: its arguments', each map's and each relation's."""

    args: tuple[Known, ...]
    maps: tuple[tuple[str, str, tuple[Known, ...]], ...]  # (map, value kind, keys)
    relations: tuple[tuple[str, tuple[Known, ...]], ...]  # (relation, columns)

    @functools.cached_property
    def _maps(self) -> dict[str, tuple[str, tuple[Known, ...]]]:
        return {name: (value, keys) for name, value, keys in self.maps}

    @functools.cached_property
    def _relations(self) -> dict[str, tuple[Known, ...]]:
        return dict(self.relations)

    def value(self, factor: MapRef | Rel) -> str | None:
        """The kind of the factor's entries' values."""
        if isinstance(factor, Rel):
            return "INT"
        entry = self._maps.get(factor.name)
        return entry[0] if entry is not None else None

    def key(self, factor: MapRef | Rel, position: int) -> Known:
        """What the factor's entries hold at key ``position``."""
        if isinstance(factor, Rel):
            columns = self._relations.get(factor.relation, ())
        else:
            columns = self._maps.get(factor.name, ("", ()))[1]
        return columns[position] if position < len(columns) else UNKNOWN


def typing_of(program: Program, trigger: Trigger) -> Typing:
    """The assumptions the code of ``trigger``'s statements may make."""
    columns = _columns(program)
    return Typing(columns[trigger.relation], _map_kinds(program), tuple(columns.items()))


@functools.lru_cache(maxsize=64)
def _columns(program: Program) -> dict[str, tuple[Known, ...]]:
    return {
        source.name: tuple((c.type.kind, not c.nullable) for c in source.columns)
        for source in program.sources
    }


@functools.lru_cache(maxsize=64)
def _map_kinds(program: Program) -> tuple[tuple[str, str, tuple[Known, ...]], ...]:
    columns = _columns(program)
    return tuple((decl.name, decl.value_type.kind, _keys(decl, columns)) for decl in program.maps)


def _keys(decl: MapDecl, columns: dict[str, tuple[Known, ...]]) -> tuple[Known, ...]:
    never_null = _never_null(decl.definition, columns) if decl.definition else set()
    names = decl.definition.keys if decl.definition else tuple(name for name, _ in decl.keys)
    return tuple(
        (kind.kind, name in never_null) for name, (_, kind) in zip(names, decl.keys, strict=True)
    )


def _never_null(definition: AggSum, columns: dict[str, tuple[Known, ...]]) -> set[str]:
    """The variables every term of the definition's product binds to a non-NULL value."""
    found = set()
    for factor in definition.body:
        if isinstance(factor, Rel):
            known = columns.get(factor.relation, ())
            for var, (_, never) in zip(factor.args, known, strict=False):
                if never:
                    found.add(var)
        elif isinstance(factor, Guard) and "var" in factor.pred.get("notnull", {}):
            found.add(factor.pred["notnull"]["var"])
    return found
