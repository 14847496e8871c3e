"""``aggview cumulus replay``: a CSV update stream through the runtime, views and stats written,
checked against the reference interpreter and duckdb; bad lines stop it, naming the line."""

from __future__ import annotations

import csv
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from profiles import examples
from test_views_differential import random_row, table_ddl, view_select, view_specs

from aggview import errors
from coordinator.catalog import table_from_create
from cumulus.runtime.replay import ReplayConfig, replay

SCHEMA = """
CREATE TABLE categories (id INT PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE products (id INT PRIMARY KEY, cat_id INT NOT NULL, price DECIMAL(8,2));
CREATE TABLE events (id INT PRIMARY KEY, prod_id INT NOT NULL, cost DECIMAL(10,2) NOT NULL,
                     day DATE, ok BOOL);
"""
COST = (
    "SELECT c.name, SUM(e.cost) AS cost, COUNT(*) AS n FROM events e "
    "JOIN products p ON e.prod_id = p.id JOIN categories c ON p.cat_id = c.id GROUP BY c.name"
)


def dashboard_stream(path: Path, seed: int, length: int) -> Path:
    """Events before their products and categories as often as after; deletes of events."""
    rng = random.Random(seed)
    lines, live = [], []
    for i in range(length):
        r = rng.random()
        if r < 0.1:
            lines.append(["+", "categories", str(i % 9), f"cat {i % 4}"])
        elif r < 0.3:
            lines.append(["+", "products", str(i), str(rng.randrange(9)), f"{i % 50}.25"])
        elif live and r < 0.45:
            lines.append(["-", *live.pop(rng.randrange(len(live)))[1:]])
        else:
            day = rng.choice(["", "2026-11-23"])
            ok = rng.choice(["", "true", "false"])
            row = ["+", "events", str(i), str(rng.randrange(length)), f"{i % 7}.10", day, ok]
            lines.append(row)
            live.append(row)
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows(lines)
    return path


def config(tmp_path: Path, stream: Path, **options: Any) -> ReplayConfig:
    return ReplayConfig(SCHEMA, [("cost", COST)], stream, tmp_path / "out", **options)


@pytest.mark.parametrize("mode", ["speculative", "conservative"])
def test_replay_writes_each_view_and_its_stats_and_checks_them(tmp_path: Path, mode: str) -> None:
    stream = dashboard_stream(tmp_path / "updates.csv", seed=2, length=600)
    options = {"nodes": 3, "switches": 2, "reorder": 7, "epoch_ms": 100, "mode": mode}
    told: list[str] = []
    options["progress"] = told.append
    result = replay(config(tmp_path, stream, check=True, **options), table_from_create)
    assert told == ["committing the last epoch after 600 updates"]  # every 1,000 and at the end
    assert result.updates == 600 and result.differences == []
    with (tmp_path / "out" / "cost.csv").open() as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["name", "cost", "n"]
    assert {r[0] for r in rows[1:]} <= {f"cat {i}" for i in range(4)} and len(rows) > 1
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["updates"] == 600 and stats["checked"] is True
    assert stats["messages"]["Dispatch"] > 0 and stats["bytes"]["Dispatch"] > 0
    assert stats["latency_p99"] >= stats["latency_p50"] > 0
    assert set(stats["peak_log_sizes"]) == {"write_log_entries", "read_log_entries", "operations"}
    assert stats["epochs"] > 1 and stats["committed_ts"] >= 300  # two switches' counters
    assert (stats["corrective_updates"] > 0) == (mode == "speculative")


def test_a_bad_line_stops_the_replay_before_it_naming_it(tmp_path: Path) -> None:
    stream = tmp_path / "updates.csv"
    stream.write_text("+,categories,1,a\n+,products,2,1,3.50\n+,events,3,2,not money,,\n")
    with pytest.raises(errors.InvalidArgument, match=r"line 3.*events\.cost.*after 2 updates"):
        replay(config(tmp_path, stream), table_from_create)
    for line, message in (
        ("*,events,1,2,3.00,,\n", "line 1: the operation must be"),
        ("+,nope,1\n", "line 1: no view reads a table 'nope'"),
        ("+,events,1,2\n", "line 1: events has 5 columns, the line gives 2"),
        ("+,events,1,2,3.00,2026-13-01,\n", "line 1: '2026-13-01' is not a DATE"),
        ("+,events,1,,3.00,,\n", "line 1.*NOT NULL"),
    ):
        stream.write_text(line)
        with pytest.raises(errors.AggviewError, match=message):
            replay(config(tmp_path, stream), table_from_create)


def test_options_that_cannot_work_are_named(tmp_path: Path) -> None:
    stream = dashboard_stream(tmp_path / "updates.csv", seed=1, length=5)
    for options, message in (
        ({"host": "grpc", "reorder": 3}, "--reorder injects delays in the simulator only"),
        ({"host": "spark"}, "--host spark needs the Spark layer"),  # no stage given
        ({"epoch_ms": 0}, "--epoch-ms must be positive"),
        ({"nodes": 0}, "at least 1"),
    ):
        with pytest.raises(errors.AggviewError, match=message):
            replay(config(tmp_path, stream, **options), table_from_create)


