"""What higher-order delta compilation buys per update: 10^5 one-row updates of the dashboard
schema (``loadgen/dashboard.py``) replayed through

* the reference interpreter running the full M3 program of the view (every delta materialized),
* the same with ``--depth 1`` (first-order IVM: deltas joined against the relations),
* our sync view path without a cluster: ``cumulus.delta.view_delta`` over in-memory tables and
  indexes, merged into in-memory view rows (``aggview.merge``), i.e. the refresh computation a
  sync view runs inside every writing transaction,

for the view ``bench/views.py`` measures (cost and events per category name). The static tables
(20 categories, 5,000 products) are loaded first, untimed; then the stream: 94 % new events, 3 %
corrections of an event (an UPDATE: a delete and an insert), 2 % deletes of an event, 0.9 %
products moved to another category, 0.1 % categories renamed. The events table grows from 0 to
about 90,000 rows over the run. Work per update is counted as map entries read (M3) and base rows
joined (the view path), in the first and the last tenth of the stream: seed 003 claims that the
full program's work per update is constant in the size of the tables.

    python -m bench.m3                      # about 15 seconds on 2 cores
    python -m bench.m3 --updates 20000      # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlglot

from aggview.keycodec import encode_key
from aggview.merge import merge
from aggview.schema import TableSchema, row_to_storage
from coordinator.catalog import table_from_create
from cumulus.aggstate import ViewState
from cumulus.delta import Changes, view_delta
from cumulus.m3.compiler import compile_program, plan_of
from cumulus.m3.interpreter import Interpreter
from cumulus.plan import ViewPlan
from loadgen import dashboard

VIEW_SQL = (  # bench/views.py's CATEGORY_SQL (not imported: that module starts clusters)
    "SELECT c.name, SUM(e.cost), COUNT(*) FROM events e JOIN products p ON e.prod_id = p.id "
    "JOIN categories c ON p.cat_id = c.id GROUP BY c.name"
)
DAY = datetime.date(2011, 6, 1)
Update = tuple[str, str, dict[str, Any] | None, dict[str, Any] | None]  # kind, table, old, new


def schemas() -> dict[str, TableSchema]:
    found = [table_from_create(sqlglot.parse_one(ddl), lambda n: n) for ddl in dashboard.TABLES]
    return {s.name: s for s in found}


def static_rows(scale: dashboard.Scale) -> list[tuple[str, dict[str, Any]]]:
    rows: list[tuple[str, dict[str, Any]]] = [
        ("categories", {"id": i, "name": f"category {i}", "parent": None})
        for i in range(scale.categories)
    ]
    for i in range(scale.products):
        product = {"id": i, "shop_id": i % scale.shops, "cat_id": i % scale.categories}
        rows.append(("products", {**product, "name": f"product {i}"}))
    return rows


def stream(count: int, scale: dashboard.Scale, seed: int) -> list[Update]:
    rng = random.Random(seed)
    events: list[dict[str, Any]] = []
    products = {r["id"]: r for t, r in static_rows(scale) if t == "products"}
    categories = {r["id"]: r for t, r in static_rows(scale) if t == "categories"}
    out: list[Update] = []
    next_id = 0
    for _ in range(count):
        roll = rng.random()
        if roll < 0.94 or len(events) < 10:
            row = {**dashboard.event(rng, next_id, scale), "day": DAY}
            next_id += 1
            events.append(row)
            out.append(("insert event", "events", None, row))
        elif roll < 0.97:
            i = rng.randrange(len(events))
            new = {**events[i], **dashboard.correction(rng, scale)}
            out.append(("correct event", "events", events[i], new))
            events[i] = new
        elif roll < 0.99:
            i = rng.randrange(len(events))
            events[i], events[-1] = events[-1], events[i]
            out.append(("delete event", "events", events.pop(), None))
        elif roll < 0.999:
            old = products[rng.randrange(scale.products)]
            new = {**old, "cat_id": rng.randrange(scale.categories)}
            out.append(("move product", "products", old, new))
            products[old["id"]] = new
        else:
            old = categories[rng.randrange(scale.categories)]
            new = {**old, "name": f"category {old['id']} v{rng.randrange(1000)}"}
            out.append(("rename category", "categories", old, new))
            categories[old["id"]] = new
    return out


@dataclass
class Result:
    name: str
    seconds: float = 0.0
    work_first: float = 0.0  # per update, first tenth of the stream
    work_last: float = 0.0  # per update, last tenth
    by_kind: dict[str, float] = field(default_factory=dict)  # per update of each kind
    sizes: dict[str, int] = field(default_factory=dict)
    rows: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # the view, for checking


class _Meter:
    """Work (a counter the implementation keeps) per update: by kind, and in the first and the
    last tenth of the stream."""

    def __init__(self, updates: list[Update], work: Callable[[], int]) -> None:
        self.updates, self.work = updates, work
        self.tenth = max(len(updates) // 10, 1)
        self.totals: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.first = self.last = 0
        self.start = time.perf_counter()

    def record(self, n: int, kind: str, before: int) -> None:
        spent = self.work() - before
        self.totals[kind] = self.totals.get(kind, 0) + spent
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if n < self.tenth:
            self.first += spent
        elif n >= len(self.updates) - self.tenth:
            self.last += spent

    def finish(self, result: Result) -> Result:
        result.seconds = time.perf_counter() - self.start
        result.work_first, result.work_last = self.first / self.tenth, self.last / self.tenth
        result.by_kind = {k: self.totals[k] / self.counts[k] for k in self.totals}
        return result


def run_m3(
    plan: ViewPlan,
    tables: dict[str, TableSchema],
    scale: dashboard.Scale,
    updates: list[Update],
    depth: int | None,
) -> Result:
    program = compile_program([plan], tables.__getitem__, depth)
    interp = Interpreter(program)
    for table, row in static_rows(scale):
        interp.insert(table, row)

    meter = _Meter(updates, lambda: interp.counter[0])
    for n, (kind, table, old, new) in enumerate(updates):
        before = interp.counter[0]
        if old is None:
            interp.insert(table, new)  # type: ignore[arg-type]
        elif new is None:
            interp.delete(table, old)
        else:
            interp.update(table, old, new)
        meter.record(n, kind, before)
    label = "M3, full program" if depth is None else f"M3, --depth {depth}"
    result = meter.finish(Result(label))
    result.sizes = interp.sizes() | {f"({r})": len(s.data) for r, s in interp.relations.items()}
    result.rows = {r["name"]: (r["sum_cost"], r["count"]) for r in interp.view(plan.name)}
    return result


class MemoryTables:
    """The base tables in storage form, with an index per column the plans join or look up
    on: what the view path's ``rows_where`` reads from LTMs, here from memory (a column
    without an index is a scan, counted as one). ``bench.view_joins`` uses it too."""

    def __init__(self, tables: dict[str, TableSchema], plans: Sequence[ViewPlan]) -> None:
        self.schemas = tables
        self.rows: dict[str, dict[bytes, dict[str, Any]]] = {t: {} for t in tables}
        self.columns = sorted({c for p in plans for c in p.join_columns() if c[0] in tables})
        self.index: dict[tuple[str, str], dict[Any, dict[bytes, dict[str, Any]]]] = {
            c: {} for c in self.columns
        }
        self.read = 0

    def key(self, table: str, row: dict[str, Any]) -> bytes:
        schema = self.schemas[table]
        return encode_key(schema.key_types, [row[c] for c in schema.primary_key])

    def put(
        self, table: str, key: bytes, old: dict[str, Any] | None, new: dict[str, Any] | None
    ) -> None:
        for t, column in self.columns:
            if t != table:
                continue
            if old is not None:
                self.index[(t, column)].get(old[column], {}).pop(key, None)
            if new is not None:
                self.index[(t, column)].setdefault(new[column], {})[key] = new
        if new is None:
            self.rows[table].pop(key, None)
        else:
            self.rows[table][key] = new

    async def rows_where(
        self, table: str, column: str | None, values: list[Any]
    ) -> dict[Any, list[tuple[bytes, dict[str, Any]]]]:
        if column is None:  # a scan step
            self.read += len(self.rows[table])
            return {None: list(self.rows[table].items())}
        if (table, column) not in self.index:
            rows = self.rows[table].items()
            found = {v: [(k, r) for k, r in rows if r.get(column) == v] for v in values}
            self.read += len(rows)
            return found
        index = self.index[(table, column)]
        found = {v: list(index.get(v, {}).items()) for v in values}
        self.read += sum(len(rows) for rows in found.values())
        return found


def run_view_path(
    plan: ViewPlan, tables: dict[str, TableSchema], scale: dashboard.Scale, updates: list[Update]
) -> Result:
    view = ViewState(plan, tables.__getitem__)
    memory = MemoryTables(tables, [plan])
    state: dict[bytes, dict[str, Any]] = {}

    async def change(table: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        schema = tables[table]
        before = row_to_storage(schema, old) if old is not None else None
        after = row_to_storage(schema, new) if new is not None else None
        key = memory.key(table, before or after)  # type: ignore[arg-type]
        changes: Changes = {table: {key: (before, after)}}
        for group, delta in (await view_delta(view, changes, memory.rows_where)).items():
            merged = merge(state.get(group), delta)
            if merged is None:
                state.pop(group, None)
            else:
                state[group] = merged
        memory.put(table, key, before, after)

    async def replay() -> Result:
        for table, row in static_rows(scale):
            await change(table, None, row)
        meter = _Meter(updates, lambda: memory.read)
        for n, (kind, table, old, new) in enumerate(updates):
            before = memory.read
            await change(table, old, new)
            meter.record(n, kind, before)
        return meter.finish(Result("sync view path (view_delta + merge)"))

    result = asyncio.run(replay())
    for key, fields in state.items():
        row = view.finalize(key, fields)
        if row is not None:
            result.rows[row["name"]] = (row["sum_cost"], row["count"])
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.m3", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--updates", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    scale = dashboard.Scale()
    tables = schemas()
    plan = plan_of(VIEW_SQL, "cost_by_category", tables.__getitem__)
    updates = stream(args.updates, scale, args.seed)
    kinds: dict[str, int] = {}
    for kind, *_ in updates:
        kinds[kind] = kinds.get(kind, 0) + 1
    print(f"{len(updates):,} one-row updates: " + ", ".join(f"{n:,} {k}" for k, n in kinds.items()))
    print(f"view: {VIEW_SQL}\n")
    results = [
        run_m3(plan, tables, scale, updates, None),
        run_m3(plan, tables, scale, updates, 1),
        run_view_path(plan, tables, scale, updates),
    ]
    print(f"{'':38} {'updates/s':>10}   work per update: first 10 %, last 10 % of the stream")
    for r in results:
        unit = "map entries read" if r.name.startswith("M3") else "base rows joined"
        print(
            f"{r.name:38} {len(updates) / r.seconds:>10,.0f}   "
            f"{r.work_first:8.2f} {r.work_last:8.2f}  {unit}"
        )
    print(f"\n{'work per update, by kind':38} " + " ".join(f"{k:>16}" for k in kinds))
    for r in results:
        print(f"{r.name:38} " + " ".join(f"{r.by_kind.get(k, 0):16.1f}" for k in kinds))
    for r in results:
        if r.sizes:
            shown = ", ".join(f"{name} {size:,}" for name, size in r.sizes.items())
            print(f"\nmap sizes, {r.name}: {shown}")
    same = all(r.rows == results[0].rows for r in results)
    print(f"\nthe three agree on the view ({len(results[0].rows)} groups): {same}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
