"""SQL writes: ``INSERT``, ``UPDATE``, ``DELETE``, and ``BEGIN; …; COMMIT;`` around them.

Statements become the client's operations (the same checks, the same typed values). Inserts
alone commit like a client's transaction. An ``UPDATE`` or ``DELETE`` reads the rows its WHERE
selects at the transaction's own timestamp, marking what it read (an older writer arriving
later is refused, so no update is lost), and writes them at that timestamp; a timestamp-order
abort runs the whole transaction again. A WHERE that fixes the primary key reads that row, one
that fixes a prefix of it reads that key range, anything else reads the table.

Within ``BEGIN … COMMIT`` each statement sees what the earlier ones did; the transaction then
writes each row it touched once (its net change), and ``ROLLBACK`` instead of ``COMMIT``
applies nothing.
An ``UPDATE`` of a primary-key column is refused: delete the row and insert it anew.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from aggview import errors
from aggview.keycodec import encode_key, prefix_end
from aggview.rowcodec import decode_row
from aggview.schema import Column, TableSchema, from_storage, to_storage
from aggview.values import to_row
from aggview.wire import client_pb2 as cpb
from coordinator.transactions import TransactionManager
from cumulus.sqltext import column_value, identifier

Predicate = Callable[[dict[str, Any]], bool]
_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    exp.EQ: operator.eq,
    exp.NEQ: operator.ne,
    exp.LT: operator.lt,
    exp.LTE: operator.le,
    exp.GT: operator.gt,
    exp.GTE: operator.ge,
}
WRITES = (exp.Insert, exp.Update, exp.Delete)
CONTROL = (exp.Transaction, exp.Commit, exp.Rollback)


@dataclass
class Write:
    """One statement's part of a transaction."""

    verb: str
    schema: TableSchema
    inserts: list[dict[str, Any]] = field(default_factory=list)
    where: Predicate | None = None  # UPDATE, DELETE: which rows
    key: dict[str, Any] = field(default_factory=dict)  # equalities on leading key columns
    sets: dict[str, Any] = field(default_factory=dict)  # UPDATE: column -> value
    adds: dict[str, Any] = field(default_factory=dict)  # UPDATE: column -> c + this
    changed: int = 0

    @property
    def reads(self) -> bool:
        return self.verb != "INSERT"


def is_write(statements: list[exp.Expression]) -> bool:
    return any(isinstance(s, WRITES + CONTROL) for s in statements)


async def run_writes(statements: list[exp.Expression], manager: TransactionManager) -> str:
    """Runs the statements: each one its own transaction, or those between BEGIN and COMMIT
    as one; returns what each did ("INSERT 2; UPDATE 1 …"). Every statement is checked
    before any runs, so a call with a bad one applies nothing."""
    said: list[str] = []
    for unit in _units(statements, manager):
        if unit is None:
            said.append("ROLLBACK: nothing applied")
            continue
        writes, block = unit
        ts = await _transaction(writes, manager)
        said.append(f"{'COMMIT ' if block else ''}{_counts(writes)} at timestamp {ts}")
    return "; ".join(said)


def _units(
    statements: list[exp.Expression], manager: TransactionManager
) -> list[tuple[list[Write], bool] | None]:
    """The transactions to run, in order: (writes, whether a BEGIN … COMMIT block), or None
    for a rolled back one."""
    units: list[tuple[list[Write], bool] | None] = []
    group: list[Write] | None = None
    for statement in statements:
        if isinstance(statement, exp.Transaction):
            if group is not None:
                raise errors.InvalidArgument("BEGIN inside a transaction: COMMIT it first")
            if statement.args.get("modes"):
                raise errors.InvalidArgument(
                    f"{statement.sql()}: a read-only block holds SELECTs only, then COMMIT"
                )
            group = []
        elif isinstance(statement, exp.Commit | exp.Rollback):
            if group is None:
                raise errors.InvalidArgument(f"{statement.key.upper()} without BEGIN")
            if isinstance(statement, exp.Rollback):
                units.append(None)
            elif group:
                units.append((group, True))
            group = None
        elif isinstance(statement, WRITES):
            write = _plan(statement, manager)
            if group is not None:
                group.append(write)
            else:
                units.append(([write], False))
        else:
            raise errors.InvalidArgument(
                f"unsupported statement {statement.key.upper()} among writes: a call holds "
                "INSERT, UPDATE, DELETE, BEGIN, COMMIT and ROLLBACK, or one other statement"
            )
    if group is not None:
        raise errors.InvalidArgument("BEGIN without COMMIT or ROLLBACK: nothing applied")
    return units


