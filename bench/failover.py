"""Failover time: kill -9 the process serving a partition, again and again, under load.

A replicated cluster of 3 partitions in ``--processes P`` coordinating members (default 3,
each log copied to the next member) runs closed-loop 3-row transactions from 16 tasks. Each
round waits until every partition's standby is in sync and every partition is back at its home
member, kills the process serving partition ``round % 3`` for good, and times how long it takes
until a transaction that writes to every partition commits again (the pause clients see); then
the killed process is restarted, rejoins holding copies and gets its partitions handed back (a
leader that was killed comes back as a follower). At the end, sum(v) is checked against the
commits reported.

    python -m bench.failover --kills 20
    python -m bench.failover --kills 6 --processes 2
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from aggclient.client import AsyncClient
from agglauncher.cluster import LocalCluster
from aggview import errors
from bench.clusters import check_sum, preload
from bench.load import CREATE, Ledger, transaction
from bench.measurements import err, out
from coordinator import leadership
from ltm.store import Store, open_store, ownership

PROBE_ROWS = 40  # a probe with 40 random rows writes to all 3 partitions (but for 1 in 10^6)


def all_in_sync(cluster: LocalCluster, store: Store) -> bool:
    records = [ownership.read(store, p) for p in range(cluster.ltms)]
    home = cluster.processes < 2 or all(r.owner == r.partition for r in records)
    in_sync = all(r.in_sync for r in records)
    return home and in_sync and all(s.running() for s in cluster.servers)


async def wait_in_sync(cluster: LocalCluster, store: Store, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(all_in_sync, cluster, store):
        if time.monotonic() > deadline:
            raise RuntimeError("standbys did not get in sync in time")
        await asyncio.sleep(0.05)


async def run(args: argparse.Namespace, data: Path) -> int:
    cluster = LocalCluster(
        data,
        ltms=3,
        replicate=True,
        failover_after=args.failover_after,
        checkpoint_interval=1.0,
        processes=args.processes,
    )
    with cluster, open_store(cluster.store_url) as store:
        ledger = Ledger()
        async with AsyncClient(cluster.address, timeout=10) as client:
            await client.sql(CREATE)
            await preload(client, args.rows, 500)
            stop = asyncio.Event()
            commits = 0

            async def load() -> None:
                nonlocal commits
                while not stop.is_set():
                    keys = random.sample(range(args.rows), 3)
                    try:
                        await transaction(client, keys)
                    except errors.AggviewError as exc:
                        ledger.failed(exc, 3)
                        await asyncio.sleep(0.01)
                        continue
                    ledger.row_updates += 3
                    commits += 1

            workers = [asyncio.create_task(load()) for _ in range(16)]
            pauses: list[float] = []
            leader_pauses: list[float] = []
            started = time.perf_counter()
            for round_ in range(args.kills):
                await wait_in_sync(cluster, store)
                partition = round_ % cluster.ltms
                owner = (await asyncio.to_thread(ownership.read, store, partition)).owner
                victim = owner % args.processes  # the member hosting it
                leader = (await asyncio.to_thread(leadership.read, store)).member
                killed = time.perf_counter()
                cluster.member(victim).kill()
                probes = 0
                while True:
                    probes += 1
                    keys = random.sample(range(args.rows), PROBE_ROWS)
                    try:
                        await transaction(client, keys)
                        ledger.row_updates += PROBE_ROWS
                        break
                    except errors.AggviewError as exc:
                        ledger.failed(exc, PROBE_ROWS)
                        await asyncio.sleep(0.02)
                pause = time.perf_counter() - killed
                pauses.append(pause)
                what = "member"
                if victim == leader:
                    what = "member (the leader)"
                    leader_pauses.append(pause)
                err.print(f"kill {round_ + 1}: {what} {victim}, writes resumed after {pause:.2f}s")
                await asyncio.to_thread(cluster.member(victim).start)
            elapsed = time.perf_counter() - started
            stop.set()
            await asyncio.gather(*workers)
        layout = f"{args.processes} members"
        out.print(
            f"failover ({layout}, --failover-after {args.failover_after:g}s, {args.kills} "
            f"kills): median {statistics.median(pauses):.2f}s, max {max(pauses):.2f}s, "
            f"min {min(pauses):.2f}s; load went on at {commits / elapsed:.0f} tx/s overall"
        )
        if leader_pauses:
            out.print(
                f"  of which the leader ({len(leader_pauses)} kills): median "
                f"{statistics.median(leader_pauses):.2f}s, max {max(leader_pauses):.2f}s"
            )
        out.print(await check_sum(cluster, ledger.row_updates, ledger.ambiguous))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--failover-after", type=float, default=1.0)
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument(
        "--processes", type=int, default=3, help="coordinating members (2 or 3: logs are copied)"
    )
    args = parser.parse_args(argv)
    if not 2 <= args.processes <= 3:
        parser.error("--processes must be 2 or 3 (3 partitions, each log copied to another)")
    with tempfile.TemporaryDirectory(prefix="aggview-failover-") as tmp:
        return asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
