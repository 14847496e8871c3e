"""Query-shape suites against duckdb: a schema with random streams of changes (``Dataset``,
``Stream``) and the comparisons a suite runs for each of its queries — the refresh operator
after every batch (``maintain``), the M3 program after every change at each depth
(``replay``), and a sync, an async and a cumulus view on a cluster under concurrent writers
(``every_mode_equals_duckdb``). ``tpch_data`` and ``market_data`` are the datasets;
``test_tpch_shapes`` and ``test_market_shapes`` the suites.

A stream: an initial load with children before parents, then batches of 1-4 changes of
distinct rows: inserts, deletes and updates of any column outside the key (foreign keys
too). Foreign keys are drawn from the parent's whole key domain, so a child may refer to a
parent not inserted yet or already deleted.
"""

from __future__ import annotations

import functools
import itertools
import random
import threading
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import duckdb
import sqlglot
from sqlglot import exp
from test_m3_differential import DEPTHS, check_definitions, check_round_trip
from test_subqueries import Stack
from test_view_language import stored_changes

from aggclient import Client
from agglauncher.cluster import LocalCluster
from aggview import errors
from aggview.schema import TableSchema
from coordinator.catalog import table_from_create
from cumulus.compiler import compile_sql_views
from cumulus.m3.compiler import compile_program, plan_of
from cumulus.m3.interpreter import Interpreter
from cumulus.m3.printer import print_program
from cumulus.sqltext import divided_as_views_divide

Key = tuple[Any, ...]
Row = dict[str, Any]
Batch = dict[tuple[str, Key], tuple[Row | None, Row | None]]  # (table, key) -> (old, new)


@dataclass(frozen=True)
class Dataset:
    """Tables (columns with types both our DDL and duckdb's take, primary keys), the order of
    an initial load (every child before its parents), key domains (a range per key column),
    initial rows per table (3 where not given) and a random value per non-key column."""

    name: str
    columns: dict[str, list[tuple[str, str]]]
    primary_keys: dict[str, tuple[str, ...]]
    children_first: tuple[str, ...]
    domains: dict[str, tuple[range, ...]]
    rows: dict[str, int]
    values: dict[str, Callable[[random.Random], Any]]
    schemas: dict[str, TableSchema] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        found = {t: table_from_create(sqlglot.parse_one(self.ddl(t)), str) for t in self.columns}
        object.__setattr__(self, "schemas", found)

    def ddl(self, table: str) -> str:
        """CREATE TABLE for our catalog and for duckdb alike."""
        columns = [f"{name} {kind} NOT NULL" for name, kind in self.columns[table]]
        key = ", ".join(self.primary_keys[table])
        return f"CREATE TABLE {table} ({', '.join(columns)}, PRIMARY KEY ({key}))"

    def new_row(self, rng: random.Random, table: str, key: Key) -> Row:
        row: Row = dict(zip(self.primary_keys[table], key, strict=True))
        for column, _ in self.columns[table]:
            if column in self.values:
                row[column] = self.values[column](rng)
        return row


