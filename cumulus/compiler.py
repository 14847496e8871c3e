"""The view compiler: materialized-view DDL -> statements, and a view's SELECT -> ``ViewPlan``.

Compilation is a sequence of small passes, each a function testable on its own (after sqlglot's
optimizer): ``parse_select`` -> ``check_supported`` -> ``resolve_tables`` -> ``expand_stars``
(``*`` and ``alias.*``) -> ``plan_where`` (resolve and type every column, split the conjunction
into join edges and filters) -> ``check_connected`` -> ``view_shape`` (aggregate, bag or
distinct) -> ``plan_group_by`` (a bag or SELECT DISTINCT: ``projected_groups``, every item) ->
``plan_select`` (aggregates and output names) -> ``plan_having`` (hidden aggregates). Anything
outside the supported subset is refused at CREATE with an ``InvalidArgument`` that names the
construct; type errors are ``TypeMismatch``.

Type rules (view maintenance, M3 and Spark must agree with them): arithmetic, SUM and AVG in
``cumulus.typerules``, every aggregate's result type in ``cumulus.aggregates``; and

- Literals: 12 is INT (DECIMAL(38,0) past 64 bits); 1.50 is DECIMAL(38,2); 1e3 is FLOAT; 'x' is
  TEXT, or DATE when compared with a DATE and in ISO form; DATE '2024-01-01' is DATE.
- Comparisons: numbers with numbers, otherwise the same kind only. Join edges need the same kind
  (and, for DECIMAL, the same scale), because index keys are encoded per type.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.tokens import Token, Tokenizer, TokenType

from aggview import errors
from aggview.schema import ColumnType, TableSchema
from cumulus.aggregates import RULES, Kind
from cumulus.plan import (
    HOSTS,
    MODES,
    SPECULATION,
    Aggregate,
    ColumnRef,
    Derived,
    Expr,
    GroupColumn,
    JoinEdge,
    TableRef,
    ViewPlan,
    expr_columns,
)
from cumulus.sqltext import (
    Typed,
    date_literal,
    identifier,
    literal,
    negated_literal,
    parse_sql,
    syntax_error,
)
from cumulus.typerules import (
    BOOL,
    DATE,
    NUMERIC,
    TEXT,
    arithmetic_type,
    common_type,
)

DEFAULT_ASYNC_INTERVAL_MS = 1000
DEFAULT_EPOCH_MS = 100  # a Cumulus view's epoch: how often its committed snapshot moves
DEFAULT_NODES = 2
MAX_NODES = 64
VIEW_OPTIONS = ("refresh", "interval_ms", "nodes", "epoch_ms", "mode", "host", "feed_ms")
CUMULUS_OPTIONS = ("nodes", "epoch_ms", "mode", "host", "feed_ms")
MIN_INTERVAL_MS = 10
MAX_INTERVAL_MS = 86_400_000
RESERVED_NAMES = frozenset({"_count"})  # the refresh operator's own column in every view row

# === DDL: CREATE / DROP / ALTER MATERIALIZED VIEW ===============================================


@dataclass(frozen=True)
class CreateView:
    name: str
    if_not_exists: bool
    mode: str
    interval_ms: int  # async: the refresh interval; cumulus: the epoch
    select_sql: str
    nodes: int = 0  # cumulus: DW nodes
    speculation: str = ""  # cumulus: speculative or conservative
    host: str = ""  # cumulus: where its DW nodes run (local, grpc or spark)
    feed_ms: int = 0  # cumulus: how often changes are fed between epochs (0: at epochs)


@dataclass(frozen=True)
class DropView:
    name: str
    if_exists: bool


@dataclass(frozen=True)
class AlterView:
    """New options for a live view: its mode (``refresh``) or its mode's own options, as
    checked values (``altered_plan`` applies them to the view's plan)."""

    name: str
    refresh: str = ""  # the new mode; empty: the view keeps its own
    interval_ms: int = 0
    nodes: int = 0
    epoch_ms: int = 0
    speculation: str = ""
    host: str = ""
    feed_ms: int = 0


ViewStatement = CreateView | DropView | AlterView

# Words that may sit between CREATE/DROP/ALTER and VIEW; only MATERIALIZED alone is supported.
_MODIFIERS = frozenset(
    {"OR", "REPLACE", "TEMP", "TEMPORARY", "MATERIALIZED", "RECURSIVE", "SECURE"}
)
_INTEGER = re.compile(r"-?[0-9]+")


class _Header:
    """A cursor over sqlglot's tokens of a DDL header: quoting, case and comments come for free."""

    def __init__(self, sql: str) -> None:
        try:
            self.tokens: list[Token] = Tokenizer().tokenize(sql)
        except sqlglot.errors.TokenError as exc:
            raise syntax_error(sql, exc) from None
        self.sql = sql
        self.pos = 0

    def word(self, offset: int = 0) -> str:
        """The upper-cased keyword at the cursor (+offset); '' for quoted text or the end."""
        index = self.pos + offset
        if index >= len(self.tokens):
            return ""
        token = self.tokens[index]
        if token.token_type in (TokenType.IDENTIFIER, TokenType.STRING):
            return ""
        return token.text.upper()

    def accept(self, *words: str) -> bool:
        if all(self.word(i) == w for i, w in enumerate(words)):
            self.pos += len(words)
            return True
        return False

    def expect(self, word: str, usage: str) -> Token:
        if self.word() != word:
            raise errors.InvalidArgument(f"expected {word} {self.at()}; usage: {usage}")
        self.pos += 1
        return self.tokens[self.pos - 1]

    def at(self) -> str:
        if self.pos >= len(self.tokens):
            return "at the end of the statement"
        return f"at {self.tokens[self.pos].text!r}"

    def name(self, usage: str) -> str:
        if self.pos >= len(self.tokens) or self.tokens[self.pos].token_type in (
            TokenType.STRING,
            TokenType.NUMBER,
        ):
            raise errors.InvalidArgument(f"expected a view name {self.at()}; usage: {usage}")
        token = self.tokens[self.pos]
        quoted = token.token_type == TokenType.IDENTIFIER
        if not quoted and token.text.upper() in ("AS", "WITH", "SET", "(", ";"):
            raise errors.InvalidArgument(f"expected a view name {self.at()}; usage: {usage}")
        self.pos += 1
        if self.word() == ".":
            raise errors.InvalidArgument("qualified view names (schema.view) are not supported")
        return identifier(exp.Identifier(this=token.text, quoted=quoted), "view")

    def end(self, usage: str) -> None:
        self.accept(";")
        if self.pos < len(self.tokens):
            raise errors.InvalidArgument(f"unexpected {self.at()[3:]}; usage: {usage}")

    def options(self, usage: str) -> list[tuple[str, str, str]]:
        """``( name = value, ... )`` as (lower-case name, value kind, value text)."""
        self.expect("(", usage)
        found: list[tuple[str, str, str]] = []
        while not self.accept(")"):
            if found:
                self.expect(",", usage)
            if self.pos >= len(self.tokens):
                raise errors.InvalidArgument(f"unclosed option list; usage: {usage}")
            key = self.tokens[self.pos].text.lower()
            self.pos += 1
            self.expect("=", usage)
            found.append((key, *self._value(key)))
        return found

    def _value(self, key: str) -> tuple[str, str]:
        sign = "-" if self.accept("-") else ""
        if self.pos >= len(self.tokens):
            raise errors.InvalidArgument(f"option {key} has no value")
        token = self.tokens[self.pos]
        self.pos += 1
        if token.token_type == TokenType.NUMBER:
            return "number", sign + token.text
        if not sign and token.token_type == TokenType.STRING:
            return "string", token.text
        if not sign and token.token_type in (TokenType.VAR, TokenType.IDENTIFIER):
            return "word", token.text
        raise errors.InvalidArgument(f"option {key} has an invalid value {sign}{token.text!r}")


def _interval(kind: str, text: str, key: str = "interval_ms") -> int:
    if kind != "number" or not _INTEGER.fullmatch(text) or int(text) <= 0:
        shown = repr(text) if kind == "string" else text
        raise errors.InvalidArgument(
            f"{key} must be a positive integer (milliseconds); got {shown}"
        )
    value = int(text)
    if not MIN_INTERVAL_MS <= value <= MAX_INTERVAL_MS:
        raise errors.InvalidArgument(
            f"{key} must be between {MIN_INTERVAL_MS} and {MAX_INTERVAL_MS}; got {value}"
        )
    return value


def _choice(key: str, kind: str, text: str, allowed: tuple[str, ...]) -> str:
    choice = text.lower()
    if kind == "number" or choice not in allowed:
        shown = ", ".join(f"'{a}'" for a in allowed[:-1]) + f" or '{allowed[-1]}'"
        raise errors.InvalidArgument(f"{key} must be {shown}; got {text!r}")
    return choice


def view_options(options: list[tuple[str, str, str]], allowed: tuple[str, ...]) -> dict[str, Any]:
    """Validate ``refresh`` / ``interval_ms``; every nonsense option is named in the error."""
    unknown = [key for key, _, _ in options if key not in allowed]
    if unknown:
        raise errors.InvalidArgument(
            f"unknown view option {', '.join(unknown)}; expected {' or '.join(allowed)}"
        )
    values: dict[str, Any] = {}
    for key, kind, text in options:
        if key in values:
            raise errors.InvalidArgument(f"view option {key} is given twice")
        if key in ("refresh", "mode", "host"):
            choices = {"refresh": MODES, "mode": SPECULATION, "host": HOSTS}[key]
            values[key] = _choice(key, kind, text, choices)
        elif key == "nodes":
            if kind != "number" or not _INTEGER.fullmatch(text) or not 1 <= int(text) <= MAX_NODES:
                raise errors.InvalidArgument(
                    f"nodes must be a whole number from 1 to {MAX_NODES}; got {text}"
                )
            values[key] = int(text)
        else:
            values[key] = _interval(kind, text, key)
    return values


def _create(header: _Header) -> CreateView:
    usage = (
        "CREATE MATERIALIZED VIEW name [WITH (refresh = 'sync'|'async', interval_ms = N)] "
        "| [WITH (refresh = 'cumulus', nodes = N, epoch_ms = M, mode = 'speculative'|"
        "'conservative', host = 'local'|'grpc'|'spark', feed_ms = F)] AS SELECT ..."
    )
    if_not_exists = header.accept("IF", "NOT", "EXISTS")
    name = header.name(usage)
    options = header.options(usage) if header.accept("WITH") else []
    values = view_options(options, VIEW_OPTIONS)
    as_token = header.expect("AS", usage)
    mode = values.get("refresh", "sync")
    if mode != "async" and "interval_ms" in values:
        raise errors.InvalidArgument(
            "interval_ms applies only to refresh = 'async' (a sync view is maintained by every "
            "writing transaction; a cumulus view's runtime commits every epoch_ms)"
        )
    misplaced = [k for k in CUMULUS_OPTIONS if k in values and mode != "cumulus"]
    if misplaced:
        raise errors.InvalidArgument(f"{', '.join(misplaced)} applies only to refresh = 'cumulus'")
    interval = {
        "sync": 0,
        "async": values.get("interval_ms", DEFAULT_ASYNC_INTERVAL_MS),
        "cumulus": values.get("epoch_ms", DEFAULT_EPOCH_MS),
    }[mode]
    select_sql = header.sql[as_token.end + 1 :].strip().rstrip(";").strip()
    if not select_sql:
        raise errors.InvalidArgument(f"CREATE MATERIALIZED VIEW {name} has no SELECT")
    if mode != "cumulus":
        return CreateView(name, if_not_exists, mode, interval, select_sql)
    nodes, speculation = values.get("nodes", DEFAULT_NODES), values.get("mode", "speculative")
    host, feed = values.get("host", "local"), values.get("feed_ms", 0)
    return CreateView(
        name, if_not_exists, mode, interval, select_sql, nodes, speculation, host, feed
    )


def _drop(header: _Header) -> DropView:
    usage = "DROP MATERIALIZED VIEW [IF EXISTS] name"
    if_exists = header.accept("IF", "EXISTS")
    name = header.name(usage)
    if header.word() == ",":
        raise errors.InvalidArgument("DROP MATERIALIZED VIEW drops one view at a time")
    header.end(usage)
    return DropView(name, if_exists)


ALTER_USAGE = (
    "ALTER MATERIALIZED VIEW name SET (refresh = 'sync'|'async'|'cumulus', interval_ms = N, "
    "nodes = N, epoch_ms = M, mode = 'speculative'|'conservative', host = 'local'|'grpc'|'spark', "
    "feed_ms = F)"
)


def _alter(header: _Header) -> AlterView:
    name = header.name(ALTER_USAGE)
    header.expect("SET", ALTER_USAGE)
    options = header.options(ALTER_USAGE)
    values = view_options(options, VIEW_OPTIONS)
    header.end(ALTER_USAGE)
    if not values:
        raise errors.InvalidArgument(f"nothing to alter; usage: {ALTER_USAGE}")
    return AlterView(
        name,
        refresh=values.get("refresh", ""),
        interval_ms=values.get("interval_ms", 0),
        nodes=values.get("nodes", 0),
        epoch_ms=values.get("epoch_ms", 0),
        speculation=values.get("mode", ""),
        host=values.get("host", ""),
        feed_ms=values.get("feed_ms", 0),
    )


def altered_plan(plan: ViewPlan, alter: AlterView) -> ViewPlan:
    """``plan`` under ``alter``'s options: a new mode takes its defaults for what is not given;
    an option of another mode than the one the view ends in is an error naming it."""
    mode = alter.refresh or plan.mode
    if alter.interval_ms and mode != "async":
        raise errors.InvalidArgument(
            f"interval_ms applies only to refresh = 'async'; materialized view {plan.name} "
            f"would be {mode}"
        )
    misplaced = [
        option
        for option, value in (
            ("nodes", alter.nodes),
            ("epoch_ms", alter.epoch_ms),
            ("mode", alter.speculation),
            ("host", alter.host),
            ("feed_ms", alter.feed_ms),
        )
        if value and mode != "cumulus"
    ]
    if misplaced:
        raise errors.InvalidArgument(
            f"{', '.join(misplaced)} applies only to refresh = 'cumulus'; materialized view "
            f"{plan.name} would be {mode}"
        )
    same = mode == plan.mode
    if mode == "sync":
        return replace(plan, mode=mode, interval_ms=0, nodes=0, speculation="", host="", feed_ms=0)
    if mode == "async":
        interval = alter.interval_ms or (plan.interval_ms if same else DEFAULT_ASYNC_INTERVAL_MS)
        return replace(
            plan, mode=mode, interval_ms=interval, nodes=0, speculation="", host="", feed_ms=0
        )
    return replace(
        plan,
        mode=mode,
        interval_ms=alter.epoch_ms or (plan.interval_ms if same else DEFAULT_EPOCH_MS),
        nodes=alter.nodes or (plan.nodes if same else DEFAULT_NODES),
        speculation=alter.speculation or (plan.speculation if same else "speculative"),
        host=alter.host or (plan.host if same else "local"),
        feed_ms=alter.feed_ms or (plan.feed_ms if same else 0),
    )


def parse_view_statement(sql: str) -> ViewStatement | None:
    """Recognise materialized-view DDL; None for any other statement (left to its own parser)."""
    header = _Header(sql)
    verb = header.word()
    if verb not in ("CREATE", "DROP", "ALTER"):
        return None
    modifiers: list[str] = []
    while header.word(1 + len(modifiers)) in _MODIFIERS:
        modifiers.append(header.word(1 + len(modifiers)))
    if header.word(1 + len(modifiers)) != "VIEW":
        return None
    if modifiers != ["MATERIALIZED"]:
        shown = " ".join([verb, *modifiers, "VIEW"])
        if "MATERIALIZED" not in modifiers:
            raise errors.InvalidArgument(
                f"{shown}: plain views are not supported; use {verb} MATERIALIZED VIEW"
            )
        raise errors.InvalidArgument(f"{shown} is not supported; use {verb} MATERIALIZED VIEW")
    header.pos += 3
    return {"CREATE": _create, "DROP": _drop, "ALTER": _alter}[verb](header)


# === pass 1-2: parse the SELECT, refuse what a view cannot maintain ===========================

AGGREGATES: tuple[type[exp.Expression], ...] = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)
_COMPARISONS: dict[type[exp.Expression], str] = {
    exp.EQ: "=",
    exp.NEQ: "<>",
    exp.LT: "<",
    exp.LTE: "<=",
    exp.GT: ">",
    exp.GTE: ">=",
}
_ARITHMETIC: dict[type[exp.Expression], str] = {
    exp.Add: "+",
    exp.Sub: "-",
    exp.Mul: "*",
    exp.Div: "/",
}
_ALLOWED = (
    exp.Select, exp.From, exp.Join, exp.Table, exp.TableAlias, exp.Identifier, exp.Column,
    exp.Alias, exp.Where, exp.Group, exp.Having, exp.Literal, exp.Boolean, exp.Neg, exp.Paren,
    exp.Not, exp.And, exp.In, exp.Between, exp.Distinct, exp.Cast, exp.DataType, exp.Null,
    exp.Or, exp.Case, exp.If, exp.Coalesce, exp.Like, exp.Is,
    *_COMPARISONS, *_ARITHMETIC, *AGGREGATES,
)  # fmt: skip
_SELECT_CLAUSES = frozenset(
    {"expressions", "from_", "joins", "where", "group", "having", "distinct"}
)
_CLAUSE_NAMES = {
    "with_": "WITH (common table expressions)",
    "order": "ORDER BY",
    "limit": "LIMIT",
    "offset": "OFFSET",
    "qualify": "QUALIFY",
    "windows": "WINDOW",
    "laterals": "LATERAL",
}
_NAMED_NODES: dict[type[exp.Expression], str] = {
    exp.Subquery: "subquery",
    exp.Exists: "EXISTS subquery",
    exp.Window: "window function",
    exp.Star: "SELECT *",
    exp.ILike: "ILIKE (LIKE is supported)",
    exp.Escape: "LIKE ... ESCAPE",
    exp.Mod: "operator %",
    exp.DPipe: "operator ||",
    exp.Filter: "aggregate FILTER",
    exp.Lateral: "LATERAL",
    exp.Union: "UNION",
    exp.Intersect: "INTERSECT",
    exp.Except: "EXCEPT",
    exp.Xor: "XOR",
}


