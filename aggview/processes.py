"""Processes of the ``aggview`` command started by Python code: ``Server`` (one process, run as
``python -m aggcli.cli ...``, waited for until it says where it listens), ports for servers about
to start (``free_port``), a log's tail for error messages, and CPU accounting from /proc.

Used by every layer that starts a process (the grpc host's DW nodes, the standalone HBase, a
Spark session's log, the local cluster of ``agglauncher``, the tests and benchmarks); the
command line it runs is a process boundary, not an import.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aggview.forking import ForkedProcess, ForkServer

_LISTENING = re.compile(r"listening on (\S+):(\d+)")
_METRICS = re.compile(r"metrics on http://(\S+):(\d+)/metrics")  # said before it listens
CHECKOUT = Path(__file__).resolve().parents[1]  # whose code a started process runs


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ('' if it cannot be read): what errors quote."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# Ports handed out before their server binds them are drawn below Linux's ephemeral range
# (32768-60999 by default), where no outgoing connection takes one meanwhile: a port the kernel
# chose with bind(0) was once taken by a client connection before the server started.
PORT_RANGE = (20000, 32000)


def _port_range() -> tuple[int, int]:
    """``AGGVIEW_PORTS=LOW-HIGH`` narrows the range: the test workers each take a slice of
    it, so two workers' clusters never draw the same port between its check and its bind
    (that happened: "address already in use" in CI under four workers)."""
    low, _, high = os.environ.get("AGGVIEW_PORTS", "").partition("-")
    return (int(low), int(high)) if low and high else PORT_RANGE


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free now, below the ephemeral range, for a server started soon after (another
    process picking the same one meanwhile is possible, and rare). Never one this process
    handed out before: a cluster asks for several before any server binds one, and a repeat
    (about 0.3 % of cluster starts) failed a start with "address already in use"."""
    rng = random.SystemRandom()
    ports = _port_range()
    for _ in range(200):
        port = rng.randrange(*ports)
        if port in _HANDED_OUT:
            continue
        _HANDED_OUT.add(port)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # the whole range busy: the kernel's choice
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int, *, reaped: bool = False) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc; 0 once gone.
    ``reaped``: with the CPU of the children it has waited for."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _CLOCK_TICKS


