"""TPC-W at a small scale on a cluster of its own: one short run of the ordering mix whose report
must match the rows in the tables and whose views must equal a recomputation, bad input refused
before anything is loaded, and a Ctrl-C that still writes the report."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from rich.console import Console

from aggclient import Client
from aggclient.bulk_client import BulkClient
from agglauncher.cluster import LocalCluster
from aggview import errors
from aggview.processes import free_port
from coordinator.adhoc import load_rows
from loadgen import modes_bench, tpcw, tpcw_bench, tpcw_population

pytest.importorskip("pyspark")

SMALL = {"browsers": 2, "items": 1000, "customers_per_browser": 10, "seed": 3}


def arguments(**overrides: Any) -> argparse.Namespace:
    """The bench's defaults (as ``aggview bench tpcw`` parses them) with overrides."""
    parser = argparse.ArgumentParser()
    tpcw_bench.add_arguments(parser)
    args = parser.parse_args([])
    for name, value in overrides.items():
        setattr(args, name, value)
    return args


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Iterator[dict[str, Any]]:
    """A populated cluster after one 5-second ordering run (3 s reached no Buy Confirm on a
    loaded machine): its address and the report."""
    base = tmp_path_factory.mktemp("tpcw")
    cluster = LocalCluster(base / "data", ltms=3, fsync=False)
    try:
        cluster.start()
        out = base / "report"
        args = arguments(
            address=cluster.address,
            mix="ordering",
            seconds=5.0,
            view_mode="mixed",
            interval_ms=200,
            out=str(out),
            **SMALL,
        )
        report = tpcw_bench.run(args, {})
        data = json.loads((out / "tpcw.json").read_text())
        yield {"cluster": cluster, "report": report, "data": data, "out": out}
    finally:
        cluster.stop()
        cluster.kill()


def test_committed_interactions_match_the_rows_written(shop: dict[str, Any]) -> None:
    data, results = shop["data"], shop["data"]["results"]
    assert not shop["report"].interrupted and not data["interrupted"]
    rows = {row["interaction"]: row for row in data["rows"]}
    assert set(rows) == {*tpcw.INTERACTIONS, "all"}
    assert rows["all"]["count"] == sum(rows[name]["count"] for name in tpcw.INTERACTIONS) > 0
    assert rows["all"]["errors"] == 0 and results["written"]["unknown"] == 0
    assert rows["Buy Confirm"]["committed"] > 0 and rows["all"]["per_s"] > 0
    assert all(
        rows[name]["committed"] == 0 for name in tpcw.INTERACTIONS if name not in tpcw.WRITING
    )
    assert results["consistency"]["ok"], results["consistency"]

    scale = tpcw.Scale(SMALL["browsers"], SMALL["items"], SMALL["customers_per_browser"])
    with Client(shop["cluster"].address) as client:
        orders = [r for r in client.scan("orders") if r["o_id"] >= tpcw.ID_BLOCK]
        lines = [r for r in client.scan("order_line") if r["ol_o_id"] >= tpcw.ID_BLOCK]
        payments = {
            r["cx_o_id"]: r for r in client.scan("cc_xacts") if r["cx_o_id"] >= tpcw.ID_BLOCK
        }
        customers = client.scan("customer")
        stock = {r["i_id"]: r["i_stock"] for r in client.scan("item")}
    # Buy Confirm: one order, its lines and its payment per commit, nothing else
    assert len(orders) == rows["Buy Confirm"]["committed"] == results["written"]["orders"]
    assert len(lines) == results["written"]["order_lines"]
    assert {o["o_id"] for o in orders} == {line["ol_o_id"] for line in lines} == set(payments)
    assert all(payments[o["o_id"]]["cx_xact_amt"] == o["o_total"] for o in orders)
    # Customer Registration: one new customer per commit
    assert len(customers) - scale.customers == rows["Customer Registration"]["committed"]
    # stock: each item lost what the new lines ordered and gained 21 per restock (TPC-W)
    initial = {
        row["i_id"]: row["i_stock"]
        for table, row in tpcw_population.population(scale, SMALL["seed"], data_day(shop))
        if table == "item"
    }
    ordered = Counter()
    for line in lines:
        ordered[line["ol_i_id"]] += line["ol_qty"]
    restocks = 0
    for i_id, before in initial.items():
        gained = stock[i_id] - before + ordered[i_id]
        assert gained >= 0 and gained % tpcw.RESTOCK == 0, (i_id, before, stock[i_id])
        restocks += gained // tpcw.RESTOCK
        assert stock[i_id] >= 0
    assert restocks == results["written"]["restocks"]
    assert sum(ordered.values()) == results["written"]["units"]


