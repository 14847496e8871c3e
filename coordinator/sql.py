"""SQL statements the coordinator runs: table DDL, and simple reads for the command line
(``SELECT * | cols FROM t [WHERE col = literal AND ...] [LIMIT n]``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from aggview import errors
from aggview.keycodec import encode_key, prefix_end
from aggview.rowcodec import decode_row
from aggview.schema import TableSchema, from_storage, to_storage
from aggview.values import to_value
from aggview.wire import client_pb2 as cpb
from coordinator.convert import check_sql_size
from coordinator.dml import is_write, run_writes
from coordinator.transactions import TransactionManager
from cumulus.expressions import literal_value
from cumulus.sqltext import column_value, constant, identifier, parse_statements


@dataclass
class SqlResult:
    message: str = ""
    columns: list[str] = field(default_factory=list)
    rows: list[cpb.Row] = field(default_factory=list)
    timestamp: int = 0


async def run_sql(sql: str, manager: TransactionManager) -> SqlResult:
    check_sql_size(sql, manager.limits)
    if manager.views is not None:
        view_statement = manager.views.handles(sql)
        if view_statement is not None:
            return SqlResult(message=await manager.views.execute(view_statement))
    statements = parse_statements(sql)
    if is_write(statements):
        return SqlResult(message=await run_writes(statements, manager))
    if len(statements) != 1:
        raise errors.InvalidArgument(
            f"expected one SQL statement, got {len(statements)} (several are for writes: "
            "INSERT, UPDATE, DELETE inside BEGIN; ...; COMMIT;)"
        )
    statement = statements[0]
    if isinstance(statement, exp.Create) and str(statement.args.get("kind")).upper() == "TABLE":
        manager.at_leader("CREATE TABLE")
        schema, message = manager.catalog.create_table(statement)
        if schema is not None and manager.views is not None:
            manager.views.publish()
        return SqlResult(message=message)
    if isinstance(statement, exp.Drop) and str(statement.args.get("kind")).upper() == "TABLE":
        return await _drop_tables(statement, manager)
    if isinstance(statement, exp.Select):
        return await _select(statement, manager)
    raise errors.InvalidArgument(
        f"unsupported SQL statement {statement.key.upper()}: expected CREATE TABLE, DROP TABLE, "
        "SELECT, INSERT, UPDATE, DELETE or BEGIN; ...; COMMIT;"
    )


async def _drop_tables(statement: exp.Drop, manager: TransactionManager) -> SqlResult:
    manager.at_leader("DROP TABLE")
    dropped = []
    for table in statement.args.get("tables") or [statement.this]:
        name = identifier(table, "table")
        users = manager.views.views_on(name) if manager.views is not None else []
        if users:
            raise errors.FailedPrecondition(
                f"cannot drop table {name}: materialized view {', '.join(users)} uses it"
            )
        schema = manager.catalog.drop_table(name, bool(statement.args.get("exists")))
        if schema is None:
            continue
        if manager.views is not None:
            manager.views.publish()
        await manager.drop_table(schema.table_id)
        manager.catalog.store.drop_table(schema.table_id)
        dropped.append(name)
    return SqlResult(
        message=f"dropped table {', '.join(dropped)}" if dropped else "nothing dropped"
    )


def _equalities(where: exp.Expression | None, schema: TableSchema) -> dict[str, Any]:
    if where is None:
        return {}
    where = where.this
    out: dict[str, Any] = {}
    for term in where.flatten() if isinstance(where, exp.And) else [where]:
        if not isinstance(term, exp.EQ) or not isinstance(term.this, exp.Column):
            raise errors.InvalidArgument(
                f"unsupported condition {term.sql()!r}: reads take column = literal AND ..."
            )
        column = schema.column(identifier(term.this, "column"))
        value = column_value(term.expression, column.type)
        out[column.name] = to_storage(column, value, table=schema.name)
    return out


def _limit(node: exp.Expression) -> int:
    value = literal_value(constant(node)[0])
    if type(value) is not int or value < 0:
        raise errors.InvalidArgument(f"LIMIT takes a whole number, got {node.sql()!r}")
    return value


async def _select(statement: exp.Select, manager: TransactionManager) -> SqlResult:
    for unsupported in ("joins", "group", "having", "order", "with", "offset"):
        if statement.args.get(unsupported):
            raise errors.InvalidArgument(
                f"unsupported in a read: {unsupported.upper()} (declare a view for aggregates)"
            )
    from_ = statement.args.get("from_")
    if from_ is None:
        raise errors.InvalidArgument("SELECT needs FROM a table")
    name = identifier(from_.this, "table")
    if manager.views is not None and name in manager.views.views:
        return await _select_view(statement, name, manager)
    schema = manager.catalog.table(name)
    columns = []
    for item in statement.expressions:
        if isinstance(item, exp.Star):
            columns.extend(schema.column_names)
        elif isinstance(item, exp.Column):
            columns.append(schema.column(identifier(item, "column")).name)
        else:
            raise errors.InvalidArgument(f"unsupported select item {item.sql()!r}")
    limit_node = statement.args.get("limit")
    limit = _limit(limit_node.expression) if limit_node is not None else 0
    wanted = _equalities(statement.args.get("where"), schema)
    prefix = []
    for name in schema.primary_key:
        if name not in wanted:
            break
        prefix.append(wanted[name])
    start = encode_key(schema.key_types[: len(prefix)], prefix) if prefix else b""
    stop = (prefix_end(start) or b"") if prefix else b""
    rows, ts = await manager.read_range(schema.table_id, start, stop)
    result = SqlResult(columns=columns, timestamp=ts)
    for _, data in rows:
        stored = decode_row(data) or {}
        if any(stored.get(c) != v for c, v in wanted.items()):
            continue
        row = cpb.Row()
        for name in columns:
            value = stored.get(name)
            column_type = schema.column(name).type
            row.columns[name].CopyFrom(
                to_value(None if value is None else from_storage(column_type, value))
            )
        result.rows.append(row)
        if limit and len(result.rows) >= limit:
            break
    result.message = f"{len(result.rows)} row(s) at timestamp {ts}"
    return result


async def _select_view(statement: exp.Select, name: str, manager: TransactionManager) -> SqlResult:
    """A view's rows from one snapshot (an async view's: as of its last refresh, the
    timestamp the result carries); a WHERE of equalities on leading GROUP BY columns is a
    lookup, any other equality filters."""
    assert manager.views is not None
    view = manager.views.views[name]
    output = list(view.plan.output)
    columns = []
    for item in statement.expressions:
        if isinstance(item, exp.Star):
            columns.extend(output)
        elif isinstance(item, exp.Column) and identifier(item, "column") in output:
            columns.append(identifier(item, "column"))
        else:
            raise errors.InvalidArgument(
                f"unsupported select item {item.sql()!r}: materialized view {name} has "
                f"{', '.join(output)}"
            )
    where: dict[str, Any] = {}
    condition = statement.args.get("where")
    for term in _terms(condition.this if condition is not None else None):
        if not isinstance(term, exp.EQ) or not isinstance(term.this, exp.Column):
            raise errors.InvalidArgument(
                f"unsupported condition {term.sql()!r}: view reads take column = literal AND ..."
            )
        where[identifier(term.this, "column")] = literal_value(constant(term.expression)[0])
    limit_node = statement.args.get("limit")
    limit = _limit(limit_node.expression) if limit_node is not None else 0
    rows, ts = await manager.views.read(name, where)
    result = SqlResult(columns=columns, timestamp=ts)
    for found in rows[:limit] if limit else rows:
        row = cpb.Row()
        for column in columns:
            row.columns[column].CopyFrom(to_value(found[column]))
        result.rows.append(row)
    result.message = f"{len(result.rows)} row(s) of {name} at timestamp {ts}"
    return result


def _terms(node: exp.Expression | None) -> list[exp.Expression]:
    if node is None:
        return []
    return list(node.flatten()) if isinstance(node, exp.And) else [node]
