"""The benchmarks' clusters: starting one in a setup (embedded, replicated, HBase, old code),
preloading it, waiting until it settles, and checking the sum of its rows after a load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from aggclient.client import AsyncClient
from agglauncher.cluster import AS_START, LocalCluster
from aggview.net import GRPC_OPTIONS
from aggview.security import TlsDir, member_channel, member_metadata
from aggview.wire import ltm_pb2 as lpb
from aggview.wire import ltm_pb2_grpc
from bench.load import TABLE, statuses
from bench.measurements import err
from ltm.store import ownership


async def preload(client: AsyncClient, rows: int, batch: int, concurrency: int = 4) -> None:
    """Inserts rows 0..rows-1 with v = 0, in transactions of ``batch`` rows."""
    batches = iter(range(0, rows, batch))

    async def worker() -> None:
        for first in batches:
            async with client.transaction() as tx:
                for i in range(first, min(first + batch, rows)):
                    tx.insert(TABLE, {"id": i, "v": 0})

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def settle(cluster: LocalCluster, timeout: float = 30.0) -> None:
    """Waits until every LTM has checkpointed its dirty rows and holds nothing prepared, so
    one case's checkpoint does not land in the next case's window. A one-process cluster shows
    no LTM status: there, two checkpoint intervals pass instead."""
    if cluster.processes >= 1:
        await asyncio.sleep(2 * cluster.checkpoint_interval)
        return
    if not await ltms_until(cluster, lambda r: r.dirty_rows == 0 and r.prepared == 0, timeout):
        err.print(f"[yellow]LTMs still busy after {timeout:.0f}s; going on[/]")


async def replicas_in_sync(cluster: LocalCluster, timeout: float = 30.0) -> None:
    """Measures start once every LTM's log reaches its backup (a resync follows the start)."""
    if cluster.processes >= 2:
        synced = await partitions_until(cluster, lambda r: r.replicated, timeout)
    else:
        synced = await ltms_until(cluster, lambda r: r.replicated, timeout)
    if not synced:
        raise RuntimeError("the LTMs' logs did not reach their backups in time")


async def partitions_until(
    cluster: LocalCluster, done: Callable[[lpb.StatusReply], bool], timeout: float
) -> bool:
    """Polls each partition's status at the member hosting it until ``done`` holds for all."""
    members = min(cluster.processes, cluster.ltms)
    tls = TlsDir.load(cluster.tls_dir) if cluster.tls_dir is not None else None
    channels = [member_channel(s.address, tls, GRPC_OPTIONS) for s in cluster.servers]
    stubs = [ltm_pb2_grpc.LtmStub(channel) for channel in channels]
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            replies = await asyncio.gather(
                *(
                    stubs[p % members].Status(
                        lpb.StatusRequest(),
                        timeout=5,
                        metadata=(*member_metadata(tls), (ownership.PARTITION_HEADER, str(p))),
                    )
                    for p in range(cluster.ltms)
                )
            )
            if all(done(r) for r in replies):
                return True
            await asyncio.sleep(0.1)
        return False
    finally:
        for channel in channels:
            await channel.close()


async def ltms_until(
    cluster: LocalCluster, done: Callable[[lpb.StatusReply], bool], timeout: float
) -> bool:
    """Polls every LTM's status until ``done`` holds for all of them (False: timed out)."""
    deadline = time.monotonic() + timeout
    addresses = [cluster.member(i).address for i in range(cluster.ltms)]
    async with statuses(cluster, addresses) as ask:
        while time.monotonic() < deadline:
            if all(done(r) for r in await ask()):
                return True
            await asyncio.sleep(0.1)
        return False


async def check_sum(cluster: LocalCluster, expected: int, ambiguous: int) -> str:
    """Compares sum(v) with the row updates of every transaction that reported a commit."""
    async with AsyncClient(cluster.address, **cluster.client_options("read")) as client:
        rows = await client.scan(TABLE)
    total = sum(row["v"] for row in rows)
    if total == expected:
        return f"consistency check: sum(v) = {total} as expected"
    if expected < total <= expected + ambiguous:
        return (
            f"consistency check: sum(v) = {total}, {total - expected} above the {expected} "
            f"reported committed; {ambiguous} row updates failed without a clear outcome"
        )
    return f"[bold red]CONSISTENCY CHECK FAILED[/]: sum(v) = {total}, expected {expected}"


def setup_processes(setup: str, processes: int = AS_START) -> int:
    """The --processes of a setup: ``old`` runs the servers of --old (code from before
    members) in their separate layout (0: a coordinator and a process per LTM), ``old-`` + a
    layout in that layout; plain, tls, replicated and hbase run ``processes``."""
    layout = setup.removeprefix("old").removeprefix("-").removeprefix("replicated-")
    if layout == "tls":  # old-tls: older code in the default layout, secure
        return processes
    if layout == "one-process":
        return 1
    if layout.startswith("processes-"):
        return int(layout.removeprefix("processes-"))
    return 0 if setup.startswith("old") else processes


@contextlib.contextmanager
def running_cluster(
    data: Path,
    ltms: int,
    fsync: bool,
    setup: str = "plain",
    store: str = "",
    processes: int = AS_START,
    code: Path | None = None,
    metrics: bool = True,
) -> Iterator[LocalCluster]:
    """A started cluster that is stopped cleanly on the way out, even on Ctrl-C or SIGTERM:
    once an exception (such as the KeyboardInterrupt of Ctrl-C) unwinds through here, further
    Ctrl-C and SIGTERM are ignored so they cannot cut the clean stop or the removal of the
    data directory short (``LocalCluster.stop`` kills what does not stop within 20 s)."""
    cluster = LocalCluster(
        data,
        ltms=ltms,
        fsync=fsync,
        secure=setup.removeprefix("old-") == "tls",
        replicate="replicated" in setup,
        store=store,
        processes=setup_processes(setup, processes),
        metrics=metrics,
        **({"code": code} if code is not None else {}),
    )
    try:
        with cluster:
            try:
                yield cluster
            except BaseException:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                err.print("stopping the cluster...")
                raise
    finally:
        cluster.kill()  # anything still running (a failed start, or a signal during stop)


def hbase_store(url: str | None) -> str:
    """The HBase URL with a table prefix of its own, so each case starts on empty tables."""
    if not url:
        raise SystemExit("--setup hbase needs --hbase hbase://HOST:PORT (aggview hbase start)")
    prefix = f"b{os.getpid()}x{time.monotonic_ns() % 10**9}"
    return url + ("&" if "?" in url else "?") + f"table_prefix={prefix}"


def old_code(args: argparse.Namespace) -> Path:
    """The checkout --setup old runs (a ``git worktree`` of an older commit)."""
    if not args.old or not any(
        (Path(args.old) / cli).exists() for cli in ("aggcli/cli.py", "aggview/cli.py")
    ):
        raise SystemExit("--setup old needs --old DIR, a checkout of aggview (git worktree add)")
    return Path(args.old).resolve()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stop_clusters_on_signals() -> None:
    """Ctrl-C and SIGTERM raise KeyboardInterrupt, so a benchmark stops its clusters as on
    Ctrl-C, also when started in the background (where SIGINT is ignored)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
