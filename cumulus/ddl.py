"""Materialized-view DDL (CREATE / DROP / ALTER MATERIALIZED VIEW) -> statements, and a live
view's plan under ALTER's options. Its own small parser over sqlglot's tokens, because sqlglot
does not parse a view's options; the SELECT is left to ``cumulus.compiler``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.tokens import Token, Tokenizer, TokenType

from aggview import errors
from cumulus.plan import HOSTS, MODES, SPECULATION, ViewPlan, node_addresses
from cumulus.sqltext import identifier, syntax_error

DEFAULT_ASYNC_INTERVAL_MS = 1000
DEFAULT_EPOCH_MS = 100  # a Cumulus view's epoch: how often its committed snapshot moves
DEFAULT_NODES = 2
MAX_NODES = 64
VIEW_OPTIONS = ("refresh", "interval_ms", "nodes", "epoch_ms", "mode", "host", "feed_ms", "depth")
CUMULUS_OPTIONS = ("nodes", "epoch_ms", "mode", "host", "feed_ms", "depth")
MAX_DEPTH = 16  # a cumulus view's M3 program: how many levels of delta maps at most
MIN_INTERVAL_MS = 10
MAX_INTERVAL_MS = 86_400_000


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
    depth: int = 0  # cumulus: its M3 program's depth (0: unbounded)


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
    depth: int = 0


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


def _node_addresses(text: str) -> str:
    """``host = 'h1:7100,h2:7100'``: DW node pools by address, one per node, as
    ``host:port`` (an IPv6 address in brackets); returned without spaces."""
    from aggview.net import is_host_port  # gRPC's health and reflection: servers only

    addresses = [part.strip() for part in text.split(",")]
    for address in addresses:
        if not is_host_port(address) or " " in address:
            raise errors.InvalidArgument(
                f"host must be 'local', 'grpc', 'spark' or DW node addresses 'host:port,...'; "
                f"{address!r} is not host:port"
            )
    if len(set(addresses)) != len(addresses):
        raise errors.InvalidArgument(f"host names a DW node address twice: {text!r}")
    if len(addresses) > MAX_NODES:
        raise errors.InvalidArgument(f"host names more than {MAX_NODES} DW nodes")
    return ",".join(addresses)


def _nodes_of(values: dict[str, Any], default: int) -> int:
    """``nodes``: one per address when ``host`` names addresses (a different ``nodes`` is an
    error), else as given or ``default``."""
    addresses = node_addresses(values.get("host", ""))
    if addresses and values.get("nodes", len(addresses)) != len(addresses):
        raise errors.InvalidArgument(
            f"nodes = {values['nodes']} but host names {len(addresses)} DW node addresses"
        )
    return len(addresses) or values.get("nodes", default)


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
        if key == "host" and kind == "string" and ":" in text:
            values[key] = _node_addresses(text)
        elif key in ("refresh", "mode", "host"):
            choices = {"refresh": MODES, "mode": SPECULATION, "host": HOSTS}[key]
            values[key] = _choice(key, kind, text, choices)
        elif key == "nodes":
            if kind != "number" or not _INTEGER.fullmatch(text) or not 1 <= int(text) <= MAX_NODES:
                raise errors.InvalidArgument(
                    f"nodes must be a whole number from 1 to {MAX_NODES}; got {text}"
                )
            values[key] = int(text)
        elif key == "depth":
            if kind != "number" or not _INTEGER.fullmatch(text) or not 1 <= int(text) <= MAX_DEPTH:
                raise errors.InvalidArgument(
                    f"depth must be a whole number from 1 to {MAX_DEPTH} (leave it out for "
                    f"every level of delta maps); got {text}"
                )
            values[key] = int(text)
        else:
            values[key] = _interval(kind, text, key)
    return values


def _create(header: _Header) -> CreateView:
    usage = (
        "CREATE MATERIALIZED VIEW name [WITH (refresh = 'sync'|'async', interval_ms = N)] "
        "| [WITH (refresh = 'cumulus', nodes = N, epoch_ms = M, mode = 'speculative'|"
        "'conservative', host = 'local'|'grpc'|'spark'|'h:p,...', feed_ms = F, depth = D)] "
        "AS SELECT ..."
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
    nodes, speculation = _nodes_of(values, DEFAULT_NODES), values.get("mode", "speculative")
    host, feed = values.get("host", "local"), values.get("feed_ms", 0)
    return CreateView(
        name,
        if_not_exists,
        mode,
        interval,
        select_sql,
        nodes,
        speculation,
        host,
        feed,
        values.get("depth", 0),
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
    "nodes = N, epoch_ms = M, mode = 'speculative'|'conservative', "
    "host = 'local'|'grpc'|'spark'|'h:p,...', feed_ms = F, depth = D)"
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
        nodes=_nodes_of(values, 0),
        epoch_ms=values.get("epoch_ms", 0),
        speculation=values.get("mode", ""),
        host=values.get("host", ""),
        feed_ms=values.get("feed_ms", 0),
        depth=values.get("depth", 0),
    )


def altered_plan(plan: ViewPlan, alter: AlterView) -> ViewPlan:
    """``plan`` under ``alter``'s options: a new mode takes its defaults for what is not given;
    an option of another mode than the one the view ends in is an error naming it."""
    mode = alter.refresh or plan.mode
    if plan.nested and mode != "cumulus":  # its subqueries are maps of its program, no views
        raise errors.FailedPrecondition(
            f"materialized view {plan.name} keeps its subqueries as nested aggregates of its "
            "cumulus program: switching it to another mode is not supported (drop and create it)"
        )
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
            ("depth", alter.depth),
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
        return replace(
            plan, mode=mode, interval_ms=0, nodes=0, speculation="", host="", feed_ms=0, depth=0
        )
    if mode == "async":
        interval = alter.interval_ms or (plan.interval_ms if same else DEFAULT_ASYNC_INTERVAL_MS)
        return replace(
            plan,
            mode=mode,
            interval_ms=interval,
            nodes=0,
            speculation="",
            host="",
            feed_ms=0,
            depth=0,
        )
    nodes = alter.nodes or (plan.nodes if same else DEFAULT_NODES)
    host = alter.host or (plan.host if same else "local")
    addresses = node_addresses(host)
    if addresses and nodes != len(addresses):
        raise errors.InvalidArgument(
            f"materialized view {plan.name} would have nodes = {nodes} on {len(addresses)} "
            "DW node addresses (host); give host with nodes"
        )
    return replace(
        plan,
        mode=mode,
        interval_ms=alter.epoch_ms or (plan.interval_ms if same else DEFAULT_EPOCH_MS),
        nodes=nodes,
        speculation=alter.speculation or (plan.speculation if same else "speculative"),
        host=host,
        feed_ms=alter.feed_ms or (plan.feed_ms if same else 0),
        depth=alter.depth or (plan.depth if same else 0),
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
