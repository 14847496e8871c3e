"""The view plan: what the compiler makes of a view's SELECT, shared by every maintenance mode.

A plan is plain data that persists as JSON in the catalog, so the coordinator, the refresher and
the Spark layer read the same thing after a restart. Expressions and predicates are JSON trees
(see ``cumulus.expressions`` for their meaning at run time):

- ``{"col": [alias, column]}``; ``{"out": name}`` (HAVING only: a view column);
- ``{"lit": value, "type": T}`` with value in JSON form (DECIMAL as an exact string, DATE as an
  ISO string);
- ``{"op": "+"|"-"|"*"|"/", "args": [e1, e2]}``, ``{"neg": e}``;
- predicates ``{"cmp": "="|"<>"|"<"|"<="|">"|">=", "args": [e1, e2]}``,
  ``{"in": e, "values": [e, ...]}``, ``{"between": e, "low": e, "high": e}``, ``{"not": p}``,
  ``{"and": [p, ...]}`` (HAVING's conjunction; WHERE's is the ``filters`` tuple),
  ``{"or": [p, ...]}``, ``{"like": e, "pattern": "a%"}`` (a constant pattern),
  ``{"notnull": e}`` (IS NOT NULL; IS NULL is its ``not``);
- ``{"null": true}`` (a NULL literal: in an IN list, a CASE result, a COALESCE argument);
  ``{"case": [[p, e], ...], "else": e, "type": T}`` (no "else": NULL) and
  ``{"coalesce": [e, ...], "type": T}``, T their result type (``typerules.common_type``);
- ``{"fn": "abs"|"year"|"month"|"day", "args": [e]}``, ``{"fn": "substring", "args": [e,
  start, length]}`` (INT literals; no length: to the end) and ``{"fn": "greatest"|"least",
  "args": [e, ...], "type": T}`` (T as for COALESCE).

A view's ``shape`` says what its rows are. ``aggregate``: one row per group, its aggregates'
values. ``bag`` (a SELECT without aggregates): a multiset of rows, kept as a GROUP BY over every
projected column with the group's row count (``_count``, the multiplicity: pg_ivm's
``__ivm_count__``, DBToaster's map value), a row read as many times as it counts. ``distinct``
(SELECT DISTINCT, or a GROUP BY without aggregates): the same groups, each read once.

A GROUP BY item is a column (``ref``) or an expression of the row (``expr``). A SELECT item that
is neither a group column nor an aggregate is a *derived* column: an expression over view
columns (``{"out": name}``: group columns and aggregates, hidden ones made for it), finished when
the view is read from the aggregates' state.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from aggview.errors import InvalidArgument
from aggview.schema import ColumnType
from cumulus.aggregates import Kind

Expr = dict[str, Any]
T = TypeVar("T")

MODES = ("sync", "async", "cumulus")
SPECULATION = ("speculative", "conservative")  # how a Cumulus view's runtime runs
# where its DW nodes run: in the coordinating process, processes of their own, Spark tasks;
# or node pools at addresses, "host:port,host:port" (``node_addresses``)
HOSTS = ("local", "grpc", "spark")
PLAN_FORMAT = 1


def node_addresses(host: str) -> list[str]:
    """The DW node pools a cumulus view's ``host`` names, by node number; [] for a host of
    ``HOSTS`` (checked when the view was created: ``cumulus.ddl``)."""
    return [] if host in HOSTS or not host else host.split(",")


SHAPES = ("aggregate", "bag", "distinct")
# an outer alias M3 cannot read (a LEFT JOIN with a subquery's rows that is no lookup of one
# row) in a cumulus view
OUTER_REFUSAL = (
    "a LEFT JOIN with a subquery other than a grouped one on exactly its group columns is "
    "maintained in refresh = 'sync' or 'async', not 'cumulus'; cumulus takes LEFT, RIGHT and "
    "FULL JOIN of tables, NOT EXISTS, NOT IN, and a LEFT JOIN with a grouped subquery on its "
    "group columns"
)
# a bag view row's multiplicity, as a counted read (a subscription) shows it; ``_`` names are
# the view's own, never a user's
MULTIPLICITY = "__count"


def _field(data: object, key: str, kinds: type | tuple[type, ...], what: str) -> Any:
    """Fetch one field of a persisted object, refusing a wrong shape with a message naming it."""
    if not isinstance(data, Mapping):
        raise InvalidArgument(f"{what} must be an object; got {data!r}")
    if key not in data:
        raise InvalidArgument(f"{what} lacks {key!r}")
    value = data[key]
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in _tuple(kinds)):
        raise InvalidArgument(f"{what}: {key} has the wrong type ({value!r})")
    return value


def _tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _type_string(text: object, what: str) -> str:
    """Types persist in their canonical spelling; anything else is a corrupt plan."""
    if not isinstance(text, str) or str(ColumnType.parse(text)) != text:
        raise InvalidArgument(f"{what}: {text!r} is not a canonical column type")
    return text


HIDDEN_PREFIX = "__sub_"  # hidden views' names: never a user's (``_`` names are the system's)


def _compares_with_scalars(having: object) -> bool:
    """Whether a HAVING reads a hidden one-row view's value (``{"out": "__sub_..."}``): a
    cumulus view's WHERE conjunct over its rows' own columns and an uncorrelated scalar
    subquery, compared when the view is read; a view without aggregates may have that one."""
    if isinstance(having, Mapping):
        out = having.get("out")
        if isinstance(out, str) and out.startswith(HIDDEN_PREFIX):
            return True
        return any(_compares_with_scalars(v) for v in having.values())
    if isinstance(having, list):
        return any(_compares_with_scalars(v) for v in having)
    return False


def expr_columns(expr: object) -> Iterator[tuple[str, str]]:
    """Every (alias, column) an expression or predicate reads, in tree order, repeats included."""
    if isinstance(expr, Mapping):
        col = expr.get("col")
        if col is not None:
            yield (col[0], col[1])
            return
        for value in expr.values():
            yield from expr_columns(value)
    elif isinstance(expr, list):
        for item in expr:
            yield from expr_columns(item)


@dataclass(frozen=True)
class ColumnRef:
    alias: str
    column: str

    def __str__(self) -> str:
        return f"{self.alias}.{self.column}"

    def to_json(self) -> list[str]:
        return [self.alias, self.column]

    @classmethod
    def from_json(cls, data: object) -> ColumnRef:
        if (
            not isinstance(data, list)
            or len(data) != 2
            or not all(isinstance(part, str) and part for part in data)
        ):
            raise InvalidArgument(f"column reference must be [alias, column]; got {data!r}")
        return cls(data[0], data[1])


@dataclass(frozen=True)
class TableRef:
    """One occurrence of a base table in FROM; a self-join has several, with distinct aliases."""

    alias: str
    table: str

    @classmethod
    def of(cls, table: str, alias: str | None = None) -> TableRef:
        return cls(alias or table, table)

    def to_json(self) -> dict[str, str]:
        return {"alias": self.alias, "table": self.table}

    @classmethod
    def from_json(cls, data: object) -> TableRef:
        return cls(_field(data, "alias", str, "table ref"), _field(data, "table", str, "table ref"))


@dataclass(frozen=True)
class JoinEdge:
    """``left = right`` between columns of two different aliases: what connects the join graph."""

    left: ColumnRef
    right: ColumnRef

    def __post_init__(self) -> None:
        if self.left.alias == self.right.alias:
            raise InvalidArgument(f"join edge {self.left} = {self.right} must join two aliases")

    def to_json(self) -> dict[str, list[str]]:
        return {"left": self.left.to_json(), "right": self.right.to_json()}

    @classmethod
    def from_json(cls, data: object) -> JoinEdge:
        return cls(
            ColumnRef.from_json(_field(data, "left", list, "join edge")),
            ColumnRef.from_json(_field(data, "right", list, "join edge")),
        )


@dataclass(frozen=True)
class GroupColumn:
    """A GROUP BY item: part of the view row's key, named as the view shows it; a column
    (``ref``) or an expression of the joined row (``expr``, ``ref`` None)."""

    name: str
    ref: ColumnRef | None
    type: str
    expr: Expr | None = None

    def __post_init__(self) -> None:
        if (self.ref is None) == (self.expr is None):
            raise InvalidArgument(f"group column {self.name}: a column or an expression, not both")

    def source(self) -> Expr:
        """The group value as an expression of the joined row."""
        return {"col": self.ref.to_json()} if self.ref is not None else copy.deepcopy(self.expr)  # type: ignore[return-value]

    def to_json(self) -> dict[str, Any]:
        if self.ref is None:
            return {"name": self.name, "expr": copy.deepcopy(self.expr), "type": self.type}
        return {"name": self.name, "ref": self.ref.to_json(), "type": self.type}

    @classmethod
    def from_json(cls, data: object) -> GroupColumn:
        what = "group column"
        name = _field(data, "name", str, what)
        type_ = _type_string(_field(data, "type", str, what), what)
        if isinstance(data, Mapping) and "expr" in data:
            return cls(name, None, type_, copy.deepcopy(_field(data, "expr", dict, what)))
        return cls(name, ColumnRef.from_json(_field(data, "ref", list, what)), type_)


@dataclass(frozen=True)
class Derived:
    """A SELECT item computed from view columns when read (``{"out": name}`` refs)."""

    name: str
    expr: Expr
    type: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "expr": copy.deepcopy(self.expr), "type": self.type}

    @classmethod
    def from_json(cls, data: object) -> Derived:
        what = "derived column"
        return cls(
            _field(data, "name", str, what),
            copy.deepcopy(_field(data, "expr", dict, what)),
            _type_string(_field(data, "type", str, what), what),
        )


@dataclass(frozen=True)
class Aggregate:
    """One aggregate the view row keeps state for; ``hidden`` ones exist only for HAVING."""

    name: str
    kind: Kind  # given as its persisted spelling ("sum") or a member
    arg: Expr | None
    arg_type: str | None
    result_type: str
    hidden: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", Kind(self.kind))
        except ValueError:
            raise InvalidArgument(f"aggregate {self.name}: unknown kind {self.kind!r}") from None
        if (self.arg is None) != (self.kind is Kind.COUNT_STAR):
            raise InvalidArgument(f"aggregate {self.name}: only count_star has no argument")
        if (self.arg is None) != (self.arg_type is None):
            raise InvalidArgument(f"aggregate {self.name}: arg and arg_type go together")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind.value,
            "arg": copy.deepcopy(self.arg),
            "arg_type": self.arg_type,
            "result_type": self.result_type,
            "hidden": self.hidden,
        }

    @classmethod
    def from_json(cls, data: object) -> Aggregate:
        what = "aggregate"
        arg_type = _field(data, "arg_type", (str, type(None)), what)
        return cls(
            _field(data, "name", str, what),
            _field(data, "kind", str, what),
            copy.deepcopy(_field(data, "arg", (dict, type(None)), what)),
            None if arg_type is None else _type_string(arg_type, what),
            _type_string(_field(data, "result_type", str, what), what),
            _field(data, "hidden", bool, what),
        )


@dataclass(frozen=True)
class ViewPlan:
    """Everything view maintenance needs: join graph, filters, group key and aggregate states.

    ``sql`` is the view's SELECT as written. ``output`` lists the SELECT items' names in order;
    the view row also holds every group column (the key) and hidden aggregates, which are not in
    ``output``. ``having`` is applied at read time to view rows (``{"out": name}`` refs).
    """

    name: str
    sql: str
    mode: str
    interval_ms: int
    tables: tuple[TableRef, ...]
    edges: tuple[JoinEdge, ...]
    filters: tuple[Expr, ...]
    group_by: tuple[GroupColumn, ...]
    aggregates: tuple[Aggregate, ...]
    having: Expr | None
    output: tuple[str, ...]
    # refresh = 'cumulus': the DW nodes of its runtime and how it runs (interval_ms: the epoch)
    nodes: int = 0
    speculation: str = ""
    host: str = ""
    # cumulus: how often committed changes are fed to the runtime between epochs (its
    # tentative values run ahead of the last epoch); 0: only at each epoch
    feed_ms: int = 0
    # cumulus: its M3 program's depth (DBToaster's --depth: how many levels of delta maps it
    # keeps; below them it reads the base relations); 0: every level
    depth: int = 0
    derived: tuple[Derived, ...] = ()  # SELECT items computed from the columns when read
    shape: str = "aggregate"  # or "bag" (rows with duplicates) or "distinct" (see above)
    # the hidden views its subqueries became (``cumulus.passes.lift_subqueries``), created and
    # dropped with it
    hidden: tuple[str, ...] = ()
    # a UNION ALL (``cumulus.passes.unions``): the branches after the first, which is this plan's
    # own tables, edges, filters, group sources and aggregate arguments; every branch has the
    # view's columns (names, kinds, types), so the view's state is the sum of theirs
    branches: tuple[ViewPlan, ...] = ()
    # aliases a LEFT JOIN binds (an anti-join is one with its IS NULL filter): where no row
    # matches their equalities, a row of NULLs (``cumulus.delta``); each is reached only by
    # equalities with aliases that are not outer themselves
    outer: tuple[str, ...] = ()
    # refresh = 'cumulus': the plans of the hidden views its subqueries became (read by its
    # M3 program as nested aggregates, maintained by that program: no view of their own)
    nested: tuple[ViewPlan, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidArgument(f"view {self.name}: refresh must be sync, async or cumulus")
        if self.mode == "sync" and self.interval_ms != 0:
            raise InvalidArgument(f"view {self.name}: a sync view has no interval_ms")
        if self.mode != "sync" and self.interval_ms <= 0:
            raise InvalidArgument(f"view {self.name}: an {self.mode} view needs interval_ms > 0")
        if self.mode == "cumulus":
            addresses = node_addresses(self.host)
            if (
                self.nodes < 1
                or self.speculation not in SPECULATION
                or (self.host not in HOSTS and not addresses)
                or (addresses and len(addresses) != self.nodes)
            ):
                raise InvalidArgument(
                    f"view {self.name}: a cumulus view needs nodes >= 1, a mode of "
                    f"{' or '.join(SPECULATION)} and a host of {' or '.join(HOSTS)} or as "
                    "many DW node addresses as nodes"
                )
            if self.depth < 0:
                raise InvalidArgument(f"view {self.name}: depth must be 0 or more")
            if not 0 <= self.feed_ms <= self.interval_ms:
                raise InvalidArgument(
                    f"view {self.name}: feed_ms must be between 0 and epoch_ms "
                    f"({self.interval_ms}); got {self.feed_ms}"
                )
        elif self.nodes or self.speculation or self.host or self.feed_ms or self.depth:
            raise InvalidArgument(
                f"view {self.name}: nodes, mode, host, feed_ms and depth are for cumulus views"
            )
        if self.shape not in SHAPES:
            raise InvalidArgument(f"view {self.name}: shape must be {', '.join(SHAPES)}")
        if self.shape != "aggregate" and (
            self.aggregates
            or self.derived
            or not self.group_by
            or (self.having and not _compares_with_scalars(self.having))
        ):
            raise InvalidArgument(
                f"view {self.name}: a {self.shape} view has columns, and no aggregate, derived "
                "column or HAVING (but a cumulus view's comparison with its scalar subqueries)"
            )
        aliases = [t.alias for t in self.tables]
        if not aliases or len(set(aliases)) != len(aliases):
            raise InvalidArgument(f"view {self.name}: table aliases must be present and distinct")
        self._check_outer(aliases)
        names = [g.name for g in self.group_by] + [a.name for a in self.aggregates]
        names += [d.name for d in self.derived]
        if len(set(names)) != len(names):
            raise InvalidArgument(f"view {self.name}: view column names must be distinct")
        unknown = [n for n in self.output if n not in names]
        if unknown:
            raise InvalidArgument(f"view {self.name}: output {unknown[0]!r} is not a view column")
        for branch in self.branches:
            self._check_branch(branch)

    def _check_branch(self, branch: ViewPlan) -> None:
        """A branch adds its tuples to the view's groups: the same columns, kinds and types."""
        if branch.branches or branch.hidden or branch.shape != self.shape:
            raise InvalidArgument(f"view {self.name}: a branch is one SELECT of the view's shape")
        mine = [(g.name, g.type) for g in self.group_by]
        mine += [(a.name, a.kind, a.arg_type, a.result_type) for a in self.aggregates]  # type: ignore[misc]
        theirs = [(g.name, g.type) for g in branch.group_by]
        theirs += [(a.name, a.kind, a.arg_type, a.result_type) for a in branch.aggregates]  # type: ignore[misc]
        if mine != theirs:
            raise InvalidArgument(f"view {self.name}: its branches' columns differ")

    def _check_outer(self, aliases: list[str]) -> None:
        """An outer alias is matched by equalities with inner aliases only (its NULL row
        depends on them alone, which makes the view linear in each other table)."""
        for alias in self.outer:
            if alias not in aliases or alias == aliases[0]:
                raise InvalidArgument(f"view {self.name}: outer alias {alias!r} is not joined")
            ends = [
                (e.left.alias, e.right.alias)
                for e in self.edges
                if alias in (e.left.alias, e.right.alias)
            ]
            if not ends or any(a in self.outer and b in self.outer for a, b in ends):
                raise InvalidArgument(
                    f"view {self.name}: outer alias {alias!r} needs equalities with inner tables"
                )

    # --- questions view maintenance asks ---------------------------------------------------

    def branch_plans(self) -> tuple[ViewPlan, ...]:
        """The SELECTs whose tuples the view's groups add up: itself, or each branch of a
        UNION ALL (each with its own aliases: ask a branch, not the view, about an alias)."""
        if not self.branches:
            return (self,)
        return (replace(self, branches=()), *self.branches)

    @property
    def program_depth(self) -> int | None:
        """The depth its M3 program is compiled at (None: every level of delta maps)."""
        return self.depth or None

    def once(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()``, worked out once per plan and ``key`` (a plan is frozen): what
        maintenance asks of a view at every commit that touches it."""
        memo = self.__dict__.get("_memo")
        if memo is None:
            memo = {}
            object.__setattr__(self, "_memo", memo)
        if key not in memo:
            memo[key] = compute()
        return memo[key]  # type: ignore[no-any-return]

    def base_tables(self) -> tuple[str, ...]:
        """Distinct base tables, in FROM order (of every branch): the tables whose writes
        touch this view. Worked out once per plan (it is frozen): a member asks for every
        view's at each batch of commits it dispatches."""

        def compute() -> tuple[str, ...]:
            names = {n.name for n in self.nested}
            return tuple(
                dict.fromkeys(
                    table
                    for plan in (*self.branch_plans(), *self.nested)
                    for table in (t.table for t in plan.tables)
                    if table not in names
                )
            )

        return self.once("base_tables", compute)

    def join_columns(self) -> tuple[tuple[str, str], ...]:
        """Distinct (table, column) pairs the joins match on, in edge order: what indexes
        and the coordinator's lookup cache serve (a nested aggregate is no table: its
        M3 program's maps)."""
        names = {n.name for n in self.nested}
        return tuple(
            dict.fromkeys(
                (branch.table_of(ref.alias), ref.column)
                for branch in self.branch_plans()
                for edge in branch.edges
                for ref in (edge.left, edge.right)
                if branch.table_of(ref.alias) not in names
            )
        )

    def outer_partners(self, alias: str) -> tuple[str, ...]:
        """The aliases an outer alias's equalities reach."""
        ends = [(e.left.alias, e.right.alias) for e in self.edges]
        return tuple(dict.fromkeys(b if a == alias else a for a, b in ends if alias in (a, b)))

    def aliases_of(self, table: str) -> tuple[str, ...]:
        """A self-joined table has several aliases; a delta of it enters once per alias."""
        return tuple(t.alias for t in self.tables if t.table == table)

    def table_of(self, alias: str) -> str:
        for ref in self.tables:
            if ref.alias == alias:
                return ref.table
        raise InvalidArgument(f"view {self.name} has no alias {alias!r}")

    def columns_of(self, alias: str) -> tuple[str, ...]:
        """Columns of one alias the view reads, so writes touching none of them can be skipped."""
        found: dict[str, None] = {}
        for edge in self.edges:
            for ref in (edge.left, edge.right):
                if ref.alias == alias:
                    found[ref.column] = None
        trees: list[object] = [*self.filters, *(a.arg for a in self.aggregates)]
        trees += [g.source() for g in self.group_by]
        for tree_alias, column in expr_columns(trees):
            if tree_alias == alias:
                found[column] = None
        return tuple(found)

    def column_type(self, name: str) -> str:
        """Type of a view column (group column or aggregate result) by its name."""
        for group in self.group_by:
            if group.name == name:
                return group.type
        for aggregate in self.aggregates:
            if aggregate.name == name:
                return aggregate.result_type
        for derived in self.derived:
            if derived.name == name:
                return derived.type
        raise InvalidArgument(f"view {self.name} has no column {name!r}")

    # --- persistence -------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "name": self.name,
            "sql": self.sql,
            "mode": self.mode,
            "interval_ms": self.interval_ms,
            "tables": [t.to_json() for t in self.tables],
            "edges": [e.to_json() for e in self.edges],
            "filters": copy.deepcopy(list(self.filters)),
            "group_by": [g.to_json() for g in self.group_by],
            "aggregates": [a.to_json() for a in self.aggregates],
            "having": copy.deepcopy(self.having),
            "output": list(self.output),
            **(
                {
                    "nodes": self.nodes,
                    "speculation": self.speculation,
                    "host": self.host,
                    "feed_ms": self.feed_ms,
                    **({"depth": self.depth} if self.depth else {}),
                }
                if self.nodes
                else {}
            ),
            **({"derived": [d.to_json() for d in self.derived]} if self.derived else {}),
            **({"shape": self.shape} if self.shape != "aggregate" else {}),
            **({"hidden": list(self.hidden)} if self.hidden else {}),
            **({"branches": [b.to_json() for b in self.branches]} if self.branches else {}),
            **({"outer": list(self.outer)} if self.outer else {}),
            **({"nested": [n.to_json() for n in self.nested]} if self.nested else {}),
        }

    @classmethod
    def from_json(cls, data: object) -> ViewPlan:
        what = "view plan"
        if _field(data, "format", int, what) != PLAN_FORMAT:
            raise InvalidArgument(f"{what}: unsupported format {data['format']!r}")  # type: ignore[index]
        filters = _field(data, "filters", list, what)
        if not all(isinstance(f, dict) for f in filters):
            raise InvalidArgument(f"{what}: filters must be objects")
        output = _field(data, "output", list, what)
        if not all(isinstance(o, str) for o in output):
            raise InvalidArgument(f"{what}: output must be names")
        return cls(
            name=_field(data, "name", str, what),
            sql=_field(data, "sql", str, what),
            mode=_field(data, "mode", str, what),
            interval_ms=_field(data, "interval_ms", int, what),
            tables=tuple(TableRef.from_json(t) for t in _field(data, "tables", list, what)),
            edges=tuple(JoinEdge.from_json(e) for e in _field(data, "edges", list, what)),
            filters=tuple(copy.deepcopy(filters)),
            group_by=tuple(GroupColumn.from_json(g) for g in _field(data, "group_by", list, what)),
            aggregates=tuple(
                Aggregate.from_json(a) for a in _field(data, "aggregates", list, what)
            ),
            having=copy.deepcopy(_field(data, "having", (dict, type(None)), what)),
            output=tuple(output),
            nodes=_field(data, "nodes", int, what) if "nodes" in data else 0,  # type: ignore[operator]
            speculation=_field(data, "speculation", str, what) if "nodes" in data else "",  # type: ignore[operator]
            host=(_field(data, "host", str, what) if "host" in data else "local")  # type: ignore[operator]
            if "nodes" in data  # type: ignore[operator]
            else "",
            feed_ms=_field(data, "feed_ms", int, what) if "feed_ms" in data else 0,  # type: ignore[operator]
            depth=_field(data, "depth", int, what) if "depth" in data else 0,  # type: ignore[operator]
            derived=tuple(
                Derived.from_json(d)
                for d in (_field(data, "derived", list, what) if "derived" in data else [])  # type: ignore[operator]
            ),
            shape=_field(data, "shape", str, what) if "shape" in data else "aggregate",  # type: ignore[operator]
            hidden=tuple(_field(data, "hidden", list, what) if "hidden" in data else ()),  # type: ignore[operator]
            branches=tuple(
                cls.from_json(b)
                for b in (_field(data, "branches", list, what) if "branches" in data else [])  # type: ignore[operator]
            ),
            outer=tuple(_field(data, "outer", list, what) if "outer" in data else ()),  # type: ignore[operator]
            nested=tuple(
                cls.from_json(n)
                for n in (_field(data, "nested", list, what) if "nested" in data else [])  # type: ignore[operator]
            ),
        )
