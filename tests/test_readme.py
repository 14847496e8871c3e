"""The README's examples run against real clusters, so a README that says what is not true
fails here: its Python blocks and SQL blocks in order on a cluster of its own, its command lines
(``aggview ...``) as a user types them, only the address (and a free port) substituted. A
command not run here is listed with the reason, so a new one must be placed."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import own_cluster

from aggclient import Client
from agglauncher.cluster import LocalCluster
from aggview.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TEXT = README.read_text()
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ADDRESS = "127.0.0.1:7070"

# README command lines not run here (a prefix each), and why.
NOT_RUN = {
    "aggview demo": "the main job: tests/test_demo.py runs it",
    "aggview load ": "Spark: tests/test_spark.py loads files",
    "aggview views init ": "Spark: tests/test_spark.py initializes views",
    "aggview verify ": "Spark: tests/test_spark.py verifies views",
    "aggview cumulus replay ... ": "the options of the full replay line above, with other hosts",
    "aggview hbase ": "a real HBase: tests/test_real_hbase.py",
    "aggview start --data ./data --store hbase": "a real HBase: tests/test_real_hbase.py",
    "aggview ltm ": "members by hand on their hosts: tests/test_members.py starts them so",
    'aggview sql 127.0.0.1:7070 "CREATE TABLE accounts (id INT PRIMARY KEY, balance': "Docker",
    "aggview status --tls-dir ./tls 127.0.0.1:7070 --watch": "runs until Ctrl-C: "
    "tests/test_metrics.py watches a cluster and interrupts it",
    "aggview docker build": "Docker: .ci/run and tests/docker_session.py build the images",
}


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", TEXT, re.S)


def commands() -> list[str]:
    """Every indented ``aggview`` line of the README, continuation lines joined."""
    found, lines = [], iter(TEXT.splitlines())
    for line in lines:
        if line.startswith("    aggview "):
            while line.endswith("\\"):
                line = line[:-1] + next(lines).strip()
            found.append(line.strip())
    return found


def run(command: str, cwd: Path, address: str) -> subprocess.CompletedProcess[str]:
    words = shlex.split(command.replace(ADDRESS, address), comments=True)
    assert words[0] == "aggview"
    return subprocess.run(
        [sys.executable, "-m", "aggcli.cli", *words[1:]],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=cwd,
        timeout=120,
    )


def test_readme_client_example_runs(cluster: LocalCluster, capsys) -> None:  # type: ignore[no-untyped-def]
    code = blocks("python")[0].replace(ADDRESS, cluster.address)
    exec(compile(code, str(README), "exec"), {})
    out = capsys.readouterr().out
    assert "committed at timestamp" in out
    assert "condition failed" in out and "accounts" in out
    assert "120.50 at" in out  # 70.00 + 50.50 after the transfer


def test_readme_python_and_sql_examples_run_in_order(tmp_path: Path) -> None:
    """Every Python and SQL block, in the README's order, on one cluster: the SQL ones as
    scripts of ``aggview sql -f``; Spark's data source (which needs a Spark session) is left
    to tests/test_spark.py."""
    ordered = re.findall(r"```(python|sql)\n(.*?)```", TEXT, re.S)
    assert len(ordered) >= 7
    with own_cluster(tmp_path, ltms=2) as cluster, Client(cluster.address) as client:
        names: dict[str, object] = {"client": client}
        for number, (language, code) in enumerate(ordered):
            if language == "python":
                if "spark.read" in code:
                    continue
                code = code.replace(ADDRESS, cluster.address)
                exec(compile(code, f"{README} python block {number}", "exec"), names)
                names["client"] = client  # the first block's own closed with its block
                continue
            script = tmp_path / f"block-{number}.sql"
            script.write_text(code)
            done = run(f"aggview sql {ADDRESS} -f {script}", tmp_path, cluster.address)
            assert done.returncode == 0 and "error" not in done.stdout, (code, done.stderr)
            if "COUNT(*), SUM(balance) AS total" in code:
                assert "count\ttotal" in done.stdout.splitlines(), done.stdout
        rolled = names["rows"]
        assert rolled.columns == ["category", "c"]  # type: ignore[attr-defined]
        assert [dict(r) for r in rolled] == [{"category": "category 7", "c": 6.5}]  # type: ignore[attr-defined]


def test_readme_command_lines_run(tmp_path: Path) -> None:
    """The command lines in order, in one directory: certificates, a TLS cluster started by
    ``aggview start`` (on a free port, stopped at the end), SQL over TLS, the M3 compiler and
    a replay with its check, on the schema and stream lines the README gives."""
    schema = next(b for b in blocks("sql") if "CREATE TABLE orders" in b)
    (tmp_path / "schema.sql").write_text(schema)
    stream = re.findall(r"`(\+,\w+,[^`]*)`", TEXT)
    assert stream, "the README shows no stream lines"
    (tmp_path / "updates.csv").write_text("\n".join(stream) + "\n")
    started: subprocess.Popen[str] | None = None
    address = ADDRESS
    ran = 0
    try:
        for command in commands():
            if any(command.startswith(prefix) for prefix in NOT_RUN):
                continue
            if command.startswith("aggview start "):
                port = str(free_port())
                words = shlex.split(command.replace("7070", port), comments=True)
                started = subprocess.Popen(
                    [sys.executable, "-m", "aggcli.cli", *words[1:]],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=ENV,
                    cwd=tmp_path,
                )
                assert started.stdout is not None
                said = started.stdout.readline()
                assert said.startswith(f"aggview listening on 127.0.0.1:{port}"), said
                address = f"127.0.0.1:{port}"
                ran += 1
                continue
            done = run(command, tmp_path, address)
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            ran += 1
            if command.startswith("aggview status"):  # the secret of --tls-dir: details
                assert "  up  leader  partitions " in done.stdout, done.stdout
            if "SELECT * FROM accounts" in command:
                assert done.stdout.splitlines()[0] == "id\towner\tbalance", done.stdout
            if command.startswith("aggview cumulus replay"):
                assert "checked: every view equals" in done.stdout, done.stdout
                assert (tmp_path / "replay" / "rev.csv").read_text() == "ordkey,rev\n1,9.50\n"
    finally:
        if started is not None:
            started.send_signal(signal.SIGTERM)
            out, _ = started.communicate(timeout=60)
            assert "aggview stopped" in out, out
    assert ran >= 7


@pytest.mark.parametrize("command", commands())
def test_every_readme_command_is_run_or_said_why_not(command: str) -> None:
    runs = command.startswith(("aggview certs", "aggview start --data ./data --ltms")) or (
        command.startswith(
            ("aggview sql --tls-dir", "aggview status --tls-dir", "aggview m3 ")
            + ("aggview cumulus replay --",)
        )
    )
    runs = runs and "--watch" not in command
    skipped = [why for prefix, why in NOT_RUN.items() if command.startswith(prefix)]
    assert runs != bool(skipped), f"place {command!r}: run it here, or say in NOT_RUN why not"


def test_the_readme_stands_alone() -> None:
    """Every file it names is in the project; no command it names is gone."""
    for target in re.findall(r"\]\(([^)]+)\)", TEXT) + re.findall(r"`([\w./-]+\.md)`", TEXT):
        assert not target.startswith(".."), target
        assert (ROOT / target).exists(), target
    assert "aggview coordinator" not in TEXT
    from aggview import errors

    listed = TEXT[TEXT.index("Errors are") : TEXT.index("Timestamp-order aborts")]
    for error in re.findall(r"`(\w+)`", listed):
        assert hasattr(errors, error), error
    assert "`TypeMismatch`" in TEXT


def test_generated_wire_modules_match_the_protos(tmp_path: Path) -> None:
    from aggview.wire.generate import ROOT, generate

    generate(tmp_path)
    for fresh in (tmp_path / "aggview" / "wire").glob("*_pb2*.py*"):
        checked_in = ROOT / "aggview" / "wire" / fresh.name
        assert checked_in.read_text() == fresh.read_text(), (
            f"{fresh.name} is stale: run python -m aggview.wire.generate"
        )