def _refuse(construct: str, node: exp.Expression | None = None) -> errors.InvalidArgument:
    where = f": {node.sql()}" if node is not None else ""
    return errors.InvalidArgument(f"{construct} is not supported in a materialized view{where}")


def parse_select(select_sql: str) -> exp.Select:
    statement = parse_sql(select_sql)
    if isinstance(statement, exp.SetOperation):
        raise _refuse(statement.key.upper())
    if not isinstance(statement, exp.Select):
        raise errors.InvalidArgument(f"a materialized view needs a SELECT, not {statement.key}")
    return statement


def _unsupported_node(node: exp.Expression) -> errors.InvalidArgument:
    for kind, name in _NAMED_NODES.items():
        if isinstance(node, kind):
            if isinstance(node, exp.Star) and isinstance(node.parent, exp.Column):
                name = f"SELECT {node.parent.sql()}"
            return _refuse(name, None if isinstance(node, exp.Star) else node)
    if isinstance(node, exp.Select):
        return _refuse("subquery", node)
    if isinstance(node, exp.Func):
        name = node.name if isinstance(node, exp.Anonymous) else node.sql_name()
        return errors.InvalidArgument(f"unsupported function {name.upper()} in {node.sql()}")
    return _refuse(node.key.upper(), node)


def _check_join(join: exp.Join) -> None:
    side, kind = join.side.upper(), join.kind.upper()
    if side:
        raise _refuse(f"{side} OUTER JOIN (only inner joins)")
    if kind == "CROSS":
        raise _refuse("CROSS JOIN (a cross product)")
    if kind not in ("", "INNER"):
        raise _refuse(f"{kind} JOIN")
    if join.method:
        raise _refuse(f"{join.method.upper()} JOIN")
    if join.args.get("using"):
        raise _refuse("JOIN ... USING (write ON a.x = b.x)")