def _counts(writes: list[Write]) -> str:
    return ", ".join(f"{w.verb} {w.changed}" for w in writes)


async def _transaction(writes: list[Write], manager: TransactionManager) -> int:
    if not any(w.reads for w in writes):  # inserts alone: as a client's transaction
        seen: set[tuple[str, tuple[Any, ...]]] = set()
        for write in writes:
            for row in write.inserts:
                key = (write.schema.name, _key_of(write.schema, row))
                if key in seen:
                    raise _duplicate(write.schema, row)
                seen.add(key)
            write.changed = len(write.inserts)
        operations = [_insert(w.schema, row) for w in writes for row in w.inserts]
        return await manager.commit(operations)

    async def build(ts: int) -> list[cpb.Operation]:
        effect = Effect(manager, ts)
        for write in writes:
            write.changed = 0
            if not write.reads:
                for row in write.inserts:
                    await effect.insert(write.schema, row)
                write.changed = len(write.inserts)
                continue
            for row in await effect.matching(write):
                effect.put(
                    write.schema, row, None if write.verb == "DELETE" else _updated(write, row)
                )
                write.changed += 1
        return effect.operations()

    return await manager.read_write_transaction(build, {w.schema.table_id for w in writes})


class Effect:
    """What a transaction's statements do to each row they touch, each statement seeing the
    ones before it; in the end, one operation per row (its net change)."""

    def __init__(self, manager: TransactionManager, ts: int) -> None:
        self.manager = manager
        self.ts = ts
        self.schemas: dict[str, TableSchema] = {}
        # (table, key values) -> (the row before the transaction, the row now); None: absent
        self.rows: dict[tuple[str, tuple[Any, ...]], tuple[Any, Any]] = {}

    async def insert(self, schema: TableSchema, row: dict[str, Any]) -> None:
        full = {c.name: row.get(c.name) for c in schema.columns}
        key = (schema.name, _key_of(schema, full))
        if key not in self.rows:
            before = await _read(self.manager, schema, full, self.ts)
            self.rows[key] = (before, before)
        if self.rows[key][1] is not None:
            raise _duplicate(schema, full)
        self.put(schema, full, full)

    def put(self, schema: TableSchema, old: dict[str, Any], new: dict[str, Any] | None) -> None:
        self.schemas[schema.name] = schema
        key = (schema.name, _key_of(schema, old))
        before = self.rows[key][0] if key in self.rows else old
        self.rows[key] = (before, new)

    async def matching(self, write: Write) -> list[dict[str, Any]]:
        """The rows ``write`` selects now: as stored at the transaction's timestamp, changed
        by the statements before it."""
        schema = write.schema
        stored = await _stored(schema, write.key, self.manager, self.ts)
        current = {_key_of(schema, row): row for row in stored}
        for (table, key), (_, row) in self.rows.items():
            if table == schema.name:
                current[key] = row
        return [
            row
            for _, row in sorted(current.items(), key=lambda item: repr(item[0]))
            if row is not None and (write.where is None or write.where(row))
        ]

    def operations(self) -> list[cpb.Operation]:
        out = []
        for (table, _), (before, after) in self.rows.items():
            schema = self.schemas[table]
            if before is None and after is not None:
                out.append(_insert(schema, after))
            elif before is not None and after is None:
                key = to_row({n: before[n] for n in schema.primary_key})
                out.append(cpb.Operation(kind=cpb.Operation.DELETE, table=table, key=key))
            elif before is not None and after is not None and before != after:
                key = to_row({n: before[n] for n in schema.primary_key})
                values = to_row({n: v for n, v in after.items() if n not in schema.primary_key})
                out.append(
                    cpb.Operation(kind=cpb.Operation.UPDATE, table=table, key=key, values=values)
                )
        return out