class Stream:
    """The live rows of every table of ``data`` and random batches of changes to them."""

    def __init__(self, rng: random.Random, data: Dataset) -> None:
        self.rng = rng
        self.data = data
        self.live: dict[str, dict[Key, Row]] = {t: {} for t in data.columns}

    def _free_key(self, table: str, taken: set[Key]) -> Key | None:
        for _ in range(20):
            key = tuple(self.rng.choice(d) for d in self.data.domains[table])
            if key not in self.live[table] and key not in taken:
                return key
        return None

    def change(
        self, table: str, taken: set[Key], action: str | None = None
    ) -> tuple[Key, Row | None, Row | None] | None:
        """One change of a row of ``table`` outside ``taken``: (key, old, new), None if none."""
        rng, values = self.rng, self.data.values
        existing = sorted(set(self.live[table]) - taken)
        if action is None:
            action = rng.choice(["insert", "insert", "delete", "update", "update"])
        if action != "insert" and existing:
            key = rng.choice(existing)
            old = self.live[table][key]
            if action == "delete":
                return key, old, None
            new = dict(old)
            editable = [c for c, _ in self.data.columns[table] if c in values]
            for column in rng.sample(editable, rng.randint(1, min(2, len(editable)))):
                new[column] = values[column](rng)
            return key, old, new
        key = self._free_key(table, taken)
        return None if key is None else (key, None, self.data.new_row(rng, table, key))

    def apply(self, batch: Batch) -> None:
        for (table, key), (_, new) in batch.items():
            if new is None:
                self.live[table].pop(key)
            else:
                self.live[table][key] = new

    def initial(self, tables: list[str], size: int = 4) -> Iterator[Batch]:
        """Inserts into ``tables`` (the dataset's ``rows`` a table), children before parents,
        ``size`` a batch."""
        order = [t for t in self.data.children_first if t in tables]
        pending = [(t, i) for t in order for i in range(self.data.rows.get(t, 3))]
        while pending:
            batch: Batch = {}
            for table, _ in pending[:size]:
                found = self.change(table, {k for t, k in batch if t == table}, "insert")
                if found is not None:
                    key, old, new = found
                    batch[(table, key)] = (old, new)
            del pending[:size]
            self.apply(batch)
            yield batch

    def batch(self, tables: list[str]) -> Batch:
        """1-4 changes of distinct rows of ``tables`` (the tables a query reads)."""
        batch: Batch = {}
        for _ in range(self.rng.randint(1, 4)):
            table = self.rng.choice(tables)
            found = self.change(table, {k for t, k in batch if t == table})
            if found is not None:
                key, old, new = found
                batch[(table, key)] = (old, new)
        self.apply(batch)
        return batch


def create(name: str, select: str, mode: str) -> str:
    return f"CREATE MATERIALIZED VIEW {name} WITH (refresh = '{mode}') AS {select}"


# === the comparison with duckdb ==================================================================


def duck(data: Dataset) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    for table in data.columns:  # no key: duckdb's index costs more than the rest of a batch
        con.execute(data.ddl(table).split(", PRIMARY KEY")[0] + ")")
    return con


def duck_apply(
    con: duckdb.DuckDBPyConnection, data: Dataset, table: str, key: Key, new: Row | None
) -> None:
    where = " AND ".join(f"{c} = ?" for c in data.primary_keys[table])
    con.execute(f"DELETE FROM {table} WHERE {where}", list(key))
    if new is not None:
        names = [c for c, _ in data.columns[table]]
        marks = ", ".join("?" * len(names))
        con.execute(f"INSERT INTO {table} VALUES ({marks})", [new[c] for c in names])


@functools.cache
def reference(select: str) -> str:
    """The SELECT as duckdb runs it to mean what the view means ("/" as views divide)."""
    return divided_as_views_divide(select)


def recomputed(con: duckdb.DuckDBPyConnection, select: str) -> list[tuple[Any, ...]]:
    return con.execute(reference(select)).fetchall()


def _exact(value: Any) -> Any:
    if isinstance(value, Decimal):
        return format((value + 0).normalize(), "f")  # 1.50 and 1.5 alike, -0 as 0
    return value