def check_supported(select: exp.Select) -> None:
    """Refuse, naming it, every construct outside the supported subset, before any resolution."""
    for key, value in select.args.items():
        if value and key not in _SELECT_CLAUSES:
            raise _refuse(_CLAUSE_NAMES.get(key, key.upper()))
    if not select.args.get("from_"):
        raise errors.InvalidArgument("a materialized view needs a FROM clause")
    distinct = select.args.get("distinct")
    if distinct is not None and distinct.args.get("on") is not None:
        raise _refuse("SELECT DISTINCT ON")
    for node in select.walk():
        if isinstance(node, exp.Join):
            _check_join(node)
        elif isinstance(node, exp.Star) and (
            isinstance(node.parent, exp.Count) or _star_item(node) is not None
        ):
            continue
        elif isinstance(node, exp.Select) and node is not select:
            raise _unsupported_node(node)
        elif not isinstance(node, _ALLOWED):
            raise _unsupported_node(node)
        elif isinstance(node, exp.Cast) and not (
            node.to.is_type(exp.DataType.Type.DATE)
            and isinstance(node.this, exp.Literal)
            and node.this.is_string
        ):
            raise _refuse("CAST (only DATE 'YYYY-MM-DD' literals)", node)
        elif isinstance(node, AGGREGATES):
            _check_aggregate(node)
        elif isinstance(node, exp.Between) and node.args.get("symmetric"):
            raise _refuse("BETWEEN SYMMETRIC")
        elif isinstance(node, exp.In) and not node.expressions and not node.args.get("query"):
            raise _refuse("IN without a list of values", node)
    group = select.args.get("group")
    if group is not None:
        extra = [k for k, v in group.args.items() if v and k != "expressions"]
        if extra:
            raise _refuse(f"GROUP BY {extra[0].upper().replace('_', ' ')}")


