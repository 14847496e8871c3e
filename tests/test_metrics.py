"""Each member's /metrics (aggview.metrics) scraped over HTTP, by hand and by a real Prometheus
server, and `aggview status` (aggclient.status) against a running cluster."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import generate_latest
from test_cli import cli

from aggclient import Client
from agglauncher.cluster import LocalCluster
from aggview.processes import free_port
from bench.metrics_share import metrics_share

ROOT = Path(__file__).resolve().parents[1]
TRANSACTIONS = 12  # the clients' transactions the module's cluster runs
SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")


GRAFANA_QUERIES = [
    target["expr"]
    for panel in json.loads(
        (Path(__file__).parent.parent / "docker" / "grafana" / "aggview.json").read_text()
    )["panels"]
    for target in panel["targets"]
]


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """A member's /metrics as {(name, labels): value}."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    samples = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and not line.startswith("#"):
            name, labels, value = match.groups()
            pairs = re.findall(r'(\w+)="([^"]*)"', labels or "")
            samples[(name, frozenset(pairs))] = float(value)
    return samples


def families(url: str) -> set[str]:
    """The metric families a member's /metrics declares (``# TYPE`` lines), samples or not."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    return set(re.findall(r"^# TYPE (\w+) ", text, flags=re.MULTILINE))


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def labelled(samples: dict, name: str) -> list[dict[str, str]]:
    return [dict(labels) for (n, labels) in samples if n == name]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two members over three partitions, each serving /metrics on a free port, with a sync
    view and an async view over a table the clients wrote ``TRANSACTIONS`` times."""
    running = LocalCluster(
        tmp_path_factory.mktemp("metrics"), ltms=3, processes=2, fsync=False, metrics_port=0
    )
    with running:
        with Client(running.address) as client:
            client.sql("CREATE TABLE sales (id INT PRIMARY KEY, shop INT, amount INT)")
            client.sql(
                "CREATE MATERIALIZED VIEW by_shop AS "
                "SELECT shop, SUM(amount) AS total FROM sales GROUP BY shop"
            )
            client.sql(
                "CREATE MATERIALIZED VIEW counts WITH (refresh = 'async', interval_ms = 100) "
                "AS SELECT shop, COUNT(*) AS n FROM sales GROUP BY shop"
            )
            client.sql(
                "CREATE MATERIALIZED VIEW epochs WITH (refresh = 'cumulus', epoch_ms = 100) "
                "AS SELECT shop, MAX(amount) AS top FROM sales GROUP BY shop"
            )
            for i in range(TRANSACTIONS):
                with client.transaction() as tx:
                    tx.insert("sales", {"id": i, "shop": i % 3, "amount": i})
        time.sleep(0.5)  # a few refreshes of the async view
        yield running