def process_tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and everything it started: its live descendants (a cumulus
    view's DW node processes, a Spark JVM and its Python workers) and the children it reaped."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += process_cpu_seconds(current, reaped=True)
        todo.extend(children.get(current, []))
    return total


PARENT_ENV = "AGGVIEW_DIE_WITH"  # set by ``Server.launch``: the pid that started the server


def die_with_parent() -> None:
    """In a server ``Server`` started: SIGTERM when the process that started it dies, even
    by kill -9. Asked for here, after exec, and not in a ``preexec_fn``: that forces a plain
    fork() in the starting process, whose gRPC at-fork handlers restarted gRPC's poller in the
    child; the child then closed its descriptors before exec and the poller aborted it
    ("epoll_wait error: Bad file descriptor"; a restarted member died so about once in twelve
    restarts under load). Without one, Python starts the child by vfork, which runs no
    handlers."""
    parent = os.environ.pop(PARENT_ENV, "")
    if not parent:
        return
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    try:
        os.kill(int(parent), 0)
    except ProcessLookupError:  # it died before the request above took effect
        os.kill(os.getpid(), signal.SIGTERM)


def wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Returns once every thread of ``pid`` is stopped (``kill`` returns before they are), or
    it is gone."""
    deadline = time.monotonic() + timeout
    tasks = Path(f"/proc/{pid}/task")
    while True:
        states = []
        if not tasks.exists():
            return  # it exited: nothing of it runs
        for task in tasks.iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that just ended
                # the state follows the command name, which is in parentheses
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        if all(state in ("T", "t") for state in states):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} did not stop: thread states {states}")
        time.sleep(0.005)


@contextlib.contextmanager
def paused(
    pids: Sequence[int], held: contextlib.AbstractContextManager[object] | None = None
) -> Iterator[None]:
    """``pids`` stopped (SIGSTOP) for the block, as a GC pause or a frozen VM would stop them,
    then resumed whatever the block does (one that exited meanwhile is skipped). ``held``: a
    lock the processes must not hold while stopped, taken around the stop and released once
    every thread of them has stopped (``ltm.store.sqlite.writer_lock``: a member stopped
    inside a write to the embedded store would stop every member's writes, which HBase, a
    server of its own, would not)."""
    with held if held is not None else contextlib.nullcontext():
        _signal(pids, signal.SIGSTOP)
        for pid in pids:
            wait_stopped(pid)
    try:
        yield
    finally:
        _signal(pids, signal.SIGCONT)


def _signal(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def cli_module(code: Path) -> str:
    """The module of the ``aggview`` command in the checkout ``code``: ``aggcli.cli``, or
    ``aggview.cli`` in a checkout from before the packages were the layers (a benchmark
    compares with an old one)."""
    return "aggcli.cli" if (code / "aggcli").is_dir() else "aggview.cli"


# A fork server (aggview.forking) with a server's modules imported, once ``preload_servers``
# started it: ``Server.launch`` forks this checkout's servers from it when their environment is
# the one it imported them under. ``AGGVIEW_FORK_SERVER=0`` turns it off.
_fork_server: list[ForkServer] = []


def preload_servers(modules: Sequence[str]) -> None:
    """Starts this process's fork server (once) with ``modules`` imported."""
    if _fork_server or os.environ.get("AGGVIEW_FORK_SERVER", "1") == "0":
        return
    env = _server_env(CHECKOUT)
    _fork_server.append(ForkServer(modules, env, {"PYTHONPATH", PARENT_ENV}))


def _server_env(code: Path) -> dict[str, str]:
    """A server's environment: this process's, the code it runs first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), env.get("PYTHONPATH")]))
    return env


@dataclass
class Server:
    role: str
    args: list[str]
    log_path: Path
    port: int = 0
    flags: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | ForkedProcess | None = None
    code: Path = CHECKOUT  # the checkout whose code the process runs (benchmarks: an old one)
    # what the command runs under, e.g. ``ip netns exec HOST`` (bench.netns: a member per host)
    prefix: list[str] = field(default_factory=list)
    metrics_port: int = 0  # where it serves /metrics, as it said at its start (0: nowhere)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        """Its ``/metrics`` ('' when it serves none)."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics" if self.metrics_port else ""

    def start(
        self, timeout: float = 30.0, env: dict[str, str] | None = None, once: Sequence[str] = ()
    ) -> None:
        """``env`` is added to this start's environment only (e.g. ``AGGVIEW_FAILPOINTS``),
        and ``once`` to its arguments (a restart goes without them)."""
        self.wait_listening(self.launch(env, once), timeout)

    def launch(self, env: dict[str, str] | None = None, once: Sequence[str] = ()) -> int:
        """Starts the process without waiting for it (see ``start``); returns where its log
        stood, for ``wait_listening``. Several servers that wait for one another at start
        (a follower waits for the leader) are launched together, then waited for."""
        args = [*self.args, *once, "--port", str(self.port)]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        extra_env, env = env, _server_env(self.code)
        env[PARENT_ENV] = str(os.getpid())  # see ``die_with_parent``
        env.update(extra_env or {})
        forker = _fork_server[0] if _fork_server else None
        if self.code == CHECKOUT and not self.prefix and forker and forker.forkable(env):
            self.log_path.touch()  # waited on at once, before the fork opens it
            module = cli_module(self.code)
            self.process = forker.launch(module, [*self.flags, *args], env, str(self.log_path))
            return offset
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [*self.prefix, sys.executable, "-m", cli_module(self.code), *self.flags, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                # ``-m`` looks in the working directory first: another checkout's code runs
                # from its own (this one's would shadow it when started from here)
                cwd=None if self.code == CHECKOUT else self.code,
            )
        return offset

    def wait_listening(self, offset: int, timeout: float = 30.0) -> None:
        """Returns once the launched process says it listens (its log after ``offset``)."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                said = log.read().decode(errors="replace")
            match = _LISTENING.search(said)
            if match:
                self.port = int(match.group(2))
                metrics = _METRICS.search(said)
                self.metrics_port = int(metrics.group(2)) if metrics else 0
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.role} exited at start:\n{self.tail()}")
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"{self.role} did not start within {timeout}s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def cpu_seconds(self) -> float:
        """CPU the server's process, and every process it started, used so far (0 if it is
        not running)."""
        return process_tree_cpu_seconds(self.process.pid) if self.process is not None else 0.0

    def kill(self) -> None:
        """kill -9: no checkpoint, no goodbye."""
        if self.running():
            assert self.process is not None
            self.process.kill()
            self.process.wait()

    def stop(self, timeout: float = 20.0) -> None:
        self.signal_stop()
        self.wait_stopped(timeout)

    def signal_stop(self) -> None:
        if self.running():
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout: float) -> None:
        """Waits for a signalled server (kill -9 after ``timeout``) and says so on stderr when
        it did not stop cleanly: its log then holds the stacks of where it hung."""
        if self.process is None:
            return
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.process.wait()
        if code not in (0, -signal.SIGKILL):
            print(
                f"aggview: {self.role} stopped with status {code}; see {self.log_path}",
                file=sys.stderr,
                flush=True,
            )


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: an exited child of ours is reaped on the way, a zombie is dead.
    Not a pid (0 or less: to ``waitpid`` and ``kill``, a process group) is not alive."""
    if pid <= 0:
        return False
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False  # our child, and it has exited (now reaped)
    except ChildProcessError:
        pass  # not our child: ask the kernel
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return False