def _star_item(node: exp.Star) -> exp.Expression | None:
    """The SELECT item a ``*`` is (``*`` or ``alias.*``), or None where it is anything else."""
    item = node.parent if isinstance(node.parent, exp.Column) else node
    return item if isinstance(item.parent, exp.Select) and item.arg_key == "expressions" else None


def _check_aggregate(node: exp.Expression) -> None:
    outer = node.find_ancestor(*AGGREGATES)
    if outer is not None:
        raise errors.InvalidArgument(f"aggregate nested in an aggregate: {outer.sql()}")
    clause = node.find_ancestor(exp.Where, exp.Join, exp.Group)
    if clause is not None:
        where = {"where": "WHERE", "join": "JOIN ... ON", "group": "GROUP BY"}[clause.key]
        raise errors.InvalidArgument(
            f"aggregate {node.sql()} in {where} is not allowed (use HAVING for conditions)"
        )
    arg = node.this
    if arg is None:
        raise errors.InvalidArgument(f"{node.sql()} needs an argument")
    if isinstance(arg, exp.Distinct):
        if len(arg.expressions) != 1:
            raise _refuse(f"{node.key.upper()}(DISTINCT with several arguments)", node)
        if isinstance(node, exp.Sum | exp.Avg):
            raise _refuse(f"{node.key.upper()}(DISTINCT ...)", node)


# === pass 3: tables and aliases ================================================================


@dataclass(frozen=True)
class Scope:
    """The aliases a clause can see, in FROM order, with their schemas."""

    tables: dict[str, TableSchema]

    def resolve(self, column: exp.Column) -> tuple[ColumnRef, ColumnType]:
        if column.args.get("db") or column.args.get("catalog"):
            raise _refuse("a column qualified by schema", column)
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
        if len(matches) > 1:
            raise errors.InvalidArgument(
                f"column {name} is ambiguous: {', '.join(f'{a}.{name}' for a in matches)}"
            )
        return ColumnRef(matches[0], name), self.tables[matches[0]].column(name).type


def _table_ref(
    node: exp.Expression, table: Callable[[str], TableSchema]
) -> tuple[TableRef, TableSchema]:
    if not isinstance(node, exp.Table):
        raise _unsupported_node(node)
    if node.args.get("db") or node.args.get("catalog"):
        raise _refuse("a table qualified by schema", node)
    name = identifier(node.this, "table")
    alias_node = node.args.get("alias")
    if alias_node is not None and alias_node.args.get("columns"):
        raise _refuse("column aliases on a table", node)
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
    ons: list[tuple[exp.Expression, Scope]] = []
    items = [select.args["from_"].this, *(j.this for j in select.args.get("joins") or [])]
    joins = [None, *(select.args.get("joins") or [])]
    for item, join in zip(items, joins, strict=True):
        ref, schema = _table_ref(item, table)
        if ref.alias in scope:
            raise errors.InvalidArgument(
                f"table alias {ref.alias} is used twice; give each occurrence its own alias"
            )
        refs.append(ref)
        scope[ref.alias] = schema
        if join is not None and join.args.get("on") is not None:
            ons.append((join.args["on"], Scope(dict(scope))))
    return tuple(refs), Scope(scope), ons


# === pass 4: resolve and type expressions ======================================================

ColumnHook = Callable[[exp.Column], Typed]
AggregateHook = Callable[[exp.Expression], Typed]


def _no_aggregates(node: exp.Expression) -> Typed:
    raise errors.InvalidArgument(f"aggregate {node.sql()} is not allowed here")


def typed(node: exp.Expression, column: ColumnHook, aggregate: AggregateHook) -> Typed:
    """Resolve and type a value expression; columns and aggregates go through the hooks."""
    if isinstance(node, exp.Paren):
        return typed(node.this, column, aggregate)
    if isinstance(node, exp.Column):
        return column(node)
    if isinstance(node, exp.Literal | exp.Boolean | exp.Cast | exp.Null):
        return literal(node)
    if isinstance(node, AGGREGATES):
        return aggregate(node)
    if isinstance(node, exp.Case | exp.If):
        return _case(node, column, aggregate)
    if isinstance(node, exp.Coalesce):
        args = [_or_null(a, column, aggregate) for a in [node.this, *node.expressions]]
        type_ = _result_type("COALESCE", [t for _, t in args], node)
        return {"coalesce": [e for e, _ in args], "type": str(type_)}, type_
    if isinstance(node, exp.Neg):
        inner, type_ = typed(node.this, column, aggregate)
        if type_.kind not in NUMERIC:
            raise errors.TypeMismatch(f"unary minus on {type_}: {node.sql()}")
        if "lit" in inner:
            return negated_literal(inner, type_), type_
        return {"neg": inner}, type_
    op = _ARITHMETIC.get(type(node))
    if op is not None:
        left, lt = typed(node.this, column, aggregate)
        right, rt = typed(node.expression, column, aggregate)
        return {"op": op, "args": [left, right]}, arithmetic_type(op, lt, rt, node)
    if isinstance(node, _CONDITIONS):
        raise errors.InvalidArgument(f"a condition cannot be used as a value: {node.sql()}")
    raise _unsupported_node(node)


