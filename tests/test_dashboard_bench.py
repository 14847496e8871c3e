"""The dashboard benchmark at a small scale: its report adds up, its views stay exact, bad
input is refused before any load, and an interrupted run still writes what it measured."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from polling import wait_for

from aggclient import Client
from agglauncher.cluster import LocalCluster
from aggview import errors
from aggview.processes import free_port
from loadgen import dashboard, dashboard_bench, dashboard_report
from loadgen.consistency import Ledger, Verdict, judge

TINY = dashboard.Scale(shops=3, products=30, categories=3)


def args(**overrides: object) -> object:
    parser = __import__("argparse").ArgumentParser()
    dashboard_bench.add_arguments(parser)
    argv = ["--shops", "3", "--products", "30", "--categories", "3"]
    parsed = parser.parse_args(argv)
    for key, value in overrides.items():
        setattr(parsed, key, value)
    return parsed


def test_report_counts_match_rows_written_and_views_stay_exact(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "data", ltms=2) as cluster:
        config = dashboard_bench.settings(
            args(
                address=cluster.address,
                modes=["none", "sync", "async:50", "cumulus:50:2", "cumulus:200:2:feed20"],
                sizes=[1, 4],
                seconds=0.7,
                clients=2,
                out=str(tmp_path / "out"),
                moves=0.1,  # products move between categories under every mode's reads,
                renames=0.05,  # and categories get new names
            )
        )
        report = dashboard_bench.run_benchmark(config, {})
        with Client(cluster.address) as client:
            events = len(client.scan("events"))
    modes = (
        "none",
        "sync",
        "async 50 ms",
        "cumulus spec 50 ms x2",
        "cumulus spec 200 ms x2 feed 20 ms",
    )
    assert [(r["mode"], r["k"]) for r in report.rows] == [(m, k) for m in modes for k in (1, 4)]
    # every view mode was probed for freshness; no view, nothing to probe
    assert all((r["probes"] > 0) == (r["mode"] != "none") for r in report.rows)
    # every read of every view was the exact answer at the timestamp it said
    views = [r for r in report.rows if r["mode"] != "none"]
    assert all(r["reads"] > 0 and r["consistent"] == 1.0 and r["unknown"] == 0 for r in views)
    assert all(r["cpu_ms_per_event"] is None for r in report.rows)  # a running cluster
    assert all((r["fresh_p50_ms"] is None) == (r["mode"] == "none") for r in report.rows)
    # tentative reads, for the view read tentatively only: probed, and their share that was
    # exact at the timestamp they said reported (not 1.0 by design: the two members'
    # switches reach the nodes out of order, so a tentative read may mix timestamps)
    for r in report.rows:
        fed = r["mode"].endswith("feed 20 ms")
        assert (r["tentative_fresh_p50_ms"] is not None) == fed
        share = r["tentative_consistent"]
        assert (share is not None and 0.0 <= share <= 1.0) if fed else share is None
    # the runtime's costs, for the cumulus view only: every update goes out as messages
    for r in report.rows:
        cumulus = r["mode"].startswith("cumulus")
        assert (r["messages_per_1k"] is not None and r["messages_per_1k"] >= 1000) == cumulus
        assert (r["corrective_per_1k"] is not None) == cumulus
        assert (r["log_entries"] is not None) == cumulus
        assert (r["runtime_cpu_ms_per_update"] is not None) == cumulus
        if cumulus:  # the simulator host runs in process 0: its CPU is counted there
            assert 0 < r["runtime_cpu_ms_per_update"]
    assert all(r["verified"] for r in report.rows)
    assert events == sum(r["committed"] * r["k"] + r["probes"] for r in report.rows)
    assert all(r["aborted"] == 0 and r["tx_per_s"] > 0 for r in report.rows)
    assert all(r["moved"] > 0 for r in report.rows)
    written = dashboard_report.write_outputs(report, tmp_path / "out")
    names = {p.name for p in written}
    assert {
        "dashboard.json",
        "dashboard.csv",
        "dashboard_throughput_vs_update_size.png",
        "dashboard_fresh_p50_ms.png",
        "dashboard_messages_per_1k.png",
    } <= names
    assert all(p.stat().st_size > 0 for p in written)
    ratios = dashboard_report.ratios(report)
    assert {(r["mode"], r["k"]) for r in ratios} == {(m, k) for m in modes[1:] for k in (1, 4)}


def test_the_hot_group_case_puts_every_event_into_one_group(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "data", ltms=2) as cluster:
        config = dashboard_bench.settings(
            args(
                address=cluster.address,
                modes=["sync", "cumulus:50:2"],
                sizes=[3],
                seconds=0.5,
                clients=2,
                hot=True,
                out=str(tmp_path / "out"),
            )
        )
        report = dashboard_bench.run_benchmark(config, {})
        with Client(cluster.address) as client:
            groups = list(client.view(dashboard_bench.VIEW))
    assert all(r["verified"] and r["probes"] > 0 for r in report.rows)
    assert [(g["shop"], g["category"]) for g in groups] == [("shop 0", "category 0")]
    assert groups[0]["events"] == sum(r["committed"] * r["k"] + r["probes"] for r in report.rows)


def test_local_clusters_report_server_cpu_per_event(tmp_path: Path) -> None:
    """Each mode on a cluster of its own: the servers' CPU per event is measured (a running
    cluster's servers are not the benchmark's to look at: None)."""
    config = dashboard_bench.settings(
        args(
            modes=["none", "cumulus:50:1", "cumulus:50:1:grpc"],
            sizes=[2],
            seconds=0.5,
            clients=2,
            ltms=2,
        )
    )
    report = dashboard_bench.run_benchmark(config, {})
    modes = ["none", "cumulus spec 50 ms x1", "cumulus spec 50 ms x1 grpc"]
    assert [r["mode"] for r in report.rows] == modes
    assert all(r["verified"] and r["cpu_ms_per_event"] > 0 for r in report.rows)


def test_a_cumulus_mode_names_its_nodes_speculation_and_host_in_any_order() -> None:
    mode = dashboard_bench.Mode.parse("cumulus:100:3:spark:conservative")
    assert (mode.nodes, mode.speculation, mode.host) == (3, "conservative", "spark")
    assert mode.label == "cumulus cons 100 ms x3 spark"
    assert dashboard_bench.Mode.parse("cumulus:100").label == "cumulus spec 100 ms x2"


def test_runtime_costs_are_per_thousand_updates_between_two_counts() -> None:
    before = {
        "updates": 100,
        "messages": {"Dispatch": 150},
        "corrective": 2,
        "logs": {},
        "cpu_seconds": 0.25,
    }
    after = {
        "updates": 300,
        "messages": {"Dispatch": 450, "Push": 100},
        "corrective": 12,
        "logs": {"write_log_entries": 7, "read_log_entries": 3},
        "cpu_seconds": 0.5,
    }
    assert dashboard_bench.runtime_costs(before, after) == {
        "messages_per_1k": 2000.0,
        "corrective_per_1k": 50.0,
        "log_entries": 10,
        "runtime_cpu_ms_per_update": 1.25,
    }
    assert set(dashboard_bench.runtime_costs(None, None).values()) == {None}


def test_the_consistency_verdict_counts_a_wrong_read_and_its_error() -> None:
    """Reads judged against the exact answer at their timestamps; an injected wrong value is
    counted, with its size: here a tentative read that mixes timestamps (b's change of 15
    with a as of 14), as a cumulus view's newest values may."""
    a, b = ("shop 0", "category 0"), ("shop 1", "category 1")
    ledger = Ledger({a: (Decimal("1.00"), 1)}, baseline_ts=10)
    ledger.add(12, a, Decimal("0.50"))
    ledger.add(15, b, Decimal("2.00"))
    ledger.add(15, a, Decimal("0.25"))
    exact_reads = [
        (9, {a: (Decimal("1.00"), 1)}),  # before the baseline: the baseline
        (11, {a: (Decimal("1.00"), 1)}),
        (14, {a: (Decimal("1.50"), 2)}),
        (20, {a: (Decimal("1.75"), 3), b: (Decimal("2.00"), 1)}),
    ]
    assert judge(ledger, exact_reads) == Verdict(4, 4, Decimal(0), 0)
    wrong = (14, {a: (Decimal("1.75"), 2), b: (Decimal("2.00"), 1)})  # b is not there yet
    verdict = judge(ledger, [*exact_reads, wrong])
    assert (verdict.reads, verdict.exact, verdict.share) == (5, 4, 0.8)
    assert (verdict.max_cost_error, verdict.max_count_error) == (Decimal("2.00"), 1)