def assert_rows(
    name: str,
    columns: tuple[str, ...],
    got: list[tuple[Any, ...]],
    want: list[tuple[Any, ...]],
    approx: Collection[str] = (),
) -> None:
    """The same multiset of rows: DECIMAL, INT, TEXT and DATE exactly; ``approx``'s columns
    (an AVG, a DECIMAL rounded to 6 places where duckdb's is a DOUBLE; a "/") within 1e-6
    absolute plus 1e-9 relative."""
    rough = [c in approx for c in columns]

    def key(row: tuple[Any, ...]) -> str:
        return repr([_exact(v) for v, a in zip(row, rough, strict=True) if not a])

    got, want = sorted(got, key=key), sorted(want, key=key)
    assert [key(r) for r in got] == [key(r) for r in want], (name, got, want)
    for got_row, want_row in zip(got, want, strict=True):
        for g, w, a in zip(got_row, want_row, rough, strict=True):
            if a and g is not None and w is not None:
                assert abs(float(g) - float(w)) <= 1e-6 + 1e-9 * abs(float(w)), (got_row, want_row)
            else:
                assert (g is None) == (w is None), (name, got_row, want_row)


def read_tables(plans: list[Any], data: Dataset) -> list[str]:
    return sorted({t for p in plans for t in p.base_tables() if t in data.schemas})


def batches(stream: Stream, tables: list[str], count: int) -> Iterator[Batch]:
    """The initial load (children first), then ``count`` random batches."""
    yield from stream.initial(tables)
    for _ in range(count):
        yield stream.batch(tables)


def nonempty(want: list[tuple[Any, ...]]) -> bool:
    return any(any(v not in (None, 0) for v in row) for row in want)


def maintain(
    data: Dataset, name: str, select: str, seed: int, count: int, approx: Collection[str] = ()
) -> int:
    """The view of ``select`` maintained by the refresh operator (sync's) equals duckdb after
    every batch; returns how many of those comparisons saw a nonempty view."""
    stack = Stack([(name, select)], data.schemas)
    output = stack.plans[name].output
    con, stream = duck(data), Stream(random.Random(seed), data)
    seen = 0
    for batch in batches(stream, read_tables(list(stack.plans.values()), data), count):
        for (table, key), (_, new) in batch.items():
            duck_apply(con, data, table, key, new)
        stack.apply(stored_changes(data.schemas, batch))
        want = recomputed(con, select)
        assert_rows(name, output, stack.values(name), want, approx)
        seen += nonempty(want)
    return seen


def replay(
    data: Dataset,
    name: str,
    select: str,
    seed: int,
    count: int,
    depths: tuple[int | None, ...] = DEPTHS,
    round_trip: bool = True,
    approx: Collection[str] = (),
) -> int:
    """The query's M3 program at each depth, one change at a time (an update a delete and an
    insert), equals duckdb after every change; every map its definition at the end. Returns
    how many comparisons saw a nonempty view."""
    plan = plan_of(select, name, data.schemas.__getitem__)
    if plan.nested or plan.outer:  # nested aggregates, outer joins: every level materialized
        depths = (None,)
    programs = {d: compile_program([plan], data.schemas.__getitem__, depth=d) for d in depths}
    for program in programs.values() if round_trip else ():
        check_round_trip(program)
    interps = {d: Interpreter(p, keep_relations=True) for d, p in programs.items()}
    con, stream = duck(data), Stream(random.Random(seed), data)
    seen = 0
    for batch in batches(stream, read_tables([plan], data), count):
        for (table, key), (old, new) in batch.items():
            duck_apply(con, data, table, key, new)
            for interp in interps.values():
                if old is None:
                    interp.insert(table, new)
                elif new is None:
                    interp.delete(table, old)
                else:
                    interp.update(table, old, new)
            want = recomputed(con, select)
            for depth, interp in interps.items():
                try:
                    got = [tuple(row.values()) for row in interp.view(name)]
                    assert_rows(name, plan.output, got, want, approx)
                except AssertionError:
                    print(f"--depth {depth}: {select}\n{print_program(programs[depth])}")
                    raise
            seen += nonempty(want)
    for interp in interps.values():
        check_definitions(interp)
    return seen


# === every mode on a cluster =====================================================================

_runs = itertools.count()