def data_day(shop: dict[str, Any]) -> datetime.date:
    """The day the population was generated (its random draws depend on it)."""
    return datetime.date.fromisoformat(shop["data"]["results"]["population"]["day"])


# the columns the views read, with their types in the cluster
VIEW_COLUMNS = {
    "item": "i_id BIGINT, i_subject TEXT, i_cost DECIMAL(10,2)",
    "shopping_cart_line": "scl_sc_id BIGINT, scl_i_id BIGINT, scl_qty BIGINT",
    "orders": "o_c_id BIGINT, o_id BIGINT, o_total DECIMAL(15,2)",
    "order_line": "ol_o_id BIGINT, ol_i_id BIGINT, ol_qty BIGINT",
}


def recompute(client: Client) -> duckdb.DuckDBPyConnection:
    """duckdb over snapshot scans of the views' base tables: their queries run as written."""
    con = duckdb.connect()
    for table, columns in VIEW_COLUMNS.items():
        con.execute(f"CREATE TABLE {table} ({columns})")
        names = [part.split()[0] for part in columns.split(", ")]
        rows = [tuple(row[c] for c in names) for row in client.scan(table)]
        if rows:
            load_rows(con, table, rows)
    return con


def test_views_equal_their_recomputation(shop: dict[str, Any]) -> None:
    verification = shop["data"]["results"]["verification"]
    assert [v["view"] for v in verification] == list(tpcw.VIEWS)
    assert all(v["ok"] and v["differences"] == 0 for v in verification), verification
    with Client(shop["cluster"].address) as client:
        for name, mode in tpcw.MIXED_MODES.items():
            if mode == "async":
                client.refresh(name)
        con = recompute(client)  # no writer runs now: the same state as the views
        for name in tpcw.VIEWS:
            maintained = sorted((tuple(r.values()) for r in client.view(name)), key=repr)
            assert maintained == sorted(con.execute(tpcw.VIEWS[name]).fetchall(), key=repr), name
    groups = {v["view"]: v["groups"] for v in verification}
    # every subject sold at least once is a group (a tiny population may leave one unsold)
    assert len(tpcw.SUBJECTS) // 2 < groups["sales_by_subject"] <= len(tpcw.SUBJECTS)


def test_the_report_files_and_summary(shop: dict[str, Any]) -> None:
    out: Path = shop["out"]
    for name in ("tpcw.json", "tpcw.csv", "tpcw-throughput.png", "tpcw-latency-p99.png"):
        assert (out / name).stat().st_size > 0, name
    header = (out / "tpcw.csv").read_text().splitlines()[0].split(",")
    assert {"interaction", "per_s", "aborts", "p50_ms", "p99_ms"} <= set(header)
    assert tpcw_bench.passed(out)
    settings = shop["data"]["settings"]
    assert settings["mix"] == "ordering" and settings["browsers"] == SMALL["browsers"]


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"mix": "checkout"}, errors.InvalidArgument, "unknown mix 'checkout'"),
        ({"view_mode": "lazy"}, errors.InvalidArgument, "unknown view mode 'lazy'"),
        ({"browsers": 0}, errors.InvalidArgument, "browsers must be between 1"),
        ({"items": 500}, errors.InvalidArgument, "items must be between 1,000 and 100,000"),
        ({"seconds": 0}, errors.InvalidArgument, "seconds must be > 0"),
        ({"think_ms": -1}, errors.InvalidArgument, "think-ms must be >= 0"),
        ({"ltms": 0}, errors.InvalidArgument, "ltms must be between 1"),
    ],
)
def test_bad_input_is_refused_before_anything_starts(
    tmp_path: Path, overrides: dict[str, Any], error: type[Exception], message: str
) -> None:
    out = tmp_path / "report"
    started = time.monotonic()
    with pytest.raises(error, match=message):
        tpcw_bench.run(arguments(out=str(out), **overrides), {})
    assert time.monotonic() - started < 5 and not out.exists()


