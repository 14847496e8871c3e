"""Reading a view from its maps: the values a user sees, with the view path's rules (one helper
per aggregate kind, as ``cumulus.aggstate`` reads a view row):

- a group exists while its COUNT(*) map is positive; a view without GROUP BY has one row always;
- SUM is NULL over no non-NULL argument (its count map is zero), else the sum of its monomial
  maps in the result type (DECIMAL exact, to the result's scale);
- AVG is sum / count, rounded half-even to DECIMAL(38, max(s, 6)) (FLOAT for FLOAT);
- MIN, MAX and COUNT(DISTINCT) read the per-group count map cnt[g, v]: the smallest, the largest
  and the number of values v with a positive count;
- HAVING is applied last, over the view's columns (hidden aggregates included).
"""

from __future__ import annotations

import dataclasses
import decimal
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from cumulus.expressions import add
from cumulus.m3.exprs import compile_guard, quantize
from cumulus.m3.program import MapRef, Part, View, ViewColumn

if TYPE_CHECKING:
    from cumulus.m3.interpreter import Interpreter, Key

_DIVIDE = decimal.Context(prec=120)


def _project(values: dict[Key, Any], part: Part, names: list[str]) -> dict[Key, Any]:
    """Entries keyed by the part's variables -> keyed by ``names`` (the view's group keys,
    then the value variable of a count map)."""
    keys = list(part.keys)
    positions = [keys.index(n) for n in names]
    out: dict[Key, Any] = {}
    for key, value in values.items():
        projected = tuple(key[i] for i in positions)
        old = out.get(projected)
        out[projected] = value if old is None else add(old, value)
    return out


def _multisets(values: dict[Key, Any]) -> dict[Key, list[Any]]:
    """cnt[g, v] -> {g: [v with a positive count]}."""
    out: dict[Key, list[Any]] = {}
    for key, count in values.items():
        if count > 0:
            out.setdefault(key[:-1], []).append(key[-1])
    return out


def maps_read(view: View) -> set[str]:
    """The maps reading ``view`` looks at (the others hold the triggers' intermediate state)."""
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, MapRef):
            found.add(node.name)
        elif dataclasses.is_dataclass(node):
            for item in dataclasses.fields(node):
                walk(getattr(node, item.name))
        elif isinstance(node, (tuple, list)):
            for item in node:
                walk(item)

    walk(view.rows)
    walk(view.columns)
    return found


def read_view(interp: Interpreter, view: View) -> list[dict[str, Any]]:
    """The view's rows, each a dict in output order (hidden columns left out)."""
    names = [k for k, _ in view.keys]
    rows = _project(interp.evaluate(view.rows), view.rows, names)
    groups = [g for g, count in rows.items() if count > 0]
    if not names and not groups:
        groups = [()]  # SQL: an aggregate without GROUP BY has one row
    computed: dict[str, dict[Key, Any]] = {}
    for column in view.columns:
        if column.kind is not None:
            computed[column.name] = _column(interp, column, names, groups)
    having = compile_guard(view.having) if view.having is not None else None
    out = []
    for group in groups:
        env: dict[str, Any] = dict(zip(names, group, strict=True))
        for name, values in computed.items():
            env[name] = values[group]
        if having is not None and not having(env):
            continue
        out.append({c.name: env[c.name] for c in view.columns if not c.hidden})
    return out


def _column(
    interp: Interpreter, column: ViewColumn, names: list[str], groups: list[Key]
) -> dict[Key, Any]:
    kind = column.kind
    assert column.type is not None
    if kind in ("MIN", "MAX", "COUNT_DISTINCT"):
        part = column.parts[0]
        value_var = next(k for k in part.keys if k not in names)
        sets = _multisets(_project(interp.evaluate(part), part, [*names, value_var]))
        if kind == "COUNT_DISTINCT":
            return {g: len(sets.get(g, ())) for g in groups}
        pick = min if kind == "MIN" else max
        return {g: pick(sets[g]) if sets.get(g) else None for g in groups}
    if kind == "COUNT":
        counts = _project(interp.evaluate(column.parts[0]), column.parts[0], names)
        return {g: int(counts.get(g, 0)) for g in groups}
    assert column.count is not None
    counts = _project(interp.evaluate(column.count), column.count, names)
    sums = [_project(interp.evaluate(p), p, names) for p in column.parts]
    out: dict[Key, Any] = {}
    for g in groups:
        n = counts.get(g, 0)
        if not n:
            out[g] = None
            continue
        total: Any = 0
        for values in sums:
            total = add(total, values.get(g, 0))
        out[g] = _finish(kind, column, total, n)
    return out


def _finish(kind: str | None, column: ViewColumn, total: Any, count: int) -> Any:
    result = column.type
    assert result is not None
    if result.kind == "FLOAT":
        return float(total) / count if kind == "AVG" else float(total)
    if kind == "AVG":
        return quantize(_DIVIDE.divide(Decimal(total), count), result.scale or 0)
    if result.kind == "INT":
        return int(total)
    return quantize(total, result.scale or 0)
