"""The command line: `aggview start` (SIGTERM stops it, a restart keeps the data), `aggview sql`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from aggview.cluster import LocalCluster
from coordinator import Client

ROOT = Path(__file__).resolve().parents[1]


def start(data: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "aggview.cli", "start", "--data", str(data), "--ltms", "2"]
        + ["--insecure", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    match = re.match(r"aggview listening on (\S+)", line)
    assert match, line
    return process, match.group(1)


def stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    return out


def sql(address: str, *statements: str, stdin: str = "") -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "aggview.cli", "sql", address, *statements],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        input=stdin,
    )
    return done.stdout + done.stderr


def test_start_stop_restart_and_sql(tmp_path: Path) -> None:
    data = tmp_path / "data"
    process, address = start(data)
    try:
        out = sql(
            address,
            "CREATE TABLE items (id INT PRIMARY KEY, name TEXT)",
        )
        assert "created table items" in out
        with Client(address) as client, client.transaction() as tx:
            for i in range(50):
                tx.insert("items", {"id": i, "name": f"item {i}"})
    finally:
        assert "aggview stopped" in stop(process)

    process, address = start(data)  # same data, new ports
    try:
        out = sql(address, "SELECT name FROM items WHERE id = 7", "SELECT * FROM items")
        assert "item 7" in out and "50 row(s)" in out
        bad = sql(address, "SELECT * FROM nowhere")
        assert "unknown table 'nowhere'" in bad
    finally:
        stop(process)


def test_start_refuses_another_ltm_count(tmp_path: Path) -> None:
    data = tmp_path / "data"
    process, _ = start(data)
    stop(process)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "aggview.cli", "start", "--data", str(data), "--ltms", "3"]
        + ["--insecure"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode != 0
    assert "repartitioning is not supported" in done.stdout + done.stderr


def test_start_in_one_process_serves_and_refuses_replication(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "aggview.cli", "start", "--data", str(tmp_path / "one")]
    done = subprocess.run(
        [*base, "--processes", "1", "--replicate", "--insecure"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode != 0
    assert "--replicate copies each process's logs to another process" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    process, address = start(tmp_path / "one", "--processes", "1")
    try:
        created = sql(address, "CREATE TABLE t (id INT PRIMARY KEY, v INT)")
        assert "error" not in created.lower(), created
        assert sql(address, "SELECT * FROM t").splitlines()[0] == "id\tv"
    finally:
        stop(process)
    data = tmp_path / "one"  # the partitions' logs in the coordinator's directory, no LTM's
    assert (data / "coordinator" / "partitions" / "partition-1").is_dir()
    assert not (data / "ltm-0").exists()


def test_start_with_two_coordinating_processes(tmp_path: Path) -> None:
    data = tmp_path / "two"
    process, address = start(data, "--ltms", "4", "--processes", "2")
    try:
        created = sql(address, "CREATE TABLE t (id INT PRIMARY KEY, v INT)")
        assert "error" not in created.lower(), created
        assert sql(address, "SELECT * FROM t").splitlines()[0] == "id\tv"
        said = sql(address, "INSERT INTO t VALUES (1, 10), (2, 20); UPDATE t SET v = v + 1")
        assert said.startswith("INSERT 2 at timestamp") and "; UPDATE 2 at" in said, said
        assert sql(address, "SELECT v FROM t WHERE id = 2").splitlines()[1] == "21"
        script = tmp_path / "script.sql"
        script.write_text(
            "-- a script; semicolons in comments and 'strings;' do not cut\n"
            "BEGIN; INSERT INTO t VALUES (3, 30); UPDATE t SET v = v - 1 WHERE id = 3; COMMIT;\n"
            "SELECT * FROM t WHERE id = 3;\n"
        )
        out = sql(address, "-f", str(script), "--format", "csv").splitlines()
        assert out[0].startswith("COMMIT INSERT 1, UPDATE 1 at timestamp"), out
        assert out[1:3] == ["id,v", "3,29"], out
        out = sql(address, "--format", "json", stdin="SELECT v FROM t WHERE id = 1;")
        assert json.loads(out) == [{"v": 11}], out
        sql(address, "CREATE MATERIALIZED VIEW t_n AS SELECT v, COUNT(*) AS n FROM t GROUP BY v")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        watching = subprocess.Popen(
            [sys.executable, "-m", "aggview.cli", "watch", address, "t_n", "--where", "v=99"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert watching.stdout is not None
            assert watching.stdout.readline().startswith("-- 0 row(s) at timestamp")
            sql(address, "INSERT INTO t VALUES (9, 99)")
            assert watching.stdout.readline().rstrip().endswith("\tn=1 v=99")
        finally:
            watching.terminate()
            watching.wait(timeout=30)
    finally:
        stop(process)
    for member, partitions in ((0, (0, 2)), (1, (1, 3))):  # partition p on member p % 2
        hosted = sorted(p.name for p in (data / f"member-{member}" / "partitions").iterdir())
        assert hosted == [f"partition-{p}" for p in partitions]


def test_a_hung_stop_is_cut_short_and_its_stacks_logged(tmp_path: Path) -> None:
    """A server whose final checkpoint hangs (a failpoint stalls it for a minute) exits once its
    stop deadline passes, with the stacks of where it hung in its log and status 3; restarted,
    it has lost nothing."""
    with LocalCluster(tmp_path / "data", ltms=1, processes=1, checkpoint_interval=3600) as cluster:
        ltm = cluster.member(0)
        ltm.stop()
        hang = {"AGGVIEW_FAILPOINTS": "ltm.mid_checkpoint=sleep:60"}
        ltm.start(env={**hang, "AGGVIEW_SHUTDOWN_DEADLINE": "2"})
        with Client(cluster.address) as client:
            client.sql("CREATE TABLE items (id INT PRIMARY KEY, name TEXT)")
            with client.transaction() as tx:
                tx.insert("items", {"id": 1, "name": "kept"})
        started = time.monotonic()
        ltm.stop(timeout=50)
        assert time.monotonic() - started < 40  # the failpoint alone would take 60 s
        assert ltm.process is not None and ltm.process.returncode == 3
        log = ltm.tail(400)
        assert "member 0: stopping took over 2s; exiting" in log
        assert "failpoints.py" in log and "checkpoint" in log  # the hung thread's stack
        ltm.start()
        with Client(cluster.address) as client:
            assert client.get("items", {"id": 1}) == {"id": 1, "name": "kept"}