def test_an_unreachable_cluster_is_refused_before_any_load(tmp_path: Path) -> None:
    out = tmp_path / "report"
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(errors.Unavailable, match=f"cannot reach an aggview cluster at {address}"):
        tpcw_bench.run(arguments(address=address, out=str(out), **SMALL), {})
    assert not out.exists()


def test_a_population_of_another_size_is_refused(shop: dict[str, Any], tmp_path: Path) -> None:
    address = shop["cluster"].address
    with Client(address) as client:
        before = len(client.scan("customer"))
    other = {**SMALL, "browsers": 3}
    with pytest.raises(errors.InvalidArgument, match="holds a TPC-W population of 1,000 items"):
        tpcw_bench.run(arguments(address=address, out=str(tmp_path / "r"), **other), {})
    with Client(address) as client:
        assert len(client.scan("customer")) == before


def test_ctrl_c_stops_the_run_and_still_writes_the_report(
    shop: dict[str, Any], tmp_path: Path
) -> None:
    """A second run on the same population, interrupted by SIGINT once its load is going."""
    address = shop["cluster"].address
    out = tmp_path / "report"
    with Client(address) as client:
        runs = client.get("tpcw_meta", {"name": "runs"})["value"]  # type: ignore[index]

    def interrupt() -> None:
        with Client(address) as client:
            deadline = time.monotonic() + 60
            while client.get("tpcw_meta", {"name": "runs"})["value"] == runs:  # type: ignore[index]
                if time.monotonic() > deadline:
                    return
                time.sleep(0.05)
        time.sleep(4.0)  # the run claimed its ids: the browsers start (slowly on a loaded machine)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=interrupt)
    thread.start()
    started = time.monotonic()
    try:
        report = tpcw_bench.run(
            arguments(address=address, mix="shopping", seconds=60.0, out=str(out), **SMALL), {}
        )
    finally:
        thread.join()
    assert time.monotonic() - started < 45
    assert report.interrupted
    data = json.loads((out / "tpcw.json").read_text())
    assert data["interrupted"] and data["results"]["verification"] == "skipped: interrupted"
    assert data["results"]["measured_seconds"] < 30
    assert data["results"]["consistency"]["ok"], data["results"]["consistency"]
    assert data["rows"][-1]["interaction"] == "all" and data["rows"][-1]["count"] > 0


def test_the_ordering_mix_over_cumulus_views_switched_live(
    shop: dict[str, Any], tmp_path: Path
) -> None:
    """A run with every view in cumulus mode on the same population: the views switch live
    from the mixed modes (ALTER ... SET), the interactions run against them, and every view
    verifies against Spark's recomputation at an epoch."""
    address = shop["cluster"].address
    out = tmp_path / "cumulus"
    args = arguments(
        address=address,
        mix="ordering",
        seconds=2.0,
        view_mode="cumulus",
        interval_ms=200,
        out=str(out),
        **SMALL,
    )
    tpcw_bench.run(args, {})
    data = json.loads((out / "tpcw.json").read_text())
    verification = data["results"]["verification"]
    assert [v["view"] for v in verification] == list(tpcw.VIEWS)
    assert all(v["ok"] and v["differences"] == 0 for v in verification), verification
    assert data["results"]["consistency"]["ok"], data["results"]["consistency"]
    with Client(address) as client:
        for name in tpcw.VIEWS:
            plan = BulkClient(client).describe(name).plan or {}
            assert (plan["mode"], plan["interval_ms"]) == ("cumulus", 200), name


def test_the_comparison_runs_the_ordering_mix_in_each_mode(
    shop: dict[str, Any], tmp_path: Path
) -> None:
    """``aggview bench modes``' TPC-W part: one run per view mode on one population, each
    verified, and its table."""
    scale = {k: v for k, v in SMALL.items() if k != "seed"}
    address = shop["cluster"].address
    rows = modes_bench.run_tpcw(1.0, address, tmp_path, ("async", "cumulus"), scale)
    assert [r["views"] for r in rows] == ["async", "cumulus"]
    assert all(r["wips"] > 0 and r["verified"] for r in rows), rows
    assert json.loads((tmp_path / "tpcw_modes.json").read_text()) == rows
    console = Console(record=True, width=120)
    modes_bench.print_tpcw(rows, console)
    assert "cumulus" in console.export_text()
