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
import subprocess
from collections.abc import Iterator

from agglauncher.cluster import LocalCluster
from aggview.processes import wait_stopped
from ltm.store.sqlite import writer_lock


@contextlib.contextmanager
def paused(*processes: subprocess.Popen[bytes], cluster: LocalCluster) -> Iterator[None]:
    """``processes`` stopped (SIGSTOP) for the block, none inside a store write, then resumed
    (SIGCONT) whatever the block does."""
    held = contextlib.nullcontext() if cluster.store else writer_lock(cluster.data / "store.db")
    with held:
        for process in processes:
            os.kill(process.pid, signal.SIGSTOP)
        for process in processes:
            wait_stopped(process.pid)
    try:
        yield
    finally:
        for process in processes:
            os.kill(process.pid, signal.SIGCONT)
