"""`aggview start` keeps its cluster up: a member killed with -9 comes back on its data (also
when it cannot start at first), and `kill -USR1` of the parent reaches the members' logs."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from polling import wait_for

from aggclient import Client
from aggview import errors

ROOT = Path(__file__).resolve().parents[1]


def aggview_start(data: Path, stderr: Any) -> subprocess.Popen[str]:
    """A real ``aggview start`` of two members on ``data``, its stdout a pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", "aggcli.cli", "start", "--data", str(data)]
        + ["--ltms", "2", "--processes", "2", "--insecure"],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.fixture
def started(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    """A real ``aggview start`` of two members, its address, and the file of its stderr."""
    said = tmp_path / "start.err"
    with open(said, "w") as err:
        process = aggview_start(tmp_path / "data", err)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.match(r"aggview listening on (\S+)", line)
        assert match, line + said.read_text()
        yield process, match.group(1), said
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out + said.read_text()
    assert "aggview stopped" in out


def member_pid(parent: int, member: int) -> int:
    """The pid of the process under ``parent`` (a child, or a child of its fork server) that
    runs ``--member <member>``, found by its command line as ``pgrep -f`` would."""
    below = {parent}
    for _ in range(2):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").split()
            except (OSError, IndexError, ValueError):
                continue
            if ppid not in below:
                continue
            below.add(int(entry.name))
            if b"--member" in argv and argv[argv.index(b"--member") + 1] == b"%d" % member:
                return int(entry.name)
    raise AssertionError(f"no member {member} under {parent}")


def member_port(pid: int) -> int:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").split()
    return int(argv[argv.index(b"--port") + 1])


def zombie(pid: int) -> bool:
    """Whether a process has exited: it waits for its parent to reap it, or was reaped (by
    the fork server it was forked from, which the stopped ``aggview start`` is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def counts(path: Path, text: str) -> int:
    return path.read_text().count(text)


def test_a_killed_member_that_cannot_start_at_first_comes_back_on_its_data(
    started: tuple[subprocess.Popen[str], str, Path],
) -> None:
    """Its port taken while it is dead: each start fails, and is retried until the port is
    free, while the parent and the other member serve on."""
    process, address, said = started
    with Client(address, timeout=30) as client:
        client.sql("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
        client.sql("INSERT INTO t VALUES (1, 10), (2, 20), (3, 30)")
    victim = member_pid(process.pid, 1)
    port = member_port(victim)
    os.kill(process.pid, signal.SIGSTOP)  # the parent restarts nothing until the port is taken
    try:
        os.kill(victim, signal.SIGKILL)
        wait_for("member 1 to die", lambda: zombie(victim))  # its sockets closed
        with socket.socket() as squatter:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # its TIME_WAITs
            # another process's outgoing connection may hold the number for a moment
            wait_for("its port to be free", lambda: _bound(squatter, port), 20)
            squatter.listen()
            os.kill(process.pid, signal.SIGCONT)
            wait_for("two failed starts", lambda: counts(said, "member-1 exited at start") >= 2)
        wait_for("member 1's restart", lambda: counts(said, "member-1 restarted") == 1, 60)
    finally:
        os.kill(process.pid, signal.SIGCONT)
    assert process.poll() is None, said.read_text()
    assert "stopping" not in said.read_text()
    assert member_pid(process.pid, 1) != victim
    with Client(address, timeout=30) as client:
        wait_for("member 1 to serve", lambda: _count(client) == 3)
        client.sql("INSERT INTO t VALUES (4, 40)")
        assert sorted(row["v"] for row in client.scan("t")) == [10, 20, 30, 40]


def _bound(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def _count(client: Client) -> int | None:
    try:
        return len(client.scan("t"))
    except errors.Unavailable:  # until member 1 is back and known again
        return None


def test_usr1_of_the_parent_reaches_each_members_log_and_stops_nothing(
    started: tuple[subprocess.Popen[str], str, Path], tmp_path: Path
) -> None:
    process, address, said = started
    os.kill(process.pid, signal.SIGUSR1)
    logs = tmp_path / "data" / "logs"
    for m in (0, 1):
        log, heading = logs / f"member-{m}.log", f"member {m}: "
        wait_for(f"member {m}'s dump", lambda: heading in log.read_text(), 10)  # noqa: B023
    wait_for("the parent's word", lambda: "SIGUSR1 passed on" in said.read_text())
    assert str(logs / "member-1.log") in said.read_text()
    assert process.poll() is None
    with Client(address, timeout=30) as client:
        client.sql("CREATE TABLE u (id INT PRIMARY KEY)")
        assert client.scan("u") == []


def test_kill_9_of_aggview_start_leaves_no_member_behind(tmp_path: Path) -> None:
    """Each member asks, once started, for SIGTERM when its parent dies
    (``aggview.processes.die_with_parent``), so kill -9 of ``aggview start`` stops them too.
    (It was asked in a ``preexec_fn``, which made gRPC abort restarted members under load.)"""
    process = aggview_start(tmp_path / "data", subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("aggview listening on")
        members = [member_pid(process.pid, m) for m in (0, 1)]
    finally:
        process.kill()
        process.communicate(timeout=30)
    try:
        wait_for("the members to exit", lambda: all(_gone(pid) for pid in members), 20)
    finally:  # none left behind, even when this fails
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _gone(pid: int) -> bool:
    try:
        return zombie(pid)
    except FileNotFoundError:
        return True
