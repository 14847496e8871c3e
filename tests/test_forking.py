"""The fork server (aggview.forking): a forked server gets its launch's arguments, environment,
log and command line, its end is reported as Popen reports it, and it ends with the process
that started the fork server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from aggview.forking import ForkServer
from aggview.processes import PARENT_ENV

PROGRAM = """
import os, sys, time
from aggview.processes import die_with_parent

def main():
    die_with_parent()
    print("argv", sys.argv[1:], "colour", os.environ.get("COLOUR"), flush=True)
    if sys.argv[1] == "sleep":
        time.sleep(60)
    sys.exit(int(sys.argv[2]))
"""


@pytest.fixture
def program(tmp_path: Path) -> dict[str, str]:
    """The environment under which ``forked_program`` can be imported."""
    (tmp_path / "forked_program.py").write_text(PROGRAM)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ").decode()


def titled(pid: int, wanted: str) -> str:
    """The command line of ``pid`` once it shows ``wanted`` (a forked server sets it first
    thing, just after its pid was answered)."""
    deadline = time.monotonic() + 10
    while wanted not in command_line(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return command_line(pid)


def test_a_forked_server_runs_its_launch_and_its_exit_status_is_reported(
    program: dict[str, str], tmp_path: Path
) -> None:
    server = ForkServer(["forked_program"], program, {"COLOUR"})
    log = tmp_path / "one.log"
    one = server.launch("forked_program", ["exit", "3"], {**program, "COLOUR": "red"}, str(log))
    assert one.wait(10) == 3
    assert one.returncode == 3 and one.poll() == 3
    assert "argv ['exit', '3'] colour red" in log.read_text()

    sleeper = server.launch("forked_program", ["sleep", "0"], program, str(tmp_path / "two.log"))
    with pytest.raises(subprocess.TimeoutExpired):
        sleeper.wait(0.2)
    assert sleeper.poll() is None
    assert titled(sleeper.pid, "sleep 0").endswith(" -m forked_program sleep 0")
    sleeper.kill()
    assert sleeper.wait(10) == -signal.SIGKILL
    sleeper.kill()  # ended: nothing is signalled (its pid may belong to another process now)


def test_waiting_for_a_server_whose_fork_server_died_returns(
    program: dict[str, str], tmp_path: Path
) -> None:
    """Only the fork server can say how its servers ended: once it is gone (its servers get
    SIGTERM), a wait without a timeout returns when the server no longer runs, not never."""
    env = {**program, PARENT_ENV: str(os.getpid())}
    server = ForkServer(["forked_program"], env, set())
    sleeper = server.launch("forked_program", ["sleep", "0"], env, str(tmp_path / "s.log"))
    titled(sleeper.pid, "sleep 0")
    server._process.kill()
    ended: list[int] = []
    waiter = threading.Thread(target=lambda: ended.append(sleeper.wait()), daemon=True)
    waiter.start()
    waiter.join(15)
    assert ended == [-signal.SIGTERM]
    assert sleeper.poll() == -signal.SIGTERM
    server._process.wait()


def test_only_a_launch_in_the_fork_servers_environment_may_be_forked(
    program: dict[str, str],
) -> None:
    server = ForkServer([], program, {"COLOUR"})
    assert server.forkable({**program, "COLOUR": "blue"})  # read after the fork: allowed
    assert not server.forkable({**program, "AGGVIEW_FAILPOINTS": "x=panic"})  # read at import
    assert not server.forkable({k: v for k, v in program.items() if k != "PYTHONPATH"})


def test_servers_end_when_the_process_that_started_the_fork_server_is_killed(
    program: dict[str, str], tmp_path: Path
) -> None:
    starter = textwrap.dedent(
        f"""
        import os, sys, time
        from aggview.forking import ForkServer
        env = {{**os.environ, {PARENT_ENV!r}: str(os.getpid())}}
        server = ForkServer(["forked_program"], env, set())
        child = server.launch("forked_program", ["sleep", "0"], env, {str(tmp_path / "s.log")!r})
        print(child.pid, flush=True)
        time.sleep(60)
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True, env=program
    )
    assert process.stdout is not None
    forked = int(process.stdout.readline())
    assert "forked_program sleep" in titled(forked, "forked_program sleep")
    process.kill()
    process.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{forked}").exists() and "forked_program" in command_line(forked):
        assert time.monotonic() < deadline, "the forked server outlived its starter"
        time.sleep(0.05)
