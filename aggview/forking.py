"""A fork server for this checkout's servers: one interpreter that imported what a server
imports, and forks each server from there instead of starting a new interpreter.

A member's start is mostly imports (0.75 of its first CPU second; the test suite starts about
320 members, ``aggview start`` restarts them). ``ForkServer`` is a process of its own, started by
``Server`` users before their first launch (``aggview.processes.preload_servers``); it never
starts a thread or a gRPC channel, so a fork of it is as clean as a new interpreter. Its protocol
is JSON lines: a launch ``{"module", "args", "env", "log", "cwd"}`` on its stdin is answered
``{"pid": N}``; ``{"ended": N, "code": C}`` follows when that server ends (C as
``Popen.returncode``: the exit status, or minus the signal). It exits when its stdin closes (the
process that started it died): its servers then get SIGTERM (``die_with_parent``).

The standard library's ``multiprocessing`` fork server was tried first: it runs the starting
program's ``__main__`` again in every child, which a user's script without a main guard, or a
test run, cannot allow.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import setproctitle


class ForkedProcess:
    """A server forked by a ``ForkServer``, with the part of ``subprocess.Popen`` that
    ``Server`` and its users call (it is the fork server's child: only the fork server can say
    how it ended)."""

    def __init__(self, pid: int, server: ForkServer) -> None:
        self.pid = pid
        self._server = server

    @property
    def returncode(self) -> int | None:
        """Its exit status as the fork server reported it; once the fork server is gone (its
        servers got SIGTERM: ``die_with_parent``), ``-SIGTERM`` as soon as it no longer runs,
        since nobody is left to say how it ended."""
        code = self._server.ended.get(self.pid)
        if code is None and self._server.gone and not _running(self.pid):
            code = self._server.ended.setdefault(self.pid, -signal.SIGTERM)
        return code

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """As ``Popen.wait``; also returns (does not hang) when the fork server died."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._server.changed:
            self._server.changed.wait_for(
                lambda: self.pid in self._server.ended or self._server.gone, timeout
            )
        while self.returncode is None and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.02)  # the fork server is gone: its servers end by their SIGTERM
        code = self.returncode
        if code is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # as Popen: nothing once it ended (its pid may be reused)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def end_when_parent_ends(parent: int) -> None:
    """SIGTERM to this process when its parent dies, even by kill -9 (``PR_SET_PDEATHSIG``);
    at once if ``parent`` is already gone (it died before the request took effect)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class ForkServer:
    """The starting side: launches servers through the fork server process."""

    def __init__(self, modules: Sequence[str], env: dict[str, str], per_launch: set[str]) -> None:
        self.environment = env  # what the fork server imported its modules under
        self.per_launch = per_launch  # variables a launch may set: read only after the fork
        self.ended: dict[int, int] = {}
        self.gone = False  # its output ended: it died (or is dying)
        self.changed = threading.Condition()
        self._answers: list[int] = []
        self._lock = threading.Lock()  # one launch at a time: answers come in launch order
        self._process = subprocess.Popen(
            [sys.executable, "-c", "from aggview.forking import serve; serve()", *modules],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            env=env,
            text=True,
        )
        threading.Thread(target=self._read, name="fork-server", daemon=True).start()

    def forkable(self, env: dict[str, str]) -> bool:
        """Whether a server with ``env`` may be forked: the variables the modules were
        imported under (some are read at import), but for those read after the fork."""
        changed = {
            k for k in env.keys() | self.environment.keys() if env.get(k) != self.environment.get(k)
        }
        return self.alive() and changed <= self.per_launch

    def alive(self) -> bool:
        return self._process.poll() is None

    def launch(self, module: str, args: list[str], env: dict[str, str], log: str) -> ForkedProcess:
        request = {"module": module, "args": args, "env": env, "log": log, "cwd": os.getcwd()}
        assert self._process.stdin is not None
        with self._lock, self.changed:
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
            if not self.changed.wait_for(lambda: self._answers or not self.alive(), 30.0):
                raise RuntimeError("the fork server did not answer a launch within 30 s")
            if not self._answers:
                raise RuntimeError(f"the fork server exited ({self._process.returncode})")
            return ForkedProcess(self._answers.pop(0), self)

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            message = json.loads(line)
            with self.changed:
                if "pid" in message:
                    self._answers.append(message["pid"])
                else:
                    self.ended[message["ended"]] = message["code"]
                self.changed.notify_all()
        with self.changed:  # it died: its servers got SIGTERM (die_with_parent)
            self.gone = True
            self.changed.notify_all()


def serve() -> None:
    """The fork server's loop (``python -c``, the modules to import as arguments). Returns in a
    forked child once its server's module has run, so the interpreter ends as ``python -m``
    would end."""
    for module in sys.argv[1:]:
        importlib.import_module(module)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the loop
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    pending = b""
    me = os.getpid()
    while True:
        for key, _ in selector.select():
            if key.fileobj == wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
                _reap()
                continue
            read = os.read(0, 65536)
            if not read:
                return  # the starting process is gone
            pending += read
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                pid = os.fork()
                if pid == 0:
                    end_when_parent_ends(me)  # before anything: the fork server may die now
                    selector.close()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for fd in (wake_r, wake_w):
                        os.close(fd)
                    _become(json.loads(line))
                    return
                _say({"pid": pid})


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _say({"ended": pid, "code": os.waitstatus_to_exitcode(status)})


def _say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _become(request: dict[str, Any]) -> None:
    """In the forked child: the launch's environment, log, directory and arguments, then the
    module's ``main()``, which is what ``python -m module args`` runs."""
    # what ``ps`` and ``pgrep -f`` show: the command a new interpreter would have run (set
    # first: it takes the space of the environment the fork server started with)
    command = [sys.executable, "-m", request["module"], *request["args"]]
    setproctitle.setproctitle(" ".join(command))
    os.environ.clear()
    os.environ.update(request["env"])
    out = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    nothing = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((out, 1), (out, 2), (nothing, 0)):
        os.dup2(source, target)
    os.close(out)
    os.close(nothing)
    os.chdir(request["cwd"])
    sys.argv = [request["module"], *request["args"]]
    # what ``python -m module`` runs: its main() (run_module would run it a second time
    # beside the copy the fork server imported)
    importlib.import_module(request["module"]).main()
