"""Pausing a member of a local cluster in tests (``aggview.processes.paused``), outside any
write to the embedded store its members share."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator

from agglauncher.cluster import LocalCluster
from aggview import processes
from ltm.store.sqlite import writer_lock


@contextlib.contextmanager
def paused(*members: subprocess.Popen[bytes], cluster: LocalCluster) -> Iterator[None]:
    """``members`` stopped (SIGSTOP) for the block, none inside a store write, then resumed
    (SIGCONT) whatever the block does."""
    held = None if cluster.store else writer_lock(cluster.data / "store.db")
    with processes.paused([p.pid for p in members], held):
        yield