_CONDITIONS = (*_COMPARISONS, exp.In, exp.Between, exp.Not, exp.And, exp.Or, exp.Like, exp.Is)


def _or_null(
    node: exp.Expression, column: ColumnHook, aggregate: AggregateHook
) -> tuple[Expr, ColumnType | None]:
    """A CASE result or COALESCE argument: a value, or NULL (no type of its own)."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Null):
        return {"null": True}, None
    return typed(node, column, aggregate)


def _result_type(what: str, types: list[ColumnType | None], node: exp.Expression) -> ColumnType:
    known = [t for t in types if t is not None]
    if not known:
        raise errors.InvalidArgument(f"{what} whose every result is NULL: {node.sql()}")
    return common_type(known, node)


def _case(node: exp.Case | exp.If, column: ColumnHook, aggregate: AggregateHook) -> Typed:
    """CASE [x] WHEN ... THEN ... [ELSE ...] END, or IF(c, a, b): branches in order."""
    if isinstance(node, exp.If):
        ifs, default, operand = [node], node.args.get("false"), None
    else:
        ifs, default, operand = node.args.get("ifs") or [], node.args.get("default"), node.this
    whens: list[Expr] = []
    results: list[tuple[Expr, ColumnType | None]] = []
    for branch in ifs:
        condition = branch.this
        if operand is not None:  # CASE x WHEN v: x = v
            condition = exp.EQ(this=operand.copy(), expression=condition.copy())
        whens.append(predicate(condition, column, aggregate))
        results.append(_or_null(branch.args["true"], column, aggregate))
    otherwise = _or_null(default, column, aggregate) if default is not None else None
    types = [t for _, t in results] + ([otherwise[1]] if otherwise is not None else [])
    type_ = _result_type("CASE", types, node)
    case: Expr = {"case": [[w, r] for w, (r, _) in zip(whens, results, strict=True)]}
    if otherwise is not None and "null" not in otherwise[0]:
        case["else"] = otherwise[0]
    case["type"] = str(type_)
    return case, type_


def comparable(left: Typed, right: Typed, node: exp.Expression) -> tuple[Expr, Expr]:
    """Check two sides can be compared, reading a TEXT literal as a DATE opposite a DATE."""
    (lj, lt), (rj, rt) = left, right
    if lt == DATE and rt == TEXT and "lit" in rj:
        rj, rt = date_literal(rj["lit"], node), DATE
    elif rt == DATE and lt == TEXT and "lit" in lj:
        lj, lt = date_literal(lj["lit"], node), DATE
    if lt.kind != rt.kind and not (lt.kind in NUMERIC and rt.kind in NUMERIC):
        raise errors.TypeMismatch(f"cannot compare {lt} with {rt}: {node.sql()}")
    return lj, rj


def predicate(node: exp.Expression, column: ColumnHook, aggregate: AggregateHook) -> Expr:
    """Resolve and type one condition (no AND/OR: conjunctions are split before)."""
    if isinstance(node, exp.Paren):
        return predicate(node.this, column, aggregate)
    op = _COMPARISONS.get(type(node))
    if op is not None:
        left = typed(node.this, column, aggregate)
        right = typed(node.expression, column, aggregate)
        return {"cmp": op, "args": list(comparable(left, right, node))}
    if isinstance(node, exp.In):
        subject = typed(node.this, column, aggregate)
        values: list[Expr] = []
        for item in node.expressions:
            while isinstance(item, exp.Paren):
                item = item.this
            if isinstance(item, exp.Null):  # x IN (1, NULL): TRUE or NULL, never FALSE
                values.append({"null": True})
            else:
                subject_expr, value = comparable(subject, typed(item, column, aggregate), node)
                subject = subject_expr, subject[1]
                values.append(value)
        return {"in": subject[0], "values": values}
    if isinstance(node, exp.Between):
        subject = typed(node.this, column, aggregate)
        low = comparable(subject, typed(node.args["low"], column, aggregate), node)
        high = comparable(subject, typed(node.args["high"], column, aggregate), node)
        return {"between": low[0], "low": low[1], "high": high[1]}
    if isinstance(node, exp.Not):
        inner = predicate(node.this, column, aggregate)
        return inner["not"] if "not" in inner else {"not": inner}  # NOT NOT p is p, NULL too
    if isinstance(node, exp.And):
        return {"and": [predicate(t, column, aggregate) for t in conjuncts(node)]}
    if isinstance(node, exp.Or):
        return {"or": [predicate(t, column, aggregate) for t in disjuncts(node)]}
    if isinstance(node, exp.Like):
        return _like(node, column, aggregate)
    if isinstance(node, exp.Is):
        if not isinstance(node.expression, exp.Null):
            raise _refuse("IS other than IS [NOT] NULL", node)
        value, _ = typed(node.this, column, aggregate)
        return {"not": {"notnull": value}}
    value, type_ = typed(node, column, aggregate)
    if type_ != BOOL:
        raise errors.TypeMismatch(f"condition {node.sql()} is {type_}, not BOOL")
    return {"cmp": "=", "args": [value, {"lit": True, "type": "BOOL"}]}


def _like(node: exp.Like, column: ColumnHook, aggregate: AggregateHook) -> Expr:
    value, type_ = typed(node.this, column, aggregate)
    if type_ != TEXT:
        raise errors.TypeMismatch(f"LIKE on {type_}, not TEXT: {node.sql()}")
    pattern = node.expression
    while isinstance(pattern, exp.Paren):
        pattern = pattern.this
    if not (isinstance(pattern, exp.Literal) and pattern.is_string):
        raise _refuse("LIKE with a pattern that is not a constant string", node)
    if "\\" in pattern.this:
        raise _refuse(
            "a backslash in a LIKE pattern (an escape in PostgreSQL, a plain character in duckdb)",
            node,
        )
    like = {"like": value, "pattern": pattern.this}
    return {"not": like} if node.args.get("negate") else like  # sqlglot's NOT LIKE


def disjuncts(node: exp.Expression) -> Iterator[exp.Expression]:
    """The terms of an OR chain, through parentheses."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Or):
        yield from disjuncts(node.this)
        yield from disjuncts(node.expression)
    else:
        yield node


def conjuncts(node: exp.Expression | None) -> Iterator[exp.Expression]:
    """The terms of an AND chain, through parentheses."""
    while isinstance(node, exp.Paren):
        node = node.this
    if node is None:
        return
    if isinstance(node, exp.And):
        yield from conjuncts(node.this)
        yield from conjuncts(node.expression)
    else:
        yield node


