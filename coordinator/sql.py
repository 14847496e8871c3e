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
from aggview.sqlscript import KINDS
from aggview.values import to_value
from aggview.wire import client_pb2 as cpb
from coordinator import adhoc
from coordinator.convert import check_sql_size
from coordinator.dml import is_write, run_writes
from coordinator.transactions import TransactionManager
from coordinator.view_query import Condition
from cumulus.aggregates import RULES, Kind
from cumulus.expressions import literal_value
from cumulus.sqltext import column_value, constant, identifier, parse_statements


@dataclass
class SqlResult:
    message: str = ""
    columns: list[str] = field(default_factory=list)
    rows: list[cpb.Row] = field(default_factory=list)
    timestamp: int = 0
    results: list[SqlResult] = field(default_factory=list)  # a read-only block's SELECTs
    tentative: bool = False  # a cumulus view's newest values, which may mix timestamps

    def reply(self) -> cpb.SqlReply:
        return cpb.SqlReply(
            message=self.message,
            columns=self.columns,
            rows=self.rows,
            timestamp=self.timestamp,
            results=[r.reply() for r in self.results],
            tentative=self.tentative,
        )


async def run_sql(
    sql: str, manager: TransactionManager, at: int = 0, *, tentative: bool = False
) -> SqlResult:
    """Runs one call's SQL; ``at``: a SELECT reads that held snapshot; ``tentative``: a
    SELECT of a cumulus view reads its newest values (every other read is exact anyway)."""
    check_sql_size(sql, manager.limits)
    if manager.views is not None:
        view_statement = manager.views.handles(sql)
        if view_statement is not None:
            return SqlResult(message=await manager.views.execute(view_statement))
    statements = parse_statements(sql)
    if read_only_block(statements):
        return await _read_only(statements[1:-1], manager, at)
    if at and not (len(statements) == 1 and isinstance(statements[0], exp.Select)):
        raise errors.InvalidArgument("as_of is for one SELECT: writes and DDL happen now")
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
        return await _select(statement, manager, at, tentative)
    said = statement.sql().split(maxsplit=2)[:2] if statement.key == "command" else []
    raise errors.InvalidArgument(
        f"unsupported SQL statement {' '.join(said) or statement.key.upper()}: the statements "
        f"are {KINDS} (help in aggview sql's shell shows their forms)"
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


def read_only_block(statements: list[exp.Expression]) -> bool:
    """``BEGIN READ ONLY; SELECT …; …; COMMIT;``: SELECTs at one timestamp."""
    return (
        len(statements) >= 2
        and isinstance(statements[0], exp.Transaction)
        and [str(m).upper() for m in statements[0].args.get("modes") or []] == ["READ ONLY"]
        and isinstance(statements[-1], exp.Commit | exp.Rollback)
        and all(isinstance(s, exp.Select) for s in statements[1:-1])
    )


async def _read_only(
    selects: list[exp.Expression], manager: TransactionManager, at: int
) -> SqlResult:
    """Every SELECT of a read-only block at one snapshot (held for the block)."""
    async with manager.snapshot(at) as ts:
        results = [await _select(s, manager, ts) for s in selects]  # type: ignore[arg-type]
    return SqlResult(
        message=f"READ ONLY: {len(results)} SELECT(s) at timestamp {ts}",
        timestamp=ts,
        results=results,
    )


def _simple(statement: exp.Select) -> bool:
    """A read of one table or view that the key-value path answers: columns, equalities,
    LIMIT (views also take their own slices, roll-ups and ORDER BY)."""
    if any(statement.args.get(k) for k in ("joins", "having", "with", "offset", "distinct")):
        return False
    from_ = statement.args["from_"].this
    if not isinstance(from_.this, exp.Identifier) or from_.args.get("db"):
        return False
    return True


def _key_value_read(statement: exp.Select) -> bool:
    """Columns of one table where columns equal literals: read from the LTMs directly."""
    if statement.args.get("group") or statement.args.get("order"):
        return False
    if not all(isinstance(i, exp.Star | exp.Column) for i in statement.expressions):
        return False
    where = _where(statement)
    return all(
        isinstance(t, exp.EQ) and isinstance(t.this, exp.Column) and _is_literal(t.expression)
        for t in _terms(where)
    )


def _is_literal(node: exp.Expression) -> bool:
    """Shaped like a constant (its type is checked later, with a clear error)."""
    if isinstance(node, exp.Paren | exp.Neg):
        return _is_literal(node.this)
    return isinstance(node, exp.Literal | exp.Boolean | exp.Cast | exp.Null)


async def _select_adhoc(statement: exp.Select, manager: TransactionManager, at: int) -> SqlResult:
    columns, rows, ts, note = await adhoc.run(statement, manager, at)
    result = SqlResult(columns=columns, timestamp=ts)
    for values in rows:
        row = cpb.Row()
        for name, value in zip(columns, values, strict=True):
            row.columns[name].CopyFrom(to_value(value))
        result.rows.append(row)
    result.message = f"{len(rows)} row(s) at timestamp {ts} ({note})"
    return result


def _limit(node: exp.Expression) -> int:
    value = literal_value(constant(node)[0])
    if type(value) is not int or value < 0:
        raise errors.InvalidArgument(f"LIMIT takes a whole number, got {node.sql()!r}")
    return value


async def _select(
    statement: exp.Select, manager: TransactionManager, at: int, tentative: bool = False
) -> SqlResult:
    from_ = statement.args.get("from_")
    if from_ is None:
        raise errors.InvalidArgument("SELECT needs FROM a table")
    if not isinstance(from_.this, exp.Table) or not _simple(statement):
        return await _select_adhoc(statement, manager, at)
    name = identifier(from_.this, "table")
    if manager.views is not None and name in manager.views.views:
        return await _select_view(statement, name, manager, at, tentative)
    if not _key_value_read(statement):
        return await _select_adhoc(statement, manager, at)
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
    rows, ts = await manager.read_range(schema.table_id, start, stop, at=at)
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


_SQL_FUNCTIONS = {
    exp.Sum: "SUM",
    exp.Count: "COUNT",
    exp.Min: "MIN",
    exp.Max: "MAX",
    exp.Avg: "AVG",
}
_RANGES = {exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">=", exp.NEQ: "!=", exp.EQ: "="}


async def _select_view(
    statement: exp.Select, name: str, manager: TransactionManager, at: int, tentative: bool
) -> SqlResult:
    """A query over a view's stored state (``coordinator.view_query``): WHERE slices and dices
    (=, IN, BETWEEN, comparisons, IS NULL, AND), GROUP BY fewer of its group columns rolls up
    (each aggregate column by its own aggregate: write it bare or as SUM/COUNT/MIN/MAX/AVG of
    itself, matching), ORDER BY and LIMIT order and cut. One snapshot; an async view's rows are
    those of its last refresh, the timestamp the result carries."""
    assert manager.views is not None
    view = manager.views.views[name]
    plan = view.plan
    kinds = {a.name: a.kind for a in plan.aggregates}
    groups = [g.name for g in plan.group_by]
    for unsupported in ("joins", "having", "with", "offset"):
        if statement.args.get(unsupported):
            raise errors.InvalidArgument(
                f"unsupported in a query of materialized view {name}: {unsupported.upper()}"
            )
    group_node = statement.args.get("group")
    keep = None
    if group_node is not None:  # GROUP BY (): everything in one row
        keep = [identifier(g, "column") for g in group_node.expressions if g != exp.Tuple()]
    elif any(isinstance(i.unalias(), exp.AggFunc) for i in statement.expressions):
        keep = []  # an aggregate without GROUP BY: everything rolled into one row
    columns: list[tuple[str, str]] = []  # (output name, view column)
    for item in statement.expressions:
        alias = item.alias if isinstance(item, exp.Alias) else ""
        node = item.this if isinstance(item, exp.Alias) else item
        if isinstance(node, exp.Star):
            columns.extend((c, c) for c in plan.output if keep is None or c in keep or c in kinds)
            continue
        column = _view_column(node, name, kinds, groups)
        if keep is not None and column in groups and column not in keep:
            raise errors.InvalidArgument(
                f"{column} is neither grouped by nor an aggregate: add it to GROUP BY"
            )
        columns.append((alias or (column if isinstance(node, exp.Column) else node.sql()), column))
    conditions = [_condition(t, name) for t in _terms(_where(statement))]
    rows, ts, tentative = await manager.views.query(name, conditions, keep, at, tentative)
    order = statement.args.get("order")
    if order is not None:
        named = dict(columns)  # ORDER BY names the result's columns, aliases included
        for ordered in reversed(order.expressions):
            if isinstance(ordered.this, exp.Column):
                column = identifier(ordered.this, "column")
                column = named.get(column, column)
            else:  # an aggregate, as in the select list: SUM(cost)
                column = _view_column(ordered.this, name, kinds, groups)
            if not rows or column not in rows[0]:
                if rows:
                    raise errors.InvalidArgument(f"cannot ORDER BY {column!r}: not in the result")
                continue
            rows.sort(
                key=lambda r, c=column: (r[c] is None, 0 if r[c] is None else r[c]),
                reverse=bool(ordered.args.get("desc")),
            )
    limit_node = statement.args.get("limit")
    limit = _limit(limit_node.expression) if limit_node is not None else 0
    result = SqlResult(columns=[out for out, _ in columns], timestamp=ts, tentative=tentative)
    for found in rows[:limit] if limit else rows:
        row = cpb.Row()
        for out, column in columns:
            row.columns[out].CopyFrom(to_value(found[column]))
        result.rows.append(row)
    result.message = f"{len(result.rows)} row(s) of {name} at timestamp {ts}" + (
        " (tentative: the newest values, which may mix timestamps)" if tentative else ""
    )
    return result


def _view_column(node: exp.Expression, name: str, kinds: dict[str, Kind], groups: list[str]) -> str:
    """The view column a select item reads: a column, or an aggregate of an aggregate column
    that rolls it up the way the view aggregates it."""
    if isinstance(node, exp.Column):
        column = identifier(node, "column")
        if column not in kinds and column not in groups:
            raise errors.UnknownColumn(f"materialized view {name} has no column {column!r}")
        return column
    function = next((f for t, f in _SQL_FUNCTIONS.items() if isinstance(node, t)), None)
    inner = node.this if function is not None else None
    if isinstance(inner, exp.Distinct) or not isinstance(inner, exp.Column):
        raise errors.InvalidArgument(
            f"unsupported select item {node.sql()!r}: a column of materialized view {name}, or "
            "SUM/COUNT/MIN/MAX/AVG of one of its aggregate columns"
        )
    column = identifier(inner, "column")
    kind = kinds.get(column)
    if kind is None:
        raise errors.InvalidArgument(
            f"{node.sql()}: {column!r} is not an aggregate column of materialized view {name} "
            f"(those are {', '.join(kinds)})"
        )
    allowed = _rolls_up_as(kind)
    if function not in allowed:
        how = " or ".join(sorted(allowed)) or f"{column} itself"
        raise errors.InvalidArgument(
            f"{node.sql()} cannot be derived: {column} is {kind.upper().replace('_', ' ')} per "
            f"group, so it rolls up as {how}"
        )
    return column


def _rolls_up_as(kind: Kind) -> set[str]:
    """The SQL functions that roll a view column of ``kind`` up to fewer groups: the one that
    combines its values (SUM for counts and sums), or AVG of an AVG (the query layer rolls up
    the state, ``coordinator.view_query``); COUNT(DISTINCT) is written bare."""
    rollup = RULES[kind].rollup
    if rollup is not None:
        return {rollup.name}
    return {kind.name} if kind is Kind.AVG else set()


def _where(statement: exp.Select) -> exp.Expression | None:
    where = statement.args.get("where")
    return where.this if where is not None else None


def _condition(term: exp.Expression, name: str) -> Condition:
    if isinstance(term, exp.Paren):
        return _condition(term.this, name)
    node = term.this
    if not isinstance(node, exp.Column):
        raise errors.InvalidArgument(
            f"unsupported condition {term.sql()!r} on materialized view {name}: column op "
            "literal, IN, BETWEEN or IS NULL, joined by AND"
        )
    column = identifier(node, "column")
    if isinstance(term, exp.Is) and isinstance(term.expression, exp.Null):
        return Condition(column, "is null")
    if isinstance(term, exp.In):
        return Condition(column, "in", [_literal(v) for v in term.expressions])
    if isinstance(term, exp.Between):
        return Condition(column, "between", _literal(term.args["low"]), _literal(term.args["high"]))
    op = _RANGES.get(type(term))
    if op is None:
        raise errors.InvalidArgument(
            f"unsupported condition {term.sql()!r} on materialized view {name}: column op "
            "literal, IN, BETWEEN or IS NULL, joined by AND"
        )
    return Condition(column, op, _literal(term.expression))


def _literal(node: exp.Expression) -> Any:
    return literal_value(constant(node)[0])


def _terms(node: exp.Expression | None) -> list[exp.Expression]:
    if node is None:
        return []
    return list(node.flatten()) if isinstance(node, exp.And) else [node]
