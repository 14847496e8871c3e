"""Checkpoint throughput: rows per second an LTM's checkpoint writes to a store.

A checkpoint (``ltm.participant.Participant.checkpoint``) makes one ``store.write`` call with
every dirty row: puts of ``encode_stored(ts, row, lsn)`` values across the tables it touched
(base tables, views, change tables), plus deletes of drained change rows. This replays that
call shape, ``--rounds`` times over the same keys (a checkpoint rewrites rows), against:

* SQLite (the embedded store, a file in a temp dir): batched = one ``write`` per checkpoint (one
  transaction); unbatched = one ``write`` per row;
* HBase through the Thrift TEST FIXTURE (``tests/hbase_thrift_fixture.py``, started as a
  subprocess so client and server do not share one interpreter lock), or a real HBase with
  ``--hbase URL``: batched = ``mutateRows`` of ``--batch-size`` rows; unbatched = one call per
  row (``batch_size=0``).

The fixture is an in-memory Python server: its figures measure the adapter, happybase and the
Thrift wire, not HBase's own write path.

    python -m bench.checkpoint [--rows 10000] [--rounds 3] [--hbase hbase://host:9090]
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from aggview.keycodec import encode_key
from aggview.rowcodec import encode_stored
from aggview.schema import ColumnType
from ltm.store import Store, open_store
from ltm.store.base import Mutation
from ltm.store.hbase import HBaseStore

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "hbase_thrift_fixture.py"
INT = ColumnType("INT")
# the tables one checkpoint typically covers: a base table, a view, a change table
TABLES = ("bench_base", "bench_view", "bench_changes")

out = Console(width=None if sys.stdout.isatty() else 120)


@dataclass
class Result:
    store: str
    batching: str
    rows: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def checkpoint_batch(rows: int, round_no: int, rng: random.Random) -> list[Mutation]:
    """One checkpoint's mutations: rows spread over the tables like an LTM's dirty set, values
    as the LTM stores them; every 20th change row is a drained one (deleted)."""
    mutations: list[Mutation] = []
    for i in range(rows):
        table = TABLES[i % len(TABLES)]
        key = encode_key([INT], [i])
        if table == "bench_changes" and i % 20 == 0:
            mutations.append((table, key, None))
            continue
        row = {"id": i, "owner": f"owner {rng.randrange(1000)}", "balance": rng.randrange(10**9)}
        mutations.append((table, key, encode_stored(1000 + round_no, row, i + 1)))
    return mutations


def measure(
    store: Store, name: str, batching: str, rows: int, rounds: int, per_row: bool
) -> Result:
    for table in TABLES:
        store.drop_table(table)
        store.create_table(table)
    rng = random.Random(1)
    batches = [checkpoint_batch(rows, r, rng) for r in range(rounds)]
    started = time.perf_counter()
    for mutations in batches:
        if per_row:
            for mutation in mutations:
                store.write([mutation])
        else:
            store.write(mutations)
    elapsed = time.perf_counter() - started
    for table in TABLES:
        store.drop_table(table)
    return Result(name, batching, rows * rounds, elapsed)


@contextmanager
def fixture_server() -> Iterator[str]:
    """The Thrift test fixture in a child process; yields its hbase:// URL."""
    proc = subprocess.Popen(
        [sys.executable, str(FIXTURE), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"listening on (\S+)", line)
        if not match:
            raise RuntimeError(f"the HBase Thrift fixture did not start: {line!r}")
        yield f"hbase://{match.group(1)}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(rows: int, rounds: int, batch_size: int, hbase_url: str | None) -> list[Result]:
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="aggview-bench-") as tmp:
        with open_store(f"sqlite://{tmp}/store.db") as sqlite:
            results.append(measure(sqlite, "sqlite", "one write", rows, rounds, False))
            results.append(measure(sqlite, "sqlite", "write per row", rows, rounds, True))

    def hbase_runs(url: str, name: str) -> None:
        sep = "&" if "?" in url else "?"
        variants: list[tuple[str, int]] = [(f"mutateRows x{batch_size}", batch_size)]
        variants.append(("call per row", 0))
        for label, size in variants:
            with open_store(f"{url}{sep}batch_size={size}") as store:
                assert isinstance(store, HBaseStore)
                results.append(measure(store, name, label, rows, rounds, False))

    if hbase_url:
        hbase_runs(hbase_url, "hbase")
    else:
        with fixture_server() as url:
            hbase_runs(url, "hbase fixture")
    return results


def report(results: list[Result]) -> None:
    base = results[0].rate
    table = Table(title="checkpoint writes (rows/s)")
    for column in ("store", "batching", "rows", "seconds", "rows/s", "vs sqlite batched"):
        table.add_column(column, justify="left" if column in ("store", "batching") else "right")
    for r in results:
        table.add_row(
            r.store,
            r.batching,
            f"{r.rows}",
            f"{r.seconds:.2f}",
            f"{r.rate:,.0f}",
            f"{r.rate / base:.2f}x" if base else "-",
        )
    out.print(table)
    by_store: dict[str, list[Result]] = {}
    for r in results:
        by_store.setdefault(r.store, []).append(r)
    for store, (batched, unbatched) in ((s, rs[:2]) for s, rs in by_store.items()):
        gain = batched.rate / unbatched.rate if unbatched.rate else float("inf")
        out.print(f"{store}: batching is {gain:.1f}x faster than no batching")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000, help="rows per checkpoint")
    parser.add_argument("--rounds", type=int, default=3, help="checkpoints per measurement")
    parser.add_argument("--batch-size", type=int, default=1000, help="rows per mutateRows")
    parser.add_argument("--hbase", help="a real HBase (hbase://host:9090) instead of the fixture")
    args = parser.parse_args(argv)
    report(run(args.rows, args.rounds, args.batch_size, args.hbase))


if __name__ == "__main__":
    main()