# === pass 5-6: join edges, filters, connectivity ===============================================


def _edge(pred: Expr, scope: Scope, node: exp.Expression) -> JoinEdge | None:
    """An equality of two bare columns of different aliases is a join edge; else None."""
    if pred.get("cmp") != "=" or not all("col" in a for a in pred["args"]):
        return None
    left, right = (ColumnRef(*a["col"]) for a in pred["args"])
    if left.alias == right.alias:
        return None
    lt = scope.tables[left.alias].column(left.column).type
    rt = scope.tables[right.alias].column(right.column).type
    if lt.kind != rt.kind or lt.scale != rt.scale:
        raise errors.TypeMismatch(
            f"join condition {node.sql()} compares {lt} with {rt}; join columns must have the "
            "same type (index keys are encoded per type)"
        )
    return JoinEdge(left, right)


def plan_where(
    select: exp.Select, scope: Scope, ons: list[tuple[exp.Expression, Scope]]
) -> tuple[tuple[JoinEdge, ...], tuple[Expr, ...]]:
    """ON and WHERE conjunctions -> join edges (deduplicated) and the remaining filters."""
    terms = [(term, on_scope, True) for on, on_scope in ons for term in conjuncts(on)]
    terms += [
        (t, scope, False) for t in conjuncts(select.args.get("where") and select.args["where"].this)
    ]
    edges: dict[frozenset[ColumnRef], JoinEdge] = {}
    filters: list[Expr] = []
    for term, term_scope, in_on in terms:
        pred = predicate(term, lambda c, s=term_scope: _column(c, s), _no_aggregates)
        edge = _edge(pred, scope, term)
        if edge is not None:
            edges.setdefault(frozenset((edge.left, edge.right)), edge)
            continue
        aliases = {ref.alias for ref in _refs(pred)}
        if in_on and len(aliases) > 1:
            raise errors.InvalidArgument(
                f"join condition {term.sql()} is not an equality of columns: JOIN ... ON takes "
                "a.x = b.y (other conditions between tables belong in WHERE)"
            )
        filters.append(pred)
    return tuple(edges.values()), tuple(filters)


def _column(node: exp.Column, scope: Scope) -> Typed:
    ref, type_ = scope.resolve(node)
    return {"col": ref.to_json()}, type_


def _refs(tree: object) -> Iterator[ColumnRef]:
    for alias, column in expr_columns(tree):
        yield ColumnRef(alias, column)


def check_connected(tables: tuple[TableRef, ...], edges: tuple[JoinEdge, ...]) -> None:
    """Every alias must be reachable through join edges: a cross product is refused."""
    parent = {t.alias: t.alias for t in tables}

    def root(alias: str) -> str:
        while parent[alias] != alias:
            parent[alias] = parent[parent[alias]]
            alias = parent[alias]
        return alias

    for edge in edges:
        parent[root(edge.left.alias)] = root(edge.right.alias)
    groups: dict[str, list[str]] = {}
    for t in tables:
        groups.setdefault(root(t.alias), []).append(t.alias)
    if len(groups) > 1:
        parts = " | ".join(", ".join(g) for g in groups.values())
        raise errors.InvalidArgument(
            f"cross product is not supported: no equality joins the tables {parts} "
            "(add a join condition a.x = b.y)"
        )


# === pass 6b: SELECT * and the view's shape =====================================================


def expand_stars(select: exp.Select, tables: tuple[TableRef, ...], scope: Scope) -> exp.Select:
    """``*`` and ``alias.*`` -> the columns, in FROM and table order. A column name that two of
    the expanded aliases have (a join's key, a self-join) is qualified: ``alias_column``."""
    stars = [i for i in select.expressions if isinstance(i, exp.Star) or _is_alias_star(i)]
    if not stars:
        return select
    if select.find(*AGGREGATES) is not None or select.args.get("group") is not None:
        shown = stars[0].sql()
        raise errors.InvalidArgument(
            f"SELECT {shown} is not supported in a view with GROUP BY or aggregates; name the "
            "columns (SELECT * is for views without aggregates)"
        )
    expanded: list[list[str]] = []  # per item: the aliases it expands to
    for item in select.expressions:
        if isinstance(item, exp.Star):
            expanded.append([t.alias for t in tables])
        elif _is_alias_star(item):
            alias = identifier(item.args["table"], "table alias")
            if alias not in scope.tables:
                raise errors.UnknownColumn(
                    f"unknown table alias {alias!r} in {item.sql()} "
                    f"(tables in scope: {', '.join(scope.tables)})"
                )
            expanded.append([alias])
        else:
            expanded.append([])
    seen: dict[str, set[str]] = {}
    for aliases in expanded:
        for alias in aliases:
            for column in scope.tables[alias].columns:
                seen.setdefault(column.name, set()).add(alias)
    items: list[exp.Expression] = []
    for item, aliases in zip(select.expressions, expanded, strict=True):
        if not aliases:
            items.append(item.copy())
            continue
        for alias in aliases:
            for column in scope.tables[alias].columns:
                node: exp.Expression = exp.Column(
                    this=exp.Identifier(this=column.name, quoted=True),
                    table=exp.Identifier(this=alias, quoted=True),
                )
                if len(seen[column.name]) > 1:
                    qualified = exp.Identifier(this=f"{alias}_{column.name}", quoted=True)
                    node = exp.Alias(this=node, alias=qualified)
                items.append(node)
    out = select.copy()
    out.set("expressions", items)
    return out


def _is_alias_star(item: exp.Expression) -> bool:
    return isinstance(item, exp.Column) and isinstance(item.this, exp.Star)


def view_shape(select: exp.Select) -> str:
    """``aggregate`` (aggregates: one row per group), ``distinct`` (SELECT DISTINCT, or GROUP BY
    without aggregates: one row per group) or ``bag`` (neither: each row as often as the join
    gives it). See ``cumulus.plan``."""
    if select.find(*AGGREGATES) is not None:
        return "aggregate"
    if select.args.get("having") is not None:
        raise errors.InvalidArgument(
            "HAVING without an aggregate is not supported in a materialized view (write the "
            "condition in WHERE)"
        )
    if select.args.get("distinct") is not None or select.args.get("group") is not None:
        return "distinct"
    return "bag"


def projected_groups(select: exp.Select, scope: Scope) -> list[_Group]:
    """A view without aggregates or GROUP BY is grouped by every SELECT item (its rows are
    the groups, counted); an item given twice is refused, naming it."""
    found: dict[str, _Group] = {}
    for _, node in _select_items(select):
        item = _group_item(node, scope, [])
        if item.key in found:
            shown = str(item.ref) if item.ref is not None else node.sql()
            raise errors.InvalidArgument(
                f"{shown} appears twice in the SELECT of a view without aggregates; select it once"
            )
        found[item.key] = item
    return list(found.values())