def test_moves_and_renames_carry_a_products_whole_total_to_its_new_group() -> None:
    """Events of an item count in its group of the moment; a move takes the item's total,
    baseline included, from its old group to its new one (an emptied group is gone), and a
    rename gives every group of a category its new name."""
    a, b = ("shop 0", "category 0"), ("shop 0", "category 1")
    ledger = Ledger(
        {a: (Decimal("3.00"), 2)},
        baseline_ts=10,
        placement={7: ("shop 0", 0), 8: ("shop 0", 0)},
        names={0: "category 0", 1: "category 1"},
        item_baseline={7: (Decimal("1.00"), 1), 8: (Decimal("2.00"), 1)},
    )
    ledger.add_to(12, 7, Decimal("0.50"))
    ledger.move(14, 7, 1)
    ledger.add_to(16, 7, Decimal("0.25"))
    ledger.move(18, 8, 1)
    ledger.rename(19, 1, "new")
    ledger.add_to(21, 8, Decimal("1.00"))
    exact_reads = [
        (11, {a: (Decimal("3.00"), 2)}),
        (13, {a: (Decimal("3.50"), 3)}),
        (15, {a: (Decimal("2.00"), 1), b: (Decimal("1.50"), 2)}),
        (17, {a: (Decimal("2.00"), 1), b: (Decimal("1.75"), 3)}),
        (18, {b: (Decimal("3.75"), 4)}),
        (20, {("shop 0", "new"): (Decimal("3.75"), 4)}),
        (22, {("shop 0", "new"): (Decimal("4.75"), 5)}),
    ]
    assert judge(ledger, exact_reads) == Verdict(7, 7, Decimal(0), 0)
    before_the_move = (15, {a: (Decimal("3.50"), 3)})  # item 7 still in a at 15: wrong
    verdict = judge(ledger, [*exact_reads, before_the_move])
    assert (verdict.exact, verdict.max_cost_error, verdict.max_count_error) == (
        7,
        Decimal("1.50"),
        2,
    )
    assert judge(ledger, [(20, {b: (Decimal("3.75"), 4)})]).exact == 0  # the old name


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"modes": ["fast"]}, "unknown mode 'fast'"),
        ({"moves": 0.5, "renames": 0.5}, "--moves and --renames must be"),
        ({"modes": ["async:often"]}, "interval must be an integer"),
        ({"modes": ["cumulus:100:0"]}, "the nodes must be 1..64"),
        ({"modes": ["cumulus:100:2:eager"]}, "spark, feed<ms> and depth<N>"),
        ({"modes": ["cumulus:100:2:spark:grpc:feed10:depth1:x"]}, "use none, sync"),
        ({"modes": ["cumulus:100:2:feed500"]}, "the feed interval must be 10..100"),
        ({"modes": ["sync:100"]}, "takes no interval"),
        ({"sizes": [0]}, "update size 0"),
        ({"clients": 0}, "--clients"),
        ({"seconds": -1.0}, "--seconds"),
        ({"products": 1}, "at least as many products as shops"),
        ({"processes": 0}, "--processes must be 1 or more"),
    ],
)
def test_bad_settings_are_refused_before_any_load(overrides: dict, message: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=message):
        dashboard_bench.settings(args(**overrides))


def test_an_unreachable_cluster_is_named() -> None:
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(errors.Unavailable, match=f"cluster at {address} is not reachable"):
        dashboard_bench.check_reachable(address, {})


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (Linux: /proc)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def test_ctrl_c_stops_cleanly_and_writes_what_was_measured(tmp_path: Path) -> None:
    out = tmp_path / "out"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aggcli.cli",
            "bench",
            "dashboard",
            "--modes",
            "none",
            "sync",
            "--sizes",
            "1",
            "--seconds",
            "30",
            "--clients",
            "2",
            "--shops",
            "3",
            "--products",
            "30",
            "--categories",
            "3",
            "--ltms",
            "1",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        # its first cluster is starting (inside the run, whose Ctrl-C writes the report)
        wait_for("the bench to start a cluster", lambda: children(process.pid), timeout=120)
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=180)  # a loaded machine stops slowly
    finally:
        process.kill()
    report = json.loads((out / "dashboard.json").read_text())
    assert report["interrupted"] is True, output
    assert [r["mode"] for r in report["rows"]] in ([], ["none"]), output  # not all it planned
    assert b"interrupted" in output