def test_every_member_serves_its_own_metrics(cluster: LocalCluster) -> None:
    urls = cluster.metrics_urls
    assert len(urls) == 2 and all(urls) and len(set(urls)) == 2
    scraped = [scrape(url) for url in urls]
    # the clients' commits, counted where they were coordinated, add up to what they ran
    client_commits = [
        value(s, "aggview_transactions_committed_total", kind="client") for s in scraped
    ]
    assert sum(client_commits) == TRANSACTIONS
    for url in urls:
        for _ in range(10):  # a refresh may commit between the two series' reads
            s = scrape(url)
            committed = sum(
                value(s, "aggview_transactions_committed_total", kind=kind)
                for kind in ("client", "system")
            )
            if value(s, "aggview_commit_latency_seconds_count") == committed:
                break
        assert value(s, "aggview_commit_latency_seconds_count") == committed
        assert value(s, "aggview_commit_latency_seconds_sum") > 0
        assert value(s, "aggview_commit_latency_seconds_bucket", le="+Inf") == committed
        # a client's commits, split in stages that add up to at most its whole latency
        stages = {
            stage: value(s, "aggview_commit_stage_seconds_count", stage=stage)
            for stage in ("timestamp", "prepare", "durable")
        }
        assert stages["timestamp"] == stages["prepare"] == stages["durable"] > 0
        assert stages["prepare"] <= committed
        after_grant = sum(
            value(s, "aggview_commit_stage_seconds_sum", stage=t) for t in ("prepare", "durable")
        )
        assert 0 < after_grant <= value(s, "aggview_commit_latency_seconds_sum") + 1e-9
        # the member's one log (its partitions' and its decisions'), no log of their own
        assert value(s, "aggview_wal_flushes_total", log="member") > 0
        assert value(s, "aggview_wal_flush_seconds_count", log="member") > 0
        assert value(s, "aggview_wal_flushes_total", log="partition") is None
        # each member knows both views, with their modes
        assert {(v["view"], v["mode"]) for v in labelled(s, "aggview_view_info")} == {
            ("by_shop", "sync"),
            ("counts", "async"),
            ("epochs", "cumulus"),
        }
        assert value(s, "aggview_view_live", view="by_shop") == 1
    # one leader; it grants the timestamps; the partitions are all held
    roles = [value(s, "aggview_member_role", role="leader") for s in scraped]
    assert roles == [1, 0]
    assert value(scraped[1], "aggview_member_role", role="follower") == 1
    assert value(scraped[0], "aggview_clock_grants_total") > 0
    assert sum(value(s, "aggview_partitions_held") for s in scraped) == 3
    # the sync view cost its writers time; the async view was refreshed somewhere, lately
    assert (
        sum(
            value(s, "aggview_view_maintenance_seconds_total", view="by_shop") or 0 for s in scraped
        )
        > 0
    )
    final = [scrape(url) for url in urls]
    refreshes = [value(s, "aggview_view_refresh_seconds_count", view="counts") or 0 for s in final]
    assert sum(refreshes) > 0
    lags = [value(s, "aggview_view_lag_seconds", view="counts") for s in final]
    assert any(lag is not None and 0 <= lag < 5 for lag in lags)
    assert all(value(s, "aggview_view_lag_seconds", view="by_shop") is None for s in final)
    for s in final:
        assert value(s, "aggview_lookup_cache_hits_total") is not None
        assert value(s, "aggview_lookup_cache_misses_total") is not None
    # the cumulus view's runtime runs at the leader: every insert fed to it, as of an epoch
    leader, follower = final
    for _ in range(50):
        if value(leader, "aggview_cumulus_updates_total", view="epochs") == TRANSACTIONS:
            break
        time.sleep(0.1)
        leader = scrape(urls[0])
    assert value(leader, "aggview_cumulus_updates_total", view="epochs") == TRANSACTIONS
    assert value(leader, "aggview_cumulus_epochs_total", view="epochs") > 0
    messages = [n for (name, _), n in leader.items() if name == "aggview_cumulus_messages_total"]
    assert messages and sum(messages) > 0
    assert value(leader, "aggview_cumulus_corrective_updates_total", view="epochs") is not None
    assert value(leader, "aggview_cumulus_cpu_seconds_total", view="epochs") > 0
    assert value(follower, "aggview_cumulus_updates_total", view="epochs") is None


def test_aborts_are_counted_by_reason(cluster: LocalCluster) -> None:
    """A condition that fails aborts the transaction after its prepare, as CONDITION_FAILED."""
    from aggclient import ConditionFailed

    with Client(cluster.address) as client:
        with pytest.raises(ConditionFailed), client.transaction() as tx:
            tx.update("sales", {"id": 0}, {"amount": 1}, require={"amount": ("==", 12345)})
    reasons = [
        value(scrape(url), "aggview_transactions_aborted_total", reason="CONDITION_FAILED")
        for url in cluster.metrics_urls
    ]
    assert sum(r or 0 for r in reasons) >= 1


def test_status_text_and_json(cluster: LocalCluster) -> None:
    done = cli("status", cluster.address)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"cluster at {cluster.address}: 2 member(s), 3 partition(s)")
    member_lines = [line for line in lines if line.startswith("member ")]
    assert len(member_lines) == 2
    assert "up  leader" in member_lines[0] and "up  follower" in member_lines[1]
    assert "partitions 0,2" in member_lines[0] and "partitions 1" in member_lines[1]
    assert "    view by_shop  sync  live" in lines
    assert any(line.startswith("    view counts  async  live") for line in lines)
    assert any(line.startswith("    view epochs  cumulus  live") for line in lines)

    done = cli("status", cluster.address, "--format", "json")
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["partitions"] == 3 and status["leader"] == 0
    members = status["members"]
    assert [m["role"] for m in members] == ["leader", "follower"]
    assert all(m["up"] for m in members)
    assert sorted(p for m in members for p in m["partitions"]) == [0, 1, 2]
    assert [m["address"] for m in members] == [s.address for s in cluster.servers]
    assert [m["metrics_port"] for m in members] == [s.metrics_port for s in cluster.servers]
    for m in members:
        modes = {v["name"]: v["mode"] for v in m["views"]}
        assert modes == {"by_shop": "sync", "counts": "async", "epochs": "cumulus"}
    for lagging in ("counts", "epochs"):  # refreshed, or an epoch run, somewhere lately
        lags = [v["lag_seconds"] for m in members for v in m["views"] if v["name"] == lagging]
        assert any(lag is not None for lag in lags), lagging