# === pass 7: GROUP BY ==========================================================================


def _select_items(select: exp.Select) -> list[tuple[str | None, exp.Expression]]:
    items = []
    for item in select.expressions:
        if isinstance(item, exp.Alias):
            items.append((identifier(item.args["alias"], "output"), item.this))
        else:
            items.append((None, item))
    return items


@dataclass(frozen=True)
class _Group:
    """A GROUP BY item: a column (``ref``) or an expression of the row; ``key`` tells repeats."""

    key: str
    ref: ColumnRef | None
    expr: Expr
    type: ColumnType


def _group(expr: Expr, type_: ColumnType) -> _Group:
    if "col" in expr:
        ref = ColumnRef(*expr["col"])
        return _Group(json.dumps(expr), ref, expr, type_)
    return _Group(json.dumps(expr, sort_keys=True), None, expr, type_)


def plan_group_by(select: exp.Select, scope: Scope) -> list[_Group]:
    """GROUP BY items, in order, without repeats: columns or expressions of the row, by
    themselves, output alias or position."""
    items = _select_items(select)
    found: dict[str, _Group] = {}
    group = select.args.get("group")
    for node in group.expressions if group is not None else []:
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit():
            position = int(node.this)
            if not 1 <= position <= len(items):
                raise errors.InvalidArgument(f"GROUP BY position {position} is not in the SELECT")
            node = items[position - 1][1]
            if isinstance(node, AGGREGATES) or node.find(*AGGREGATES):
                raise errors.InvalidArgument(f"GROUP BY position {position} refers to an aggregate")
        item = _group_item(node, scope, items)
        found.setdefault(item.key, item)
    return list(found.values())


def _group_item(
    node: exp.Expression, scope: Scope, items: list[tuple[str | None, exp.Expression]]
) -> _Group:
    """An input column first (as SQL does), else a SELECT alias; or an expression."""
    while isinstance(node, exp.Paren):
        node = node.this
    if not isinstance(node, exp.Column):
        return _group(*typed(node, lambda c: _column(c, scope), _no_aggregates))
    try:
        return _group(*_column(node, scope))
    except errors.UnknownColumn:
        if node.args.get("table") is None:
            name = identifier(node.this, "column")
            for alias, item in items:
                if alias == name and not (isinstance(item, exp.Column) and item is node):
                    if item.find(*AGGREGATES):
                        raise errors.InvalidArgument(
                            f"GROUP BY {name} refers to an aggregate: {item.sql()}"
                        ) from None
                    return _group_item(item, scope, items)
        raise


# === pass 8-9: SELECT list, aggregates, HAVING =================================================


@dataclass
class _AggregateSpec:
    kind: Kind
    arg: Expr | None
    arg_type: ColumnType | None
    base_name: str

    def key(self) -> str:
        return json.dumps([self.kind, self.arg], sort_keys=True)


def aggregate_spec(node: exp.Expression, scope: Scope) -> _AggregateSpec:
    """COUNT/SUM/AVG/MIN/MAX -> kind, typed argument and a default output name."""
    kind = Kind(node.key)
    arg_node = node.this
    if isinstance(arg_node, exp.Distinct):
        arg_node = arg_node.expressions[0]
        kind = Kind.COUNT_DISTINCT if kind is Kind.COUNT else kind
    if kind is Kind.COUNT and (
        isinstance(arg_node, exp.Star)
        or (isinstance(arg_node, exp.Literal | exp.Boolean) and not isinstance(arg_node, exp.Null))
    ):
        return _AggregateSpec(Kind.COUNT_STAR, None, None, "count")
    arg, arg_type = typed(arg_node, lambda c: _column(c, scope), _no_aggregates)
    if RULES[kind].numeric and arg_type.kind not in NUMERIC:
        what = (
            f"column {ColumnRef(*arg['col'])}" if "col" in arg else f"expression {arg_node.sql()}"
        )
        raise errors.TypeMismatch(f"{kind.name} over {arg_type} {what}")
    base = f"{kind.value}_{arg['col'][1]}" if "col" in arg else kind.value
    return _AggregateSpec(kind, arg, arg_type, base)


class _Names:
    """Output names: explicit aliases first, then derived names deduplicated with _2, _3, ..."""

    def __init__(self, explicit: list[str]) -> None:
        self.taken: set[str] = set(RESERVED_NAMES)
        for name in explicit:
            if name.startswith("_"):
                raise errors.InvalidArgument(
                    f"output name {name}: names starting with _ are reserved for the view's "
                    "hidden columns"
                )
            if name in self.taken:
                raise errors.InvalidArgument(f"output name {name} is used twice")
            self.taken.add(name)

    def derive(self, base: str) -> str:
        name, n = base, 1
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name

    def hidden(self, prefix: str = "_having") -> str:
        n = 0
        while f"{prefix}{n}" in self.taken:
            n += 1
        self.taken.add(f"{prefix}{n}")
        return f"{prefix}{n}"


def plan_select(
    select: exp.Select, scope: Scope, groups: list[_Group]
) -> tuple[
    list[GroupColumn],
    list[tuple[Aggregate, str]],
    list[str],
    _Names,
    list[tuple[str, exp.Expression]],
]:
    """SELECT items -> named group columns, aggregates (with identity keys), output order and
    the items left to ``plan_derived`` (expressions over aggregates), named."""
    items = _select_items(select)
    names = _Names([alias for alias, _ in items if alias is not None])
    by_key = {g.key: g for g in groups}
    group_names: dict[str, str] = {}
    aggregates: list[tuple[Aggregate, str]] = []
    output: list[str] = []
    pending: list[tuple[str, exp.Expression]] = []
    for alias, node in items:
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, AGGREGATES):
            spec = aggregate_spec(node, scope)
            name = alias or names.derive(spec.base_name)
            aggregates.append((_aggregate(spec, name, hidden=False), spec.key()))
            output.append(name)
            continue
        group = _selected_group(node, scope, by_key)
        if group is None:  # an expression over aggregates and group columns
            pending.append((alias or names.derive("expr"), node))
            output.append(pending[-1][0])
            continue
        shown = str(group.ref) if group.ref is not None else node.sql()
        if group.key in group_names:
            raise errors.InvalidArgument(f"GROUP BY column {shown} appears twice in SELECT")
        base = group.ref.column if group.ref is not None else "expr"
        group_names[group.key] = alias or names.derive(base)
        output.append(group_names[group.key])
    columns = []
    for group in groups:
        base = group.ref.column if group.ref is not None else "expr"
        name = group_names.get(group.key) or names.derive(base)
        expr = None if group.ref is not None else group.expr
        columns.append(GroupColumn(name, group.ref, str(group.type), expr))
    return columns, aggregates, output, names, pending


