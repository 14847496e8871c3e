"""The command line: `aggview start` (SIGTERM stops it, a restart keeps the data), `aggview sql`."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from aggclient import Client
from agglauncher.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[1]


def start(data: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "aggcli.cli", "start", "--data", str(data), "--ltms", "2"]
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


def cli(*args: str, stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``aggview ARGS...`` run as a user would, stdout and stderr apart."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "aggcli.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        input=stdin,
    )


def sql(address: str, *statements: str, stdin: str = "") -> str:
    done = cli("sql", address, *statements, stdin=stdin)
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
        [sys.executable, "-m", "aggcli.cli", "start", "--data", str(data), "--ltms", "3"]
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
    base = [sys.executable, "-m", "aggcli.cli", "start", "--data", str(tmp_path / "one")]
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
    data = tmp_path / "one"  # the partitions' log is the coordinator's one log, no LTM's
    assert any((data / "coordinator" / "member").glob("*.wal"))
    assert not (data / "coordinator" / "partitions").exists()
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
        done = cli("sql", address, "-f", str(script), "--format", "csv")
        assert done.stdout.splitlines() == ["id,v", "3,29"], done.stdout
        assert done.stderr.startswith("COMMIT INSERT 1, UPDATE 1 at timestamp"), done.stderr
        done = cli("sql", address, "--format", "json", stdin="SELECT v FROM t WHERE id = 1;")
        assert json.loads(done.stdout) == [{"v": 11}], done.stdout
        sql(address, "CREATE MATERIALIZED VIEW t_n AS SELECT v, COUNT(*) AS n FROM t GROUP BY v")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        watching = subprocess.Popen(
            [sys.executable, "-m", "aggcli.cli", "watch", address, "t_n", "--where", "v=99"],
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
    for member in (0, 1):  # each member logs its partitions and decisions in one log
        assert any((data / f"member-{member}" / "member").glob("*.wal"))
        assert not (data / f"member-{member}" / "partitions").exists()


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


def test_sql_takes_options_anywhere_and_pipes_only_csv_or_json(
    cluster: LocalCluster, table_name: str
) -> None:
    t = table_name
    sql(cluster.address, f"CREATE TABLE {t} (id INT PRIMARY KEY, name TEXT)")
    sql(cluster.address, f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")
    done = cli(
        "sql",
        cluster.address,
        f"SELECT id FROM {t} WHERE id = 1",
        "--format",
        "csv",
        f"SELECT name FROM {t} WHERE id = 2",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["id", "1", "name", "b"]  # no footer among the rows
    assert done.stderr.count("1 row(s) at timestamp") == 2
    done = cli("sql", cluster.address, f"SELECT id, name FROM {t}", "--format", "json")
    assert json.loads(done.stdout) == [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    block = f"BEGIN READ ONLY; SELECT id FROM {t}; SELECT name FROM {t} WHERE id = 1; COMMIT;"
    done = cli("sql", "--format", "json", cluster.address, block)
    assert json.loads(done.stdout) == [[{"id": 1}, {"id": 2}], [{"name": "a"}]]
    assert "READ ONLY: 2 SELECT(s)" in done.stderr


def test_sql_errors_in_sql_terms_and_addresses_need_a_port(cluster: LocalCluster) -> None:
    done = cli("sql", cluster.address, "SELEC * FROM accounts")
    assert done.returncode == 2
    assert "syntax error near 'SELEC'" in done.stderr, done.stderr
    assert "\x1b" not in done.stderr and "<class" not in done.stderr
    done = cli("sql", cluster.address, "SELECT * FROM t WHERE id = 'open")
    assert "syntax error: a quote or comment is not closed" in done.stderr, done.stderr
    done = cli("sql", cluster.address, "SHOW TABLES")
    assert "unsupported SQL statement SHOW TABLES" in done.stderr
    assert "CREATE MATERIALIZED VIEW, ALTER MATERIALIZED VIEW" in done.stderr, done.stderr
    done = cli("sql", "localhost", "SELECT 1")
    assert done.returncode == 2
    assert "'localhost' is not HOST:PORT" in done.stderr and "443" not in done.stderr


def test_watch_fails_fast_with_the_reason_and_checks_where() -> None:
    from aggview.processes import free_port

    started = time.monotonic()
    done = cli("watch", f"127.0.0.1:{free_port()}", "v", timeout=30)
    assert time.monotonic() - started < 15
    assert done.returncode == 2
    assert "nothing listens there" in done.stderr and "TLS" not in done.stderr, done.stderr
    done = cli("watch", "127.0.0.1:7070", "v", "--where", "shop")
    assert done.returncode == 2 and "'shop' is not COLUMN=VALUE" in done.stderr


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for command in (
            ["start", "--data", str(tmp_path / "data"), "--insecure", "--port", port],
            ["ltm", "--store", f"sqlite:///{tmp_path}/store.db", "--log-dir", str(tmp_path)]
            + ["--partitions", "1", "--insecure", "--port", port],
        ):
            done = cli(*command)
            assert done.returncode == 2
            said = (done.stdout + done.stderr).strip().splitlines()
            assert said == [f"aggview: cannot listen on 127.0.0.1:{port}: Address already in use"]


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """Every parser of the command line, by its command."""
    from aggcli.cli import build_parser

    found, todo = [], [("aggview", build_parser())]
    while todo:
        name, parser = todo.pop()
        found.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend((f"{name} {n}", p) for n, p in action.choices.items())
    return found


def test_every_option_shows_its_default_and_help_reads_without_the_source() -> None:
    parsers = _parsers()
    top = dict(parsers)["aggview"]
    assert top.description and "``" not in top.description
    for name, parser in parsers:
        formatter = parser._get_formatter()
        texts = [parser.format_help()]
        for action in parser._actions:
            shown = formatter._format_action(action)
            texts.append(shown)
            flag = action.nargs == 0 or action.default == argparse.SUPPRESS
            if action.option_strings and not flag and not action.required:
                assert "default" in shown.lower(), f"{name} {action.option_strings}: {shown!r}"
        text = " ".join(texts)
        for banned in (r"\w\.py\b", r"\bseed \d", "§", r"[Ss]ection \d", r"\bthesis\b"):
            assert not re.search(banned, text), f"{name}: {banned} in {text}"
    load = dict(parsers)["aggview load"].format_help()
    assert "coordinator" not in load and "HOST:PORT" in load


def test_servers_log_one_json_object_per_line_when_asked(tmp_path: Path) -> None:
    """``--log-format json`` (here through ``aggview start``'s launcher): every log line of a
    member is a JSON object with its time, level, logger and message; only the readiness line
    that launchers wait for stays plain."""
    with LocalCluster(tmp_path / "data", ltms=2, verbose=True, log_format="json") as cluster:
        with Client(cluster.address) as client:
            client.sql("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
            client.sql("INSERT INTO t VALUES (1, 2)")
    logs = sorted((tmp_path / "data" / "logs").glob("*.log"))
    assert logs
    for log in logs:
        lines = [line for line in log.read_text().splitlines() if line]
        records = [json.loads(line) for line in lines if "listening on" not in line]
        assert records, log
        for record in records:
            assert {"time", "level", "logger", "pid", "message"} <= record.keys(), record
            assert record["time"].endswith("Z")


def test_a_json_log_line_carries_the_traceback() -> None:
    import logging

    from aggview.logformat import JsonFormatter

    try:
        raise ValueError("bad value")
    except ValueError:
        record = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, __file__, 1, "failed %s", ("here",), sys.exc_info()
        )
    record.ts = 42  # as extra={"ts": 42} sets it
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "failed here" and line["level"] == "ERROR" and line["ts"] == 42
    assert "ValueError: bad value" in line["exception"]


def test_an_unknown_log_format_is_refused() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "aggcli.cli", "--log-format", "xml", "status", "x:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "invalid choice: 'xml'" in result.stderr
