"""Reading a view from its maps: the values a user sees, finished by each kind's rule
(``cumulus.aggregates``), as ``cumulus.aggstate`` reads a view row:

- a group exists while its COUNT(*) map is positive; a view without GROUP BY has one row always;
- COUNT reads its map; SUM and AVG the sum of their monomial maps and their count map; MIN, MAX
  and COUNT(DISTINCT) the per-group count map cnt[g, v] as the multiset of the values v;
- a derived column (an expression over aggregates and group keys) is evaluated from them;
- HAVING is applied last, over the view's columns (hidden aggregates included, and the
  values of uncorrelated scalar subqueries it compares with: keyless maps, read once);
- a bag view (no aggregates) has one column, ``__count``: its group's COUNT(*), the row's
  multiplicity (DBToaster's bag: the map's value); the row is read that many times. A distinct
  view has none: each group is read once.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

from cumulus.aggregates import RULES, M, N, S
from cumulus.expressions import add
from cumulus.m3.exprs import compile_guard, compile_value, vars_of
from cumulus.m3.program import MapRef, Part, View, ViewColumn
from cumulus.plan import MULTIPLICITY

if TYPE_CHECKING:
    from cumulus.m3.interpreter import Interpreter, Key


class Reader(Protocol):
    """What reading a view needs of an interpreter: a part's entries."""

    def evaluate(self, part: Part) -> dict[Key, Any]: ...


def _project(values: dict[Key, Any], part: Part, names: list[str]) -> dict[Key, Any]:
    """Entries keyed by the part's variables -> keyed by ``names`` (the view's group keys,
    then the value variable of a count map); ``values`` itself where those are its keys in
    order (read, never changed)."""
    keys = list(part.keys)
    positions = [keys.index(n) for n in names]
    if positions == list(range(len(keys))):
        return values  # keyed as wanted already (each key once: nothing to add up)
    out: dict[Key, Any] = {}
    for key, value in values.items():
        projected = tuple(key[i] for i in positions)
        old = out.get(projected)
        out[projected] = value if old is None else add(old, value)
    return out


def _multisets(values: dict[Key, Any]) -> dict[Key, dict[Any, Any]]:
    """cnt[g, v] -> {g: {v: count}}."""
    out: dict[Key, dict[Any, Any]] = {}
    for key, count in values.items():
        out.setdefault(key[:-1], {})[key[-1]] = count
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


def read_view(interp: Interpreter, view: View, counted: bool = False) -> list[dict[str, Any]]:
    """The view's rows, each a dict in output order (hidden columns left out); a bag view's
    row as many times as it counts (``counted``: once, with its ``__count``)."""
    rows = list(read_groups(interp, view).values())
    return rows if counted else expand(rows)


def read_groups(interp: Reader, view: View) -> dict[Key, dict[str, Any]]:
    """The view's counted rows by group (its key values, in ``view.keys`` order): the groups
    of what ``interp`` holds, whatever else the view has (``cumulus.m3.epoch_rows`` reads
    only the groups that changed)."""
    names = [k for k, _ in view.keys]
    rows = _project(interp.evaluate(view.rows), view.rows, names)
    groups = [g for g, count in rows.items() if count > 0]
    if not names and not groups:
        groups = [()]  # SQL: an aggregate without GROUP BY has one row
    having = compile_guard(view.having) if view.having is not None else None
    kinds = [c for c in view.columns if c.kind is not None]
    computed: dict[str, dict[Key, Any]] = {}
    reads = set(vars_of(view.having)) if view.having is not None else set()
    if having is not None and reads <= set(names) | {c.name for c in kinds}:
        # HAVING over group keys and columns of maps alone: the groups it keeps first, the
        # other columns for those only (a view compared with a scalar keeps few of its groups)
        for column in kinds:
            if column.name in reads:
                computed[column.name] = _column(interp, column, names, groups)
        groups = [g for g in groups if having(_env(names, g, computed))]
        having = None
    for column in kinds:
        if column.name not in computed:
            computed[column.name] = _column(interp, column, names, groups)
    derived = [(c.name, compile_value(c.expr)) for c in view.columns if c.expr is not None]
    out = {}
    for group in groups:
        env = _env(names, group, computed)
        for name, evaluate in derived:
            env[name] = evaluate(env)
        if having is not None and not having(env):
            continue
        out[group] = {c.name: env[c.name] for c in view.columns if not c.hidden}
    return out


def _env(names: list[str], group: Key, computed: dict[str, dict[Key, Any]]) -> dict[str, Any]:
    """A group's keys and computed columns by name (what HAVING and derived columns read)."""
    env: dict[str, Any] = dict(zip(names, group, strict=True))
    for name, values in computed.items():
        env[name] = values[group]
    return env


def expand(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Counted rows (a bag view's, with ``__count``) -> each as many times as it counts."""
    out = []
    for row in rows:
        if MULTIPLICITY not in row:
            out.append(row)
            continue
        plain = {k: v for k, v in row.items() if k != MULTIPLICITY}
        out += [dict(plain) for _ in range(row[MULTIPLICITY])]
    return out


def _column(
    interp: Reader, column: ViewColumn, names: list[str], groups: list[Key]
) -> dict[Key, Any]:
    """The column's value per group: its maps as the kind's state, finished by its rule. A
    column whose maps are not keyed by the groups (a scalar subquery's, read by HAVING) is
    read once and is the same for every group."""
    assert column.kind is not None and column.type is not None
    if names and not set(names) <= set(column.parts[0].keys):
        value = _column(interp, column, [], [()])[()]
        return dict.fromkeys(groups, value)
    rule = RULES[column.kind]
    if rule.keeps_values:
        part = column.parts[0]
        value_var = next(k for k in part.keys if k not in names)
        sets = _multisets(_project(interp.evaluate(part), part, [*names, value_var]))
        states = {g: {M: sets.get(g, {})} for g in groups}
    elif not rule.keeps_sum:  # COUNT: one map
        counts = _project(interp.evaluate(column.parts[0]), column.parts[0], names)
        states = {g: {N: counts.get(g, 0)} for g in groups}
    else:
        assert column.count is not None
        counts = _project(interp.evaluate(column.count), column.count, names)
        sums = [_project(interp.evaluate(p), p, names) for p in column.parts]
        states = {}
        for g in groups:
            total: Any = 0
            for values in sums:
                total = add(total, values.get(g, 0))
            states[g] = {N: counts.get(g, 0), S: total}
    return {g: rule.finish(state, column.type) for g, state in states.items()}