def _selected_group(node: exp.Expression, scope: Scope, groups: dict[str, _Group]) -> _Group | None:
    """The GROUP BY item a SELECT item is (a column must be one); None for another
    expression."""
    if isinstance(node, exp.Column):
        ref, _ = scope.resolve(node)
        found = groups.get(json.dumps({"col": ref.to_json()}))
        if found is None:
            raise errors.InvalidArgument(f"column {ref} must appear in GROUP BY or be aggregated")
        return found
    if node.find(*AGGREGATES):
        return None
    try:
        expr, _ = typed(node, lambda c: _column(c, scope), _no_aggregates)
    except errors.InvalidArgument:
        return None
    return groups.get(json.dumps(expr, sort_keys=True))


def _aggregate(spec: _AggregateSpec, name: str, hidden: bool) -> Aggregate:
    return Aggregate(
        name,
        spec.kind,
        spec.arg,
        None if spec.arg_type is None else str(spec.arg_type),
        str(RULES[spec.kind].result_type(spec.arg_type)),
        hidden,
    )


class _ViewColumns:
    """The hooks that type an expression over a view's columns (``{"out": name}``), for
    HAVING and derived SELECT items: a GROUP BY column or an output name, and aggregates --
    one already computed is reused, another is added hidden."""

    def __init__(
        self,
        scope: Scope,
        columns: list[GroupColumn],
        aggregates: list[tuple[Aggregate, str]],
        names: _Names,
        clause: str,
        prefix: str,
    ) -> None:
        self.scope, self.columns, self.names, self.clause = scope, columns, names, clause
        self.prefix = prefix  # of the hidden aggregates' names
        self.aggregates = list(aggregates)
        self.by_key = {key: agg for agg, key in reversed(aggregates)}
        self.outputs = {c.name: ColumnType.parse(c.type) for c in columns}
        self.outputs.update({a.name: ColumnType.parse(a.result_type) for a, _ in aggregates})

    def column(self, node: exp.Column) -> Typed:
        try:
            ref, _ = self.scope.resolve(node)
        except errors.UnknownColumn:
            name = identifier(node.this, "column")
            if node.args.get("table") is None and name in self.outputs:
                return {"out": name}, self.outputs[name]
            raise
        for group in self.columns:
            if group.ref == ref:
                return {"out": group.name}, ColumnType.parse(group.type)
        raise errors.InvalidArgument(
            f"column {ref} in {self.clause} must appear in GROUP BY or be aggregated"
        )

    def aggregate(self, node: exp.Expression) -> Typed:
        spec = aggregate_spec(node, self.scope)
        found = self.by_key.get(spec.key())
        if found is None:
            found = _aggregate(spec, self.names.hidden(self.prefix), hidden=True)
            self.by_key[spec.key()] = found
            self.aggregates.append((found, spec.key()))
        return {"out": found.name}, ColumnType.parse(found.result_type)


def plan_derived(
    pending: list[tuple[str, exp.Expression]],
    scope: Scope,
    columns: list[GroupColumn],
    aggregates: list[tuple[Aggregate, str]],
    names: _Names,
) -> tuple[list[Derived], list[tuple[Aggregate, str]]]:
    """SELECT items over aggregates and group columns (``SUM(a) / SUM(b)``): expressions over
    view columns, with the aggregates extended by the hidden ones they read."""
    hooks = _ViewColumns(scope, columns, aggregates, names, "a SELECT expression", "_agg")
    derived = []
    for name, node in pending:
        expr, type_ = typed(node, hooks.column, hooks.aggregate)
        derived.append(Derived(name, expr, str(type_)))
    return derived, hooks.aggregates


def plan_having(
    select: exp.Select,
    scope: Scope,
    columns: list[GroupColumn],
    aggregates: list[tuple[Aggregate, str]],
    names: _Names,
    derived: list[Derived],
) -> tuple[Expr | None, list[tuple[Aggregate, str]]]:
    """HAVING over view columns (``{"out": name}``) and the aggregates extended by the hidden
    ones only HAVING uses; an aggregate also in SELECT is reused, never computed twice."""
    having = select.args.get("having")
    if having is None:
        return None, list(aggregates)
    hooks = _ViewColumns(scope, columns, aggregates, names, "HAVING", "_having")
    hooks.outputs.update({d.name: ColumnType.parse(d.type) for d in derived})
    preds = [predicate(term, hooks.column, hooks.aggregate) for term in conjuncts(having.this)]
    return (preds[0] if len(preds) == 1 else {"and": preds}), hooks.aggregates


# === the whole compilation =====================================================================


def compile_view(create: CreateView, table: Callable[[str], TableSchema]) -> ViewPlan:
    """Compile a CREATE MATERIALIZED VIEW; ``table(name)`` returns a schema or raises
    ``UnknownTable`` (a KeyError or None is taken to mean the same)."""
    select = parse_select(create.select_sql)
    check_supported(select)
    tables, scope, ons = resolve_tables(select, table)
    select = expand_stars(select, tables, scope)
    edges, filters = plan_where(select, scope, ons)
    check_connected(tables, edges)
    shape = view_shape(select)
    if shape == "aggregate" or select.args.get("group") is not None:
        groups = plan_group_by(select, scope)
    else:  # a bag, or SELECT DISTINCT: grouped by every item
        groups = projected_groups(select, scope)
    columns, aggregates, output, names, pending = plan_select(select, scope, groups)
    derived, aggregates = plan_derived(pending, scope, columns, aggregates, names)
    having, aggregates = plan_having(select, scope, columns, aggregates, names, derived)
    if shape == "aggregate" and select.args.get("distinct") is not None:
        hidden = [c.name for c in columns if c.name not in output]
        if hidden or not columns:
            raise errors.InvalidArgument(
                "SELECT DISTINCT over aggregates is supported only when the SELECT shows every "
                "GROUP BY column (each row is distinct then); "
                + (f"{', '.join(hidden)} is not shown" if hidden else "there is no GROUP BY")
            )
    return ViewPlan(
        name=create.name,
        sql=create.select_sql,
        mode=create.mode,
        interval_ms=create.interval_ms,
        nodes=create.nodes,
        speculation=create.speculation,
        host=create.host,
        feed_ms=create.feed_ms,
        tables=tables,
        edges=edges,
        filters=filters,
        group_by=tuple(columns),
        aggregates=tuple(agg for agg, _ in aggregates),
        having=having,
        output=tuple(output),
        derived=tuple(derived),
        shape=shape,
    )


def compile_sql(sql: str, table: Callable[[str], TableSchema]) -> ViewPlan:
    """``CREATE MATERIALIZED VIEW ...`` text straight to a plan (tests, tools)."""
    statement = parse_view_statement(sql)
    if not isinstance(statement, CreateView):
        raise errors.InvalidArgument("expected CREATE MATERIALIZED VIEW ... AS SELECT ...")
    return compile_view(statement, table)
