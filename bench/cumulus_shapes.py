"""The Cumulus runtime and the reference interpreter on DBToaster-like query shapes other than
``bench.cumulus``'s dashboard star join: a TPC-H Q3-like three-way join grouped by two
columns (customers, orders, line items) and an order book (DBToaster's AXFinder: bids and asks
joined on the broker, a price spread as an OR guard across the two tables). Each shape's view is
compiled to its full M3 program; a seeded stream of one-row inserts and deletes is replayed

* through the reference interpreter alone (``Interpreter.apply``), and
* through the simulator (one switch, speculative, every message 1 virtual ms, an epoch every
  1,000 virtual ms) on 1 and 2 DW nodes, ``--batch N`` updates per switch message,

reporting updates/s of wall clock and CPU ms per update (``time.process_time``). The
simulator's final maps are compared, untimed, with the interpreter's; a difference stops the run.

It imports nothing of ``bench``, so the same file measures an older checkout too, run from that
checkout's directory (its packages win)::

    python -m bench.cumulus_shapes --updates 20000
    cp bench/cumulus_shapes.py /tmp/ && cd /tmp/old && PYTHONPATH=. python /tmp/cumulus_shapes.py
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import sqlglot

from coordinator.catalog import table_from_create
from cumulus.m3.compiler import compile_program, plan_of
from cumulus.m3.interpreter import Interpreter
from cumulus.m3.program import Program
from cumulus.runtime.simulator import Network, Simulator

Update = tuple[str, str, list[Any]]

Q3_TABLES = [
    "CREATE TABLE customer (custkey INT PRIMARY KEY, name TEXT, nation INT)",
    "CREATE TABLE orders (ordkey INT PRIMARY KEY, custkey INT NOT NULL, sprior INT)",
    "CREATE TABLE lineitem (id INT PRIMARY KEY, ordkey INT NOT NULL, "
    "extprice DECIMAL(12,2) NOT NULL)",
]
Q3_SQL = (
    "SELECT l.ordkey, o.sprior, SUM(l.extprice), COUNT(*) FROM customer c "
    "JOIN orders o ON c.custkey = o.custkey JOIN lineitem l ON l.ordkey = o.ordkey "
    "WHERE c.nation < 20 GROUP BY l.ordkey, o.sprior"
)
BOOK_TABLES = [
    "CREATE TABLE bids (id INT PRIMARY KEY, broker INT NOT NULL, price INT NOT NULL, "
    "volume INT NOT NULL)",
    "CREATE TABLE asks (id INT PRIMARY KEY, broker INT NOT NULL, price INT NOT NULL, "
    "volume INT NOT NULL)",
]
BOOK_SQL = (  # DBToaster's AXFinder
    "SELECT b.broker, SUM(a.volume - b.volume) FROM bids b JOIN asks a ON b.broker = a.broker "
    "WHERE a.price - b.price > 1000 OR b.price - a.price > 1000 GROUP BY b.broker"
)


def program_of(tables: list[str], sql: str) -> Program:
    schemas = {}
    for ddl in tables:
        schema = table_from_create(sqlglot.parse_one(ddl), lambda name: name)
        schemas[schema.name] = schema
    return compile_program([plan_of(sql, "v", schemas.__getitem__)], schemas.__getitem__)


def q3_stream(count: int, rng: random.Random) -> list[Update]:
    """Customers, then orders and line items (10 % deletes of a live line item or order)."""
    out: list[Update] = [("+", "customer", [c, f"c{c}", c % 25]) for c in range(1000)]
    orders: list[list[Any]] = []
    items: list[list[Any]] = []
    while len(out) < count:
        roll = rng.random()
        if roll < 0.25 or not orders:
            orders.append([len(out), rng.randrange(1000), rng.randrange(5)])
            out.append(("+", "orders", orders[-1]))
        elif roll < 0.9 or not items:
            price = Decimal(rng.randrange(100, 100_000)).scaleb(-2)
            items.append([len(out), rng.choice(orders[-200:])[0], price])
            out.append(("+", "lineitem", items[-1]))
        elif roll < 0.97:
            out.append(("-", "lineitem", items.pop(rng.randrange(len(items)))))
        else:
            out.append(("-", "orders", orders.pop(rng.randrange(len(orders)))))
    return out


def book_stream(count: int, rng: random.Random) -> list[Update]:
    """Orders placed (80 %) and withdrawn (20 %) on both sides, 10 brokers."""
    out: list[Update] = []
    live: list[tuple[str, list[Any]]] = []
    while len(out) < count:
        if live and rng.random() < 0.2:
            table, row = live.pop(rng.randrange(len(live)))
            out.append(("-", table, row))
            continue
        table = rng.choice(["bids", "asks"])
        row = [len(out), rng.randrange(10), rng.randrange(0, 5000), rng.randrange(1, 100)]
        live.append((table, row))
        out.append(("+", table, row))
    return out


SHAPES: dict[str, tuple[list[str], str, Callable[[int, random.Random], list[Update]]]] = {
    "q3": (Q3_TABLES, Q3_SQL, q3_stream),
    "orderbook": (BOOK_TABLES, BOOK_SQL, book_stream),
}


def measure(run: Callable[[], Any], updates: int) -> dict[str, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"updates_per_s": updates / wall, "cpu_ms_per_update": 1000 * cpu / updates}


def run_shape(
    name: str, count: int, seed: int, nodes: list[int], batch: int = 1
) -> dict[str, dict[str, float]]:
    tables, sql, make = SHAPES[name]
    program = program_of(tables, sql)
    stream = make(count, random.Random(seed))
    reference = Interpreter(program)
    figures = {"interpreter": measure(lambda: [reference.apply(*u) for u in stream], count)}
    expected = {n: dict(s.data) for n, s in reference.maps.items()}
    for n in nodes:
        batched = {"batch": batch} if batch > 1 else {}  # an older checkout has no batches
        simulator = Simulator(
            program, nodes=n, network=Network(None), epoch_every=1000.0, **batched
        )
        figures[f"simulator, {n} node(s)"] = measure(lambda s=simulator: s.run(stream), count)
        if simulator.maps() != expected:
            raise SystemExit(f"NOT VERIFIED: {name} on {n} node(s) differs from the interpreter")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nodes", default="1,2", help="DW node counts (default 1,2)")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--batch", type=int, default=1, help="the simulator's batch (default 1)")
    parser.add_argument(
        "--collector",
        choices=["servers", "default"],
        default="servers",
        help="the cyclic collector as aggview's servers run it (default) or CPython's",
    )
    args = parser.parse_args()
    if args.collector == "servers":  # aggview.loops.collect_less, spelled out: an older
        gc.set_threshold(20_000, 10, 10)  # checkout measured with this file has none
    nodes = [int(n) for n in args.nodes.split(",")]
    results = {}
    for shape in args.shapes.split(","):
        results[shape] = run_shape(shape, args.updates, args.seed, nodes, args.batch)
        for what, f in results[shape].items():
            print(
                f"{shape:10} {what:22} {f['updates_per_s']:10,.0f} updates/s "
                f"{f['cpu_ms_per_update']:8.3f} ms CPU per update",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
