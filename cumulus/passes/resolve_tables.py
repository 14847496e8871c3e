"""Pass 3: FROM and JOIN -> table references and the scopes their columns resolve in (each ON
clause sees only the tables joined so far, as SQL has it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sqlglot import exp

from aggview import errors
from aggview.schema import ColumnType, TableSchema
from cumulus.passes.check_support import refuse, unsupported_node
from cumulus.plan import ColumnRef, TableRef
from cumulus.sqltext import Typed, identifier


@dataclass(frozen=True)
class Scope:
    """The aliases a clause can see, in FROM order, with their schemas. ``merged``: a column
    that ``JOIN ... USING`` or ``NATURAL JOIN`` made one (its aliases, the first one's value
    standing for all, which an inner join makes equal): named bare, it is not ambiguous."""

    tables: dict[str, TableSchema]
    merged: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def resolve(self, column: exp.Column) -> tuple[ColumnRef, ColumnType]:
        if column.args.get("db") or column.args.get("catalog"):
            raise refuse("a column qualified by schema", column)
        name = identifier(column.this, "column")
        qualifier = column.args.get("table")
        if qualifier is not None:
            alias = identifier(qualifier, "table alias")
            schema = self.tables.get(alias)
            if schema is None:
                raise errors.UnknownColumn(
                    f"unknown table alias {alias!r} in {column.sql()} "
                    f"(tables in scope: {', '.join(self.tables)})"
                )
            if not schema.has_column(name):
                raise errors.UnknownColumn(
                    f"unknown column {alias}.{name} (table {schema.name} has no column {name!r})"
                )
            return ColumnRef(alias, name), schema.column(name).type
        matches = [alias for alias, schema in self.tables.items() if schema.has_column(name)]
        if not matches:
            raise errors.UnknownColumn(f"unknown column {name} (not in {', '.join(self.tables)})")
        if len(matches) > 1 and set(matches) <= set(self.merged.get(name, ())):
            matches = [self.merged[name][0]]
        if len(matches) > 1:
            raise errors.InvalidArgument(
                f"column {name} is ambiguous: {', '.join(f'{a}.{name}' for a in matches)}"
            )
        return ColumnRef(matches[0], name), self.tables[matches[0]].column(name).type


def _table_ref(
    node: exp.Expression, table: Callable[[str], TableSchema]
) -> tuple[TableRef, TableSchema]:
    if not isinstance(node, exp.Table):
        raise unsupported_node(node)
    if node.args.get("db") or node.args.get("catalog"):
        raise refuse("a table qualified by schema", node)
    name = identifier(node.this, "table")
    alias_node = node.args.get("alias")
    if alias_node is not None and alias_node.args.get("columns"):
        raise refuse("column aliases on a table", node)
    alias = identifier(alias_node, "table alias") if alias_node is not None else name
    try:
        schema = table(name)
    except KeyError:
        schema = None
    if schema is None:
        raise errors.UnknownTable(f"unknown table {name!r}")
    return TableRef(alias, name), schema


def resolve_tables(
    select: exp.Select, table: Callable[[str], TableSchema]
) -> tuple[tuple[TableRef, ...], Scope, list[tuple[exp.Expression, Scope]]]:
    """FROM and JOINs -> table refs, the full scope, and each ON clause with the scope it sees."""
    refs: list[TableRef] = []
    scope: dict[str, TableSchema] = {}
    merged: dict[str, tuple[str, ...]] = {}
    ons: list[tuple[exp.Expression, Scope]] = []
    items = [select.args["from_"].this, *(j.this for j in select.args.get("joins") or [])]
    joins = [None, *(select.args.get("joins") or [])]
    for item, join in zip(items, joins, strict=True):
        ref, schema = _table_ref(item, table)
        if ref.alias in scope:
            raise errors.InvalidArgument(
                f"table alias {ref.alias} is used twice; give each occurrence its own alias"
            )
        on = join.args.get("on") if join is not None else None
        if join is not None and (join.args.get("using") or join.method):
            on = _using_condition(join, ref.alias, schema, scope, merged)
        refs.append(ref)
        scope[ref.alias] = schema
        if on is not None:
            ons.append((on, Scope(dict(scope))))
    return tuple(refs), Scope(scope, merged), ons


def _using_condition(
    join: exp.Join,
    alias: str,
    schema: TableSchema,
    before: dict[str, TableSchema],
    merged: dict[str, tuple[str, ...]],
) -> exp.Expression | None:
    """``JOIN t USING (x, ...)`` or ``NATURAL JOIN t`` as the ON condition it stands for: each
    column equal to the same column of the tables before (the first that has it; a column
    merged before is one already). None for a NATURAL JOIN with no column in common, which SQL
    makes a cross product."""
    if join.method:
        earlier = before.values()
        names = [c.name for c in schema.columns if any(t.has_column(c.name) for t in earlier)]
    else:
        names = [identifier(c, "column") for c in join.args["using"]]
    equalities = []
    for name in names:
        if not schema.has_column(name):
            raise errors.UnknownColumn(
                f"USING ({name}): table {schema.name} has no column {name!r}"
            )
        having = [a for a, s in before.items() if s.has_column(name)]
        if not having:
            raise errors.UnknownColumn(
                f"USING ({name}): no table before {alias} has a column {name!r}"
            )
        group = merged.get(name, (having[0],))
        if len(having) > 1 and not set(having) <= set(group):
            raise errors.InvalidArgument(
                f"USING ({name}) is ambiguous: {', '.join(f'{a}.{name}' for a in having)}"
            )
        merged[name] = (*group, alias)
        equalities.append(
            exp.EQ(
                this=exp.column(name, table=group[0], quoted=True),
                expression=exp.column(name, table=alias, quoted=True),
            )
        )
    return exp.and_(*equalities) if equalities else None


def typed_column(node: exp.Column, scope: Scope) -> Typed:
    ref, type_ = scope.resolve(node)
    return {"col": ref.to_json()}, type_