def _key_of(schema: TableSchema, row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row.get(n) for n in schema.primary_key)


def _duplicate(schema: TableSchema, row: dict[str, Any]) -> errors.AlreadyExists:
    shown = ", ".join(f"{n}={row.get(n)!r}" for n in schema.primary_key)
    return errors.AlreadyExists(
        f"table {schema.name}, row {{{shown}}}: a row with this key already exists"
    )


# ----------------------------------------------------------------------------- planning


def _plan(statement: exp.Expression, manager: TransactionManager) -> Write:
    table = statement.this.this if isinstance(statement.this, exp.Schema) else statement.this
    name = identifier(table, "table")
    if manager.views is not None and name in manager.views.views:
        raise errors.InvalidArgument(
            f"{name} is a materialized view: it changes with its base tables, write those"
        )
    schema = manager.catalog.table(name)
    if isinstance(statement, exp.Insert):
        return Write("INSERT", schema, inserts=_rows(statement, schema))
    where = statement.args.get("where")
    write = Write(
        "UPDATE" if isinstance(statement, exp.Update) else "DELETE",
        schema,
        where=_predicate(where.this, schema) if where is not None else (lambda row: True),
        key=_key_prefix(where.this if where is not None else None, schema),
    )
    if isinstance(statement, exp.Update):
        for assignment in statement.expressions:
            _assign(write, assignment)
    return write


def _rows(statement: exp.Insert, schema: TableSchema) -> list[dict[str, Any]]:
    values = statement.expression
    if not isinstance(values, exp.Values):
        raise errors.InvalidArgument("INSERT takes VALUES (...), (...) (not a query)")
    if isinstance(statement.this, exp.Schema):
        names = [schema.column(identifier(c, "column")).name for c in statement.this.expressions]
    else:
        names = list(schema.column_names)
    rows = []
    for item in values.expressions:
        literals = item.expressions if isinstance(item, exp.Tuple) else [item]
        if len(literals) != len(names):
            raise errors.InvalidArgument(
                f"INSERT INTO {schema.name}: {len(literals)} values for {len(names)} columns "
                f"({', '.join(names)})"
            )
        rows.append(
            {
                n: column_value(v, schema.column(n).type)
                for n, v in zip(names, literals, strict=True)
            }
        )
    return rows


def _assign(write: Write, assignment: exp.Expression) -> None:
    schema = write.schema
    if not isinstance(assignment, exp.EQ) or not isinstance(assignment.this, exp.Column):
        raise errors.InvalidArgument(f"unsupported SET item {assignment.sql()!r}")
    column = schema.column(identifier(assignment.this, "column"))
    if column.name in schema.primary_key:
        raise errors.InvalidArgument(
            f"UPDATE cannot change {schema.name}.{column.name}, a primary-key column: delete "
            "the row and insert it anew"
        )
    value = assignment.expression
    if isinstance(value, exp.Add | exp.Sub) and _names(value.this, column):
        delta = column_value(value.expression, column.type)
        write.adds[column.name] = -delta if isinstance(value, exp.Sub) else delta
        return
    try:
        write.sets[column.name] = column_value(value, column.type)
    except errors.InvalidArgument:
        raise errors.InvalidArgument(
            f"unsupported SET {column.name} = {value.sql()}: a literal, or "
            f"{column.name} + literal / {column.name} - literal"
        ) from None


def _names(node: exp.Expression, column: Column) -> bool:
    return isinstance(node, exp.Column) and identifier(node, "column") == column.name


def _operand(node: exp.Expression, schema: TableSchema) -> tuple[Column, exp.Expression]:
    if isinstance(node.this, exp.Column):
        return schema.column(identifier(node.this, "column")), node.expression
    raise errors.InvalidArgument(f"unsupported condition {node.sql()!r}: column op literal")