@settings(max_examples=examples(6, 12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=view_specs())
def test_random_views_through_replay_check(spec: dict[str, Any], tmp_path_factory: Any) -> None:
    """Random views (the views' own generator, 2-4 tables), streams with deletes and children
    before parents, several switches reordering: --check finds nothing."""
    tmp = tmp_path_factory.mktemp("replay")
    names = [f"t{i}" for i in range(spec["tables"])]
    rng = random.Random(spec["seed"])
    rows: dict[str, dict[int, dict[str, Any]]] = {n: {} for n in names}
    lines = []
    for i in range(80):
        table = rng.choice(names)
        if rows[table] and rng.random() < 0.3:
            old = rows[table].pop(rng.choice(sorted(rows[table])))
            lines.append(["-", table, *_fields(old)])
        else:
            rows[table][i] = random_row(rng, i)
            lines.append(["+", table, *_fields(rows[table][i])])
    select = view_select(spec, names)
    used = [n for n in names if n in select]
    stream = tmp / "updates.csv"
    with stream.open("w", newline="") as handle:
        csv.writer(handle).writerows(line for line in lines if line[1] in used)
    result = replay(
        ReplayConfig(
            "\n".join(table_ddl(n) + ";" for n in names),
            [("q", select)],
            stream,
            tmp / "out",
            nodes=rng.randrange(1, 5),
            switches=rng.randrange(1, 4),
            reorder=rng.randrange(1000),
            check=True,
        ),
        table_from_create,
    )
    assert result.differences == []


def _fields(row: dict[str, Any]) -> list[str]:
    return ["" if row[c] is None else repr(row[c]) if c == "f" else str(row[c]) for c in row]


def test_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "schema.sql").write_text(SCHEMA)
    stream = dashboard_stream(tmp_path / "updates.csv", seed=3, length=200)
    done = subprocess.run(
        [sys.executable, "-m", "aggcli.cli", "cumulus", "replay", "--schema"]
        + [str(tmp_path / "schema.sql"), "--view", f"cost={COST}", "--stream", str(stream)]
        + ["--nodes", "2", "--switches", "2", "--reorder", "1", "--out", str(tmp_path / "o")]
        + ["--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "checked: every view equals" in done.stdout
    assert (tmp_path / "o" / "cost.csv").exists()


def test_the_check_holds_64_bit_ints(tmp_path: Path) -> None:
    """INT is 64 bits: duckdb's check declares BIGINT (its INT is 32), so a SUM(a*b) past 32
    bits is checked; one past 64 bits, which duckdb cannot compute, is a difference reported
    (stats.json written), not a traceback."""
    (tmp_path / "schema.sql").write_text("CREATE TABLE t (id INT PRIMARY KEY, a INT, b INT);")
    stream = tmp_path / "updates.csv"

    def run(rows: str) -> subprocess.CompletedProcess[str]:
        stream.write_text(rows)
        return subprocess.run(
            [sys.executable, "-m", "aggcli.cli", "cumulus", "replay", "--schema"]
            + [str(tmp_path / "schema.sql"), "--view", "s=SELECT SUM(a * b) AS s FROM t"]
            + ["--stream", str(stream), "--out", str(tmp_path / "o"), "--check"],
            capture_output=True,
            text=True,
            timeout=120,
        )

    done = run("".join(f"+,t,{i},{100_000 + i},{3_000_000 + i}\n" for i in range(20)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "checked: every view equals" in done.stdout
    assert json.loads((tmp_path / "o" / "stats.json").read_text())["differences"] == []
    done = run(f"+,t,1,{2**35},{2**35}\n")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "DIFFERS: s: duckdb cannot recompute it: Out of Range Error" in done.stdout
    assert json.loads((tmp_path / "o" / "stats.json").read_text())["differences"]


def test_the_check_divides_as_views_divide(tmp_path: Path) -> None:
    """A view's ``/`` is NULL by a zero divisor, where duckdb gives inf: the check asks duckdb
    for the view's meaning (a CI run's random view ``SUM(v) / SUM(k)`` was reported wrong)."""
    (tmp_path / "schema.sql").write_text(
        "CREATE TABLE t (id INT PRIMARY KEY, g INT, a INT, b INT);"
    )
    stream = tmp_path / "updates.csv"
    stream.write_text("+,t,1,1,5,0\n+,t,2,2,-3,0\n+,t,3,2,4,2\n+,t,4,3,0,0\n")
    result = replay(
        ReplayConfig(
            (tmp_path / "schema.sql").read_text(),
            [("q", "SELECT g, SUM(a) / SUM(b) AS r FROM t GROUP BY g")],
            stream,
            tmp_path / "out",
            check=True,
        ),
        table_from_create,
    )
    assert result.differences == []