def prefixed(select: str, prefix: str, data: Dataset) -> str:
    """``select`` over the tables named ``prefix``+name (each under its old name as alias)."""
    tree = sqlglot.parse_one(select)
    for table in list(tree.find_all(exp.Table)):
        if table.name in data.columns:
            if not table.alias:
                table.set("alias", exp.TableAlias(this=exp.to_identifier(table.name)))
            table.set("this", exp.to_identifier(prefix + table.name))
    return tree.sql()


def commit(client: Client, prefix: str, batch: Batch, data: Dataset) -> None:
    with client.transaction() as tx:
        for (table, key), (old, new) in batch.items():
            row_key = dict(zip(data.primary_keys[table], key, strict=True))
            if old is None:
                tx.insert(prefix + table, new)
            elif new is None:
                tx.delete(prefix + table, row_key)
            elif changed := {c: v for c, v in new.items() if old[c] != v}:
                tx.update(prefix + table, row_key, changed)


def writers(address: str, prefix: str, stream: Stream, tables: list[str]) -> None:
    """Three clients, three transactions each, concurrently; a batch drawn from ``stream``
    may meet a row another client deleted or inserted first (nothing applied then)."""
    lock, failures = threading.Lock(), []

    def work() -> None:
        with Client(address) as client:
            for _ in range(3):
                with lock:
                    batch = stream.batch(tables)
                try:
                    commit(client, prefix, batch, stream.data)
                except (errors.RowNotFound, errors.AlreadyExists):
                    pass
                except BaseException as exc:  # noqa: BLE001 - reported below
                    failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures


def every_mode_equals_duckdb(
    cluster: LocalCluster,
    data: Dataset,
    name: str,
    select: str,
    seed: int,
    modes: tuple[str, ...] = ("sync", "async", "cumulus"),
    approx: Collection[str] = (),
) -> list[int]:
    """``select`` as a sync, an async and a cumulus view (2 DW nodes; ``modes``: those of
    them) equals duckdb over a snapshot of the tables as created (an initial load with
    children first) and after each of two rounds of concurrent writers; returns the number of
    rows each time."""
    prefix = f"{data.name}{next(_runs)}_"
    plans = compile_sql_views(create(name, select, "sync"), data.schemas.__getitem__)
    plan, tables = plans[-1], read_tables(plans, data)
    stream = Stream(random.Random(seed), data)
    views = {mode: f"{prefix}{name}_{mode}" for mode in modes}
    options = {
        "sync": "refresh = 'sync'",
        "async": "refresh = 'async', interval_ms = 60000",
        "cumulus": "refresh = 'cumulus', nodes = 2, epoch_ms = 60000",
    }
    sizes = []
    with Client(cluster.address) as client:
        for table in tables:
            client.sql(data.ddl(table).replace(f"TABLE {table} (", f"TABLE {prefix}{table} (", 1))
        for batch in stream.initial(tables):
            commit(client, prefix, batch, data)
        for mode, view in views.items():
            client.sql(
                f"CREATE MATERIALIZED VIEW {view} WITH ({options[mode]}) AS "
                + prefixed(select, prefix, data)
            )
        for round_number in range(-1, 2):  # -1: as created
            if round_number >= 0:
                writers(cluster.address, prefix, stream, tables)
            for mode in ("async", "cumulus"):
                if mode in views:
                    client.refresh(views[mode])
            con = duck(data)
            with client.snapshot() as snapshot:  # no write since: every view at this state
                for table in tables:
                    stream.live[table] = {}
                    for row in snapshot.scan(prefix + table):
                        key = tuple(row[c] for c in data.primary_keys[table])
                        stream.live[table][key] = dict(row)
                        duck_apply(con, data, table, key, dict(row))
            want = recomputed(con, select)
            for view in views.values():
                got = [tuple(row.values()) for row in client.view(view)]
                assert_rows(name, plan.output, got, want, approx)
            sizes.append(len(want))
        for view in views.values():
            client.sql(f"DROP MATERIALIZED VIEW {view}")
    return sizes