def _predicate(node: exp.Expression, schema: TableSchema) -> Predicate:
    """A WHERE as a test on a row of typed values (SQL's NULL: a comparison is not true)."""
    if isinstance(node, exp.Paren):
        return _predicate(node.this, schema)
    if isinstance(node, exp.And | exp.Or):
        left, right = _predicate(node.this, schema), _predicate(node.expression, schema)
        if isinstance(node, exp.And):
            return lambda row: left(row) and right(row)
        return lambda row: left(row) or right(row)
    if isinstance(node, exp.Not):
        inner = _predicate(node.this, schema)
        return lambda row: not inner(row)
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        column = schema.column(identifier(node.this, "column")).name
        return lambda row: row.get(column) is None
    if isinstance(node, exp.In):
        column = schema.column(identifier(node.this, "column"))
        options = [column_value(v, column.type) for v in node.expressions]
        return lambda row: row.get(column.name) is not None and row[column.name] in options
    if isinstance(node, exp.Between):
        column = schema.column(identifier(node.this, "column"))
        low = column_value(node.args["low"], column.type)
        high = column_value(node.args["high"], column.type)
        return lambda row: row.get(column.name) is not None and low <= row[column.name] <= high
    compare = _COMPARE.get(type(node))
    if compare is None:
        raise errors.InvalidArgument(
            f"unsupported condition {node.sql()!r}: use comparisons, IN, BETWEEN, IS NULL, "
            "AND, OR, NOT"
        )
    column, literal = _operand(node, schema)
    value = column_value(literal, column.type)
    name = column.name
    return lambda row: row.get(name) is not None and value is not None and compare(row[name], value)


def _key_prefix(node: exp.Expression | None, schema: TableSchema) -> dict[str, Any]:
    """Equalities on leading primary-key columns that every selected row must meet."""
    equal: dict[str, Any] = {}
    terms = node.flatten() if isinstance(node, exp.And) else [node] if node is not None else []
    for term in terms:
        if isinstance(term, exp.EQ) and isinstance(term.this, exp.Column):
            column = schema.column(identifier(term.this, "column"))
            try:
                equal[column.name] = column_value(term.expression, column.type)
            except errors.InvalidArgument:
                continue
    prefix: dict[str, Any] = {}
    for name in schema.primary_key:
        if name not in equal or equal[name] is None:
            break
        prefix[name] = equal[name]
    return prefix


# ----------------------------------------------------------------------------- running


async def _stored(
    schema: TableSchema, key: dict[str, Any], manager: TransactionManager, ts: int
) -> list[dict[str, Any]]:
    """The stored rows under a key prefix (leading key columns' values; all of them: one
    row), as transaction ``ts`` reads them, marked as read."""
    columns = [schema.column(n) for n in schema.primary_key[: len(key)]]
    prefix = encode_key(
        [c.type for c in columns],
        [to_storage(c, key[c.name], table=schema.name) for c in columns],
    )
    if len(key) == len(schema.primary_key):
        found = await manager.read_keys_at(schema.table_id, [prefix], ts, own=True)
        stored = list(found.values())
    else:
        stop = (prefix_end(prefix) or b"") if prefix else b""
        rows = await manager.read_range_at(schema.table_id, prefix, stop, ts, own=True)
        stored = [data for _, data in rows]
    return [_typed(schema, data) for data in stored]


async def _read(
    manager: TransactionManager, schema: TableSchema, row: dict[str, Any], ts: int
) -> dict[str, Any] | None:
    """The stored row with ``row``'s key, as transaction ``ts`` reads it (None: absent)."""
    key = {n: row[n] for n in schema.primary_key}
    if any(v is None for v in key.values()):
        raise errors.InvalidArgument(
            f"table {schema.name}: primary-key columns {', '.join(schema.primary_key)} need values"
        )
    found = await _stored(schema, key, manager, ts)
    return found[0] if found else None


def _typed(schema: TableSchema, data: bytes) -> dict[str, Any]:
    raw = decode_row(data) or {}
    return {
        c.name: None if raw.get(c.name) is None else from_storage(c.type, raw[c.name])
        for c in schema.columns
    }


def _insert(schema: TableSchema, row: dict[str, Any]) -> cpb.Operation:
    return cpb.Operation(
        kind=cpb.Operation.INSERT, table=schema.name, values=to_row(row, schema.name)
    )


def _updated(write: Write, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` after the UPDATE's SET (as in SQL, NULL + k is NULL)."""
    new = {**row, **write.sets}
    for name, delta in write.adds.items():
        new[name] = None if row.get(name) is None else row[name] + delta
    return new
