"""What the metrics cost on the hot path, as a share of the members' samples (issue #44).

A throughput ratio with and without metrics (``python -m bench.views --without-metrics``)
moves ±30 % from pass to pass on a 2-core machine, ten times the 3 % it should bound. This
measures the cost directly instead: a cluster under the pg_ivm workload (one-row event inserts
of the dashboard schema at the thesis scale under ``bench.views``' pg_ivm view, ``--clients``
tasks on one AsyncClient), each member sampled by ``py-spy --gil`` meanwhile; the share is the
samples whose stack holds a frame of ``aggview/metrics.py`` or ``prometheus_client`` over all
samples that held the GIL (Python running: a thread blocked on a queue or in ``fdatasync`` is
left out, so the share is an upper bound of the metrics' share of the members' CPU). Needs
``py-spy`` (``pip install py-spy``) and root or ptrace rights.

    python -m bench.metrics_share                       # 1 and 8 clients, about a minute
    python -m bench.metrics_share --clients 8 --seconds 30 --processes 2
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from aggclient.client import AsyncClient, Client
from agglauncher.cluster import LocalCluster
from bench.views_cases import PGIVM_SQL, PGIVM_VIEW
from bench.views_workload import SCALE, make_event
from loadgen import dashboard

METRICS_FRAMES = ("aggview/metrics.py", "prometheus_client")


def metrics_share(raw: str, where: Counter[str] | None = None) -> tuple[int, int]:
    """(samples in metrics code, all samples) of py-spy's ``--format raw`` output: one line
    per distinct stack, frames joined by ``;``, then its count. ``where`` counts the samples
    in metrics code by their outermost metrics frame (the call the hot path makes)."""
    metrics = total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        total += int(count)
        frames = [f for f in stack.split(";") if any(name in f for name in METRICS_FRAMES)]
        if frames:
            metrics += int(count)
            if where is not None:
                where[frames[0]] += int(count)
    return metrics, total


def setup(address: str) -> None:
    """The dashboard tables at the thesis scale and pg_ivm's view, as ``bench.views`` has them."""
    with Client(address) as client:
        dashboard.create_schema(client)
        dashboard.populate(client, SCALE)
        client.sql(dashboard.view_ddl(PGIVM_VIEW, PGIVM_SQL))


async def load(address: str, clients: int, seconds: float, first_id: int) -> int:
    """One-row event inserts from ``clients`` tasks for ``seconds``; returns the commits."""
    done = 0
    async with AsyncClient(address) as client:
        end = time.monotonic() + seconds

        async def task(number: int) -> None:
            nonlocal done
            rng = random.Random(number)
            event_id = first_id + number * 10_000_000
            while time.monotonic() < end:
                event_id += 1
                async with client.transaction() as tx:
                    tx.insert("events", make_event(rng, event_id, None))
                done += 1

        await asyncio.gather(*(task(n) for n in range(clients)))
    return done


def sample(pids: list[int], seconds: float, out: Path) -> list[subprocess.Popen[bytes]]:
    """One py-spy per member process (and the processes it forked: a member is a forked child
    of the launcher's process), ``seconds`` long, raw stacks into ``out``/PID.txt."""
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("needs py-spy: pip install py-spy")
    return [
        subprocess.Popen(
            [spy, "record", "--subprocesses", "--gil", "-p", str(pid), "-d", str(int(seconds))]
            + ["-r", "200", "--format", "raw", "-o", str(out / f"{pid}.txt")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for pid in pids
    ]


async def run_case(
    address: str, pids: list[int], clients: int, first_id: int, args: argparse.Namespace, out: Path
) -> int:
    """The load for warmup + seconds (+2 s of slack), the members sampled after the warmup."""
    loading = asyncio.create_task(load(address, clients, args.warmup + args.seconds + 2, first_id))
    await asyncio.sleep(args.warmup)
    spies = sample(pids, args.seconds, out)
    await asyncio.to_thread(lambda: [spy.wait() for spy in spies])
    return await loading


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seconds", type=float, default=20.0, help="sampled time per case")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--ltms", type=int, default=3)
    parser.add_argument("--processes", type=int, default=1, help="member processes")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="aggview-metrics-share-") as tmp:
        with LocalCluster(Path(tmp) / "data", ltms=args.ltms, processes=args.processes) as cluster:
            setup(cluster.address)
            pids = [server.process.pid for server in cluster.servers if server.process]
            where: dict[int, Counter[str]] = {clients: Counter() for clients in args.clients}
            print("clients | tx/s | member samples | in metrics code | share")
            print("--- | --- | --- | --- | ---")
            for number, clients in enumerate(args.clients):
                out = Path(tmp) / f"spy-{clients}"
                out.mkdir()
                first_id = (number + 1) * 1_000_000_000

                commits = asyncio.run(run_case(cluster.address, pids, clients, first_id, args, out))
                metrics = total = 0
                for path in out.glob("*.txt"):
                    m, t = metrics_share(path.read_text(), where[clients])
                    metrics, total = metrics + m, total + t
                rate = commits / (args.warmup + args.seconds + 2)
                share = f"{100 * metrics / total:.2f} %" if total else "-"
                print(f"{clients} | {rate:,.0f} | {total:,} | {metrics:,} | {share}")
            for clients, frames in where.items():  # where the hot path enters metrics code
                print(f"\n{clients} client(s), samples by call into metrics code:")
                for frame, count in frames.most_common(8):
                    print(f"  {count:5,}  {frame}")


if __name__ == "__main__":
    main()