def test_status_gives_throughput_from_two_samples_and_watch_refreshes_until_ctrl_c(
    cluster: LocalCluster,
) -> None:
    """The async view's refreshes and the cumulus view's epochs commit every 100 ms at the
    leader: its throughput is above 0 between two samples."""
    done = cli("status", cluster.address, "--interval", "0.5", "--format", "json")
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["tx_per_s"] > 0 and status["members"][0]["tx_per_s"] > 0
    assert status["tx_per_s"] == sum(m["tx_per_s"] for m in status["members"])
    done = cli("status", cluster.address, "--interval", "0")
    assert "tx/s" not in done.stdout  # one sample: no throughput
    assert cli("status", cluster.address, "--watch", "--interval", "0").returncode == 2

    watching = subprocess.Popen(
        [sys.executable, "-m", "aggcli.cli", "status", cluster.address, "--watch"]
        + ["--interval", "0.3", "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watching.stdout is not None
        samples = [json.loads(watching.stdout.readline()) for _ in range(3)]
        assert all(s["tx_per_s"] is not None for s in samples)
        watching.send_signal(signal.SIGINT)
        _, err = watching.communicate(timeout=20)
    finally:
        if watching.poll() is None:
            watching.kill()
            watching.wait()
    assert watching.returncode == 0 and "Traceback" not in err, err


def test_status_of_an_unreachable_address_fails_fast_in_one_line() -> None:
    started = time.monotonic()
    done = cli("status", f"127.0.0.1:{free_port()}")
    assert time.monotonic() - started < 10  # the interpreter's start included
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("aggview: cannot reach 127.0.0.1:")


def test_start_gives_each_member_its_metrics_port(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "aggcli.cli", "start", "--data", str(tmp_path), "--ltms", "2"]
        + ["--processes", "2", "--no-fsync", "--insecure", "--metrics-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(3)]
        assert lines[0].startswith("aggview listening on "), lines
        urls = []
        for m, line in enumerate(lines[1:]):
            match = re.match(rf"member {m} metrics on (http://\S+/metrics)$", line.strip())
            assert match, lines
            urls.append(match.group(1))
        assert len(set(urls)) == 2
        s = scrape(urls[1])
        assert value(s, "aggview_member_role", role="follower") == 1
    finally:
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out


def test_no_metrics_keeps_none_and_the_cluster_works_the_same(tmp_path: Path) -> None:
    """``--no-metrics`` (what ``bench.views --without-metrics`` compares with): commits, views
    and status as ever, no /metrics served, and no series counted in memory."""
    with LocalCluster(tmp_path / "data", ltms=2, processes=2, fsync=False, metrics=False) as c:
        assert all("--no-metrics" in s.flags or "--no-metrics" in s.args for s in c.servers)
        with Client(c.address) as client:
            client.sql("CREATE TABLE t (id INT PRIMARY KEY, g INT, v INT)")
            client.sql("CREATE MATERIALIZED VIEW s AS SELECT g, SUM(v) AS total FROM t GROUP BY g")
            for i in range(6):
                client.sql(f"INSERT INTO t VALUES ({i}, {i % 2}, {i})")
            assert sorted((r["g"], r["total"]) for r in client.view("s")) == [(0, 6), (1, 9)]
        assert c.metrics_urls == ["", ""]
        done = cli("status", c.address, "--format", "json", "--interval", "0")
        assert done.returncode == 0, done.stderr
        assert [m["up"] for m in json.loads(done.stdout)["members"]] == [True, True]


def test_no_metrics_with_a_metrics_port_is_one_clear_error(tmp_path: Path) -> None:
    done = cli("start", "--data", str(tmp_path), "--no-metrics", "--metrics-port", "0")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "aggview: --no-metrics keeps no metrics: --metrics-port has none to serve"
    )
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


def test_no_metrics_counts_nothing_in_memory() -> None:
    from aggview.metrics import NoMetrics

    kept = NoMetrics()
    kept.committed(False, time.perf_counter())
    kept.wal_observer("partition")(0.001)
    kept.maintained("v", 0.5)
    kept.refreshed("v", 0.1)
    text = generate_latest(kept.registry).decode()
    counted = re.compile(r"^aggview_\w+_(total|count)(\{.*\})? [1-9]", flags=re.MULTILINE)
    assert not counted.search(text), text
    assert set(kept.lags()) == {"v"}  # status's lag still known


# --------------------------------------------------------------------- a real Prometheus


def prometheus_binary() -> str:
    """Debian's ``prometheus``, installed here when missing if this is root with apt-get (a
    minute, once per machine); else the test is skipped, saying why."""
    found = shutil.which("prometheus")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("no prometheus binary, and no root apt-get to install Debian's package")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "prometheus"],
    ):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:
            pytest.skip(f"{' '.join(command)} failed: {done.stderr.strip()[-300:]}")
    found = shutil.which("prometheus")
    if not found:
        pytest.skip("apt-get installed prometheus, but no prometheus binary is on PATH")
    return found


