"""Pausing a member (SIGSTOP) as a GC pause or a frozen VM would, without freezing the store.

Every member of a local cluster shares the embedded store's one SQLite file, whose writer lock
a process holds for the length of a write. A member stopped inside one holds it for the whole
pause, so every other member's store writes wait too (SQLite's busy timeout): the test then
measures a store outage instead of the fault it meant. With HBase, the store is a server of its
own and a paused client holds nothing there. So the pause is taken while the test holds the
writer lock itself, and the lock is released once every thread of the member has stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from agglauncher.cluster import LocalCluster


@contextlib.contextmanager
def store_writer_lock(cluster: LocalCluster) -> Iterator[None]:
    """The embedded store's writer lock, held for the block (nothing when on HBase)."""
    if cluster.store:
        yield
        return
    connection = sqlite3.connect(cluster.data / "store.db", timeout=60, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            connection.execute("ROLLBACK")
    finally:
        connection.close()


def wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Returns once every thread of ``pid`` is stopped (``kill`` returns before they are)."""
    deadline = time.monotonic() + timeout
    tasks = Path(f"/proc/{pid}/task")
    while True:
        states = []
        for task in tasks.iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that just ended
                # the state follows the command name, which is in parentheses
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        if all(state in ("T", "t") for state in states):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} did not stop: thread states {states}")
        time.sleep(0.005)


@contextlib.contextmanager
def paused(*processes: subprocess.Popen[bytes], cluster: LocalCluster) -> Iterator[None]:
    """``processes`` stopped (SIGSTOP) for the block, none inside a store write, then resumed
    (SIGCONT) whatever the block does."""
    with store_writer_lock(cluster):
        for process in processes:
            os.kill(process.pid, signal.SIGSTOP)
        for process in processes:
            wait_stopped(process.pid)
    try:
        yield
    finally:
        for process in processes:
            os.kill(process.pid, signal.SIGCONT)