def test_a_real_prometheus_scrapes_every_member(cluster: LocalCluster, tmp_path: Path) -> None:
    binary = prometheus_binary()
    targets = [url.removeprefix("http://").removesuffix("/metrics") for url in cluster.metrics_urls]
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: aggview\n    static_configs:\n"
        f"      - targets: {json.dumps(targets)}\n"
    )
    port = free_port()
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        query = 'sum(aggview_transactions_committed_total{job="aggview",kind="client"})'
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
        deadline = time.monotonic() + 30
        result: list = []
        while time.monotonic() < deadline:
            assert server.poll() is None, log.read_text()[-2000:]
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    answer = json.loads(reply.read())
            except OSError:
                answer = {}
            result = answer.get("data", {}).get("result", [])
            # both members scraped: the sum is every client's commit
            if result and float(result[0]["value"][1]) == TRANSACTIONS:
                break
            time.sleep(0.5)
        assert result and float(result[0]["value"][1]) == TRANSACTIONS, log.read_text()[-2000:]
        up = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": "up"})
        with urllib.request.urlopen(up, timeout=2) as reply:
            ups = json.loads(reply.read())["data"]["result"]
        assert sorted(u["metric"]["instance"] for u in ups if u["value"][1] == "1") == sorted(
            targets
        )
        # every query of docker/grafana/aggview.json is valid PromQL over series the members
        # serve (each name is in a scrape; some have no samples yet, as a quiet cluster's)
        declared = set().union(*(families(url) for url in cluster.metrics_urls))
        for expr in GRAFANA_QUERIES:
            for name in re.findall(r"aggview_\w+", expr):
                family = re.sub(r"_(total|bucket|count|sum)$", "", name)
                assert {name, family} & declared, f"{name} (in {expr}) is not a series served"
            ask = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            with urllib.request.urlopen(ask, timeout=5) as reply:
                assert json.loads(reply.read())["status"] == "success", expr
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_bench_views_runs_every_case_again_without_metrics_and_compares() -> None:
    from bench.views import build_parser
    from bench.views_cases import store_cases

    args = build_parser().parse_args(["--parts", "4", "--without-metrics"])
    names = [case.name for case, _ in store_cases(args)]
    assert names == ["none", "pg_ivm SQL", "none @no metrics", "pg_ivm SQL @no metrics"]
    assert "none @no metrics" not in [
        c.name for c, _ in store_cases(build_parser().parse_args(["--parts", "4"]))
    ]


def test_metrics_share_counts_the_samples_in_metrics_code() -> None:
    """Unit: bench.metrics_share's reading of py-spy's raw stacks (a stack, a space, its count)."""
    raw = (
        "serve (ltm/a.py:1);committed (aggview/metrics.py:141) 3\n"
        "serve (ltm/a.py:1);inc (prometheus_client/metrics.py:9) 2\n"
        "serve (ltm/a.py:1);prepare (ltm/b.py:7) 15\n"
        "\n"
    )
    assert metrics_share(raw) == (5, 20)


@given(st.lists(st.floats(0, 20, allow_nan=False), max_size=30), st.integers(1, 3))
def test_hot_path_series_sum_their_threads_as_prometheus_client_counts(
    took: list[float], threads: int
) -> None:
    """Unit: the flushes of one log, observed from several threads (a log thread each) into
    per-thread counts, scrape as the histogram and counter prometheus-client's own give."""
    from prometheus_client import CollectorRegistry, Histogram

    from aggview.metrics import LATENCY_BUCKETS, Metrics

    kept = Metrics()
    observe = kept.wal_observer("partition")
    workers = [
        threading.Thread(target=lambda part=took[n::threads]: [observe(t) for t in part])
        for n in range(threads)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    reference = CollectorRegistry()
    own = Histogram(
        "aggview_wal_flush_seconds", "", ["log"], buckets=LATENCY_BUCKETS, registry=reference
    )
    for t in took:
        own.labels("partition").observe(t)

    def series(registry: Any, name: str) -> dict[str, float]:
        return {
            str(sorted(sample.labels.items())): sample.value
            for family in registry.collect()
            for sample in family.samples
            if sample.name == name
        }

    for suffix in ("_bucket", "_count"):
        name = "aggview_wal_flush_seconds" + suffix
        assert series(kept.registry, name) == series(reference, name)
    if took:
        [total] = series(kept.registry, "aggview_wal_flush_seconds_sum").values()
        assert math.isclose(total, sum(took), rel_tol=1e-9, abs_tol=1e-12)
        assert series(kept.registry, "aggview_wal_flushes_total") == {
            str([("log", "partition")]): len(took)
        }
