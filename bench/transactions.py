"""Transaction throughput and latency of a local cluster (one coordinator, N LTMs).

For every LTM count a fresh :class:`agglauncher.cluster.LocalCluster` is started in a temporary
directory, ``bench(id INT PRIMARY KEY, v INT NOT NULL)`` is created and preloaded, and then, for
every rows-per-transaction count k, transactions that add 1 to ``v`` of k distinct random rows
are run from this one process with ``aggclient.client.AsyncClient``:

* closed loop (default): ``--clients`` asyncio tasks, each sending its next transaction as soon
  as the previous one returns, for ``--seconds`` after ``--warmup`` seconds;
* open loop (``--rate R``): transactions arrive at R per second (Poisson or fixed interval), each
  as its own asyncio task, whatever the state of earlier ones; latency is measured from the
  scheduled arrival, so a client that falls behind shows up in the figures;
* ``--load-fraction F`` runs the closed loop and then the open loop at F times the throughput
  the closed loop reached (e.g. ``--ltms 3 --rows 3 --load-fraction 0.5``).

``--restart`` instead times a restart of a 1-LTM cluster over a preloaded data directory, from
process start to the first successful ``get`` (the LTM loads rows lazily).

    python -m bench.transactions --ltms 1 3 --rows 1 3 --seconds 5
    python -m bench.transactions --restart
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from aggclient.client import AsyncClient
from agglauncher.cluster import AS_START, LocalCluster
from aggview import errors
from aggview.net import GRPC_OPTIONS
from aggview.processes import process_cpu_seconds
from aggview.retry import RetryPolicy, retry_on
from aggview.security import TlsDir, member_channel, member_metadata
from aggview.wire import ltm_pb2 as lpb
from aggview.wire import ltm_pb2_grpc
from ltm.store import ownership

TABLE = "bench"
CREATE = f"CREATE TABLE {TABLE} (id INT PRIMARY KEY, v INT NOT NULL)"

out = Console(width=None if sys.stdout.isatty() else 132)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 132)
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- measurements


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values (None for no values)."""
    if not values:
        return None
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


@dataclass
class Result:
    ltms: int
    rows: int  # rows per transaction
    mode: str  # "closed" or "open"
    clients: int  # closed loop: concurrent tasks
    channels: int
    offered: float | None  # open loop: arrivals per second
    seconds: float
    committed: int = 0
    retries: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    unfinished: int = 0  # open loop: still running when the drain timeout ran out
    tps: float = 0.0
    mean_ms: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    p999_ms: float | None = None
    max_ms: float | None = None
    lag_p99_ms: float | None = None  # open loop: scheduled arrival -> commit call started
    cpu: dict[str, float] = field(default_factory=dict)  # role -> % of one core
    # coordinating members: "coordinated <role>" -> transactions it committed in the window;
    # "clock messages", "follower transactions" (clock requests and replies of the followers)
    members: dict[str, int] = field(default_factory=dict)
    setup: str = "plain"  # "tls": TLS everywhere, tokens, member checks; "replicated": LTM logs;
    # "hbase": the store on a real HBase

    @property
    def retries_per_s(self) -> float:
        return self.retries / self.seconds

    def summarize(self, latencies: list[float], lags: list[float] | None = None) -> None:
        latencies.sort()
        ms = [x * 1000 for x in latencies]
        self.mean_ms = sum(ms) / len(ms) if ms else None
        self.p50_ms = percentile(ms, 0.50)
        self.p90_ms = percentile(ms, 0.90)
        self.p99_ms = percentile(ms, 0.99)
        self.p999_ms = percentile(ms, 0.999)
        self.max_ms = ms[-1] if ms else None
        if lags is not None:
            self.lag_p99_ms = percentile(sorted(x * 1000 for x in lags), 0.99)


def _machine_busy_seconds() -> float:
    """CPU seconds every process on the machine has used (all cores), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / _CLOCK_TICKS


PROCESS = "process "  # CpuMeter's key prefix for one server process's own figure


class CpuMeter:
    """CPU use of the coordinator, the LTMs (summed), this client and everything else on the
    machine ("other": other people's processes skew the figures) over a window; and of each
    server process on its own (``PROCESS`` + its role, e.g. "process member-1")."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self._start = self._sample()

    def _sample(self) -> tuple[float, dict[str, float]]:
        roles: dict[str, float] = {"client": time.process_time(), "coordinator": 0.0, "ltms": 0.0}
        for server in self.cluster.servers:
            if server.process is not None:
                # members coordinate (and host partitions): counted with the coordinator
                role = "ltms" if server.role.startswith("ltm") else "coordinator"
                used = process_cpu_seconds(server.process.pid)
                roles[role] += used
                roles[PROCESS + server.role] = used
        busy = sum(v for k, v in roles.items() if not k.startswith(PROCESS))
        roles["other"] = _machine_busy_seconds() - busy
        return time.perf_counter(), roles

    def stop(self) -> dict[str, float]:
        (t0, a), (t1, b) = self._start, self._sample()
        used = {role: round(100 * (b[role] - a.get(role, 0)) / (t1 - t0), 1) for role in b}
        # the machine's total is sampled at clock ticks, the processes' use is exact: over a
        # window of a second or two the total can come out below their sum
        used["other"] = max(0.0, used["other"])
        return used


# --------------------------------------------------------------------------- clients and load


async def open_clients(cluster: LocalCluster, count: int) -> list[AsyncClient]:
    """``count`` clients, each on its own TCP connection (and, on a secure cluster, with TLS
    and a write token).

    gRPC shares one connection between channels whose arguments are equal, so AsyncClient
    instances made with the same address would all go over one connection: every client after
    the first gets a private subchannel pool."""
    security = cluster.client_options("write")
    private = [("grpc.use_local_subchannel_pool", 1)]
    return [
        AsyncClient(cluster.address, options=private if i else (), **security) for i in range(count)
    ]


def total_retries(clients: Sequence[AsyncClient]) -> int:
    return sum(client.retries for client in clients)


# failures that tell the transaction did not commit (others, like a timeout, may hide a commit)
_DEFINITE = (
    errors.TooLate,
    errors.ConditionFailed,
    errors.InvalidArgument,
    errors.RowNotFound,
    errors.AlreadyExists,
    errors.LimitExceeded,
)


class Ledger:
    """Every transaction's fate over a whole cluster's life, for the final consistency check."""

    def __init__(self) -> None:
        self.row_updates = 0  # sum of k over committed transactions
        self.ambiguous = 0  # sum of k over those that failed without telling whether they did

    def failed(self, exc: BaseException, rows: int) -> str:
        if not isinstance(exc, _DEFINITE):
            self.ambiguous += rows
        return type(exc).__name__


async def member_counts(cluster: LocalCluster) -> dict[str, int]:
    """Each coordinating member's committed transactions, and the followers' clock messages
    (none when no process is a member)."""
    members = [s for s in cluster.servers if s.role.startswith("member")]
    if len(members) < 2:
        return {}
    counts: dict[str, int] = {"clock messages": 0, "follower transactions": 0}
    async with statuses(cluster, [m.address for m in members]) as ask:
        replies = await ask()
    for server, status in zip(members, replies, strict=True):
        counts[f"coordinated {server.role}"] = status.coordinated
        if server.role != "member-0":
            counts["clock messages"] += status.clock_requests + status.clock_replies
            counts["follower transactions"] += status.coordinated
    return counts


async def measure_window(
    cluster: LocalCluster, clients: Sequence[AsyncClient], start: float, end: float
) -> tuple[int, dict[str, float], dict[str, int]]:
    """Retries, CPU use and the members' counts between two perf_counter instants."""
    await asyncio.sleep(max(0.0, start - time.perf_counter()))
    retries, meter = total_retries(clients), CpuMeter(cluster)
    counts = await member_counts(cluster)
    await asyncio.sleep(max(0.0, end - time.perf_counter()))
    cpu, after = meter.stop(), await member_counts(cluster)
    return total_retries(clients) - retries, cpu, {k: v - counts[k] for k, v in after.items()}


async def transaction(client: AsyncClient, keys: Sequence[int]) -> None:
    async with client.transaction() as tx:
        for key in keys:
            tx.add(TABLE, {"id": key}, {"v": 1})


async def run_closed(
    cluster: LocalCluster,
    clients: Sequence[AsyncClient],
    ledger: Ledger,
    *,
    ltms: int,
    rows: int,
    table_rows: int,
    tasks: int,
    seconds: float,
    warmup: float,
) -> Result:
    result = Result(ltms, rows, "closed", tasks, len(clients), None, seconds)
    latencies: list[float] = []
    failures: Counter[str] = Counter()
    population = range(table_rows)
    start = time.perf_counter()
    measure_from, end = start + warmup, start + warmup + seconds

    async def worker(client: AsyncClient) -> None:
        perf_counter, sample = time.perf_counter, random.sample
        while perf_counter() < end:
            keys = sample(population, rows)
            t0 = perf_counter()
            try:
                await transaction(client, keys)
            except errors.AggviewError as exc:
                name = ledger.failed(exc, rows)
                if measure_from <= perf_counter() <= end:
                    failures[name] += 1
                continue
            t1 = perf_counter()
            ledger.row_updates += rows
            if measure_from <= t1 <= end:
                latencies.append(t1 - t0)

    meter_task = asyncio.create_task(measure_window(cluster, clients, measure_from, end))

    await asyncio.gather(*(worker(clients[i % len(clients)]) for i in range(tasks)))
    result.retries, result.cpu, result.members = await meter_task
    result.committed = len(latencies)
    result.tps = len(latencies) / seconds
    result.errors = dict(failures)
    result.summarize(latencies)
    return result


async def run_open(
    cluster: LocalCluster,
    clients: Sequence[AsyncClient],
    ledger: Ledger,
    *,
    ltms: int,
    rows: int,
    table_rows: int,
    rate: float,
    poisson: bool,
    seconds: float,
    warmup: float,
    drain: float,
) -> Result:
    result = Result(ltms, rows, "open", 0, len(clients), round(rate, 1), seconds)
    latencies: list[float] = []  # scheduled arrival -> committed
    lags: list[float] = []  # scheduled arrival -> commit call started
    failures: Counter[str] = Counter()
    completed_in_window = 0
    population = range(table_rows)
    running: set[asyncio.Task[None]] = set()
    start = time.perf_counter()
    measure_from, end = start + warmup, start + warmup + seconds

    async def one(client: AsyncClient, scheduled: float) -> None:
        nonlocal completed_in_window
        keys = random.sample(population, rows)
        t0 = time.perf_counter()
        measured = scheduled >= measure_from
        try:
            await transaction(client, keys)
        except errors.AggviewError as exc:
            name = ledger.failed(exc, rows)
            if measured:
                failures[name] += 1
            return
        except asyncio.CancelledError:  # given up on after --drain: it may still commit
            ledger.ambiguous += rows
            raise
        t1 = time.perf_counter()
        ledger.row_updates += rows
        if measured:
            latencies.append(t1 - scheduled)
            lags.append(t0 - scheduled)
        if measure_from <= t1 <= end:
            completed_in_window += 1

    meter_task = asyncio.create_task(measure_window(cluster, clients, measure_from, end))

    interval = 1.0 / rate
    arrival, n = start, 0
    while arrival < end:
        delay = arrival - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        now = time.perf_counter()
        while arrival <= now and arrival < end:  # catch up on arrivals the loop slept past
            task = asyncio.create_task(one(clients[n % len(clients)], arrival))
            running.add(task)
            task.add_done_callback(running.discard)
            n += 1
            arrival += random.expovariate(rate) if poisson else interval
    result.retries, result.cpu, result.members = await meter_task
    if running:
        _, pending = await asyncio.wait(set(running), timeout=drain)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        result.unfinished = len(pending)
    result.committed = completed_in_window
    result.tps = completed_in_window / seconds
    result.errors = dict(failures)
    result.summarize(latencies, lags)
    return result


# --------------------------------------------------------------------------- cluster set-up


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


@contextlib.asynccontextmanager
async def statuses(
    cluster: LocalCluster, addresses: Sequence[str]
) -> AsyncIterator[Callable[[], Awaitable[list[lpb.StatusReply]]]]:
    """Asks the servers at ``addresses`` for their ``Status`` (as a cluster member: the
    LTM API is members-only), over channels kept open for the block."""
    tls = TlsDir.load(cluster.tls_dir) if cluster.tls_dir is not None else None
    channels = [member_channel(address, tls, GRPC_OPTIONS) for address in addresses]
    stubs = [ltm_pb2_grpc.LtmStub(channel) for channel in channels]
    metadata = member_metadata(tls)

    async def ask() -> list[lpb.StatusReply]:
        return list(
            await asyncio.gather(
                *(stub.Status(lpb.StatusRequest(), timeout=5, metadata=metadata) for stub in stubs)
            )
        )

    try:
        yield ask
    finally:
        for channel in channels:
            await channel.close()


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


# --------------------------------------------------------------------------- modes


async def bench_cluster(
    cluster: LocalCluster, args: argparse.Namespace, setup: str
) -> list[Result]:
    ltms = cluster.ltms
    ledger = Ledger()
    async with AsyncClient(cluster.address, **cluster.client_options("admin")) as admin:
        await admin.sql(CREATE)
        t0 = time.perf_counter()
        await preload(admin, args.preload, args.batch)
        err.print(
            f"{ltms} LTM(s): preloaded {args.preload} rows in {time.perf_counter() - t0:.1f}s"
        )
    await settle(cluster)
    if cluster.replicate:
        await replicas_in_sync(cluster)
    results: list[Result] = []
    for rows in args.rows:
        for channels in args.channels:
            clients = await open_clients(cluster, channels)
            try:
                common = dict(
                    ltms=ltms,
                    rows=rows,
                    table_rows=args.preload,
                    seconds=args.seconds,
                    warmup=args.warmup,
                )
                rates = list(args.rate or [])
                if not args.rate:
                    result = await run_closed(
                        cluster, clients, ledger, tasks=args.clients, **common
                    )
                    result.setup = setup
                    results.append(result)
                    report_line(result)
                    rates = [result.tps * f for f in args.load_fraction or []]
                for rate in rates:
                    await settle(cluster)
                    if rate <= 0:
                        continue
                    result = await run_open(
                        cluster,
                        clients,
                        ledger,
                        rate=rate,
                        poisson=args.arrivals == "poisson",
                        drain=args.drain,
                        **common,
                    )
                    result.setup = setup
                    results.append(result)
                    report_line(result)
            finally:
                for client in clients:
                    await client.close()
            await settle(cluster)
    if args.check:
        err.print(await check_sum(cluster, ledger.row_updates, ledger.ambiguous))
    return results


def report_line(r: Result) -> None:
    load = f"{r.clients} clients" if r.mode == "closed" else f"{r.offered:g}/s offered"
    err.print(
        f"  {r.setup}: {r.ltms} LTM(s), {r.rows} row(s)/tx, {r.channels} channel(s), {load}: "
        f"{r.tps:.0f} tx/s, p50 {_ms(r.p50_ms)} ms, p99 {_ms(r.p99_ms)} ms, "
        f"{r.retries_per_s:.1f} retries/s, errors {r.errors or 0}, CPU % {_cpu(r)}"
        + (f", arrival lag p99 {_ms(r.lag_p99_ms)} ms" if r.mode == "open" else "")
        + _per_process(r)
    )


def _per_process(r: Result) -> str:
    """Each coordinating process's CPU (% of a core), its share per committed transaction of
    the whole cluster and per transaction it coordinated, when there are several (flat as
    processes are added: no process does work that grows with the cluster's total); and the
    followers' clock messages per transaction they coordinated (falling as load rises: the
    timestamp requests are batched)."""
    shares = {k.removeprefix(PROCESS): v for k, v in r.cpu.items() if k.startswith(PROCESS)}
    if len(shares) < 2 or not r.tps:
        return ""

    def own(name: str, pct: float) -> str:
        coordinated = r.members.get(f"coordinated {name}", 0) / r.seconds
        return f" {10 * pct / coordinated:.2f} ms per own tx" if coordinated else ""

    text = "; per process " + ", ".join(
        f"{name} {pct:.0f}% ({10 * pct / r.tps:.2f} ms/tx{own(name, pct)})"
        for name, pct in sorted(shares.items())
    )
    if r.members.get("follower transactions"):
        per = r.members["clock messages"] / r.members["follower transactions"]
        text += f"; clock messages per follower tx {per:.2f}"
    return text


def _cpu(r: Result) -> str:
    return "/".join(f"{r.cpu.get(k, 0):.0f}" for k in ("coordinator", "ltms", "client", "other"))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def hbase_store(url: str | None) -> str:
    """The HBase URL with a table prefix of its own, so each case starts on empty tables."""
    if not url:
        raise SystemExit("--setup hbase needs --hbase hbase://HOST:PORT (aggview hbase start)")
    prefix = f"b{os.getpid()}x{time.monotonic_ns() % 10**9}"
    return url + ("&" if "?" in url else "?") + f"table_prefix={prefix}"


def run_load(args: argparse.Namespace) -> list[Result]:
    results: list[Result] = []
    for ltms in args.ltms:
        for setup in args.setup:  # alternated per LTM count, so drift hits all alike
            if "replicated" in setup and ltms < 2:
                err.print("replication needs at least 2 LTMs: skipped for 1")
                continue
            prefix = f"aggview-bench-{ltms}-{setup}-"
            store = hbase_store(args.hbase) if setup == "hbase" else ""
            code = old_code(args) if setup.startswith("old") else None
            with tempfile.TemporaryDirectory(prefix=prefix, dir=args.tmp) as tmp:
                with running_cluster(
                    Path(tmp), ltms, not args.no_fsync, setup, store, code=code
                ) as cluster:
                    results.extend(asyncio.run(bench_cluster(cluster, args, setup)))
    return results


def old_code(args: argparse.Namespace) -> Path:
    """The checkout --setup old runs (a ``git worktree`` of an older commit)."""
    if not args.old or not (Path(args.old) / "aggview" / "cli.py").exists():
        raise SystemExit("--setup old needs --old DIR, a checkout of aggview (git worktree add)")
    return Path(args.old).resolve()


def setup_ratios(results: Sequence[Result]) -> list[str]:
    """Every setup against its baseline, for every case measured both ways: the old code in
    the same layout (old-<setup>) when it was measured, else the old code (--setup old), else
    plaintext."""
    setups = {r.setup for r in results}
    default = "old" if "old" in setups else "plain"
    by_case = {(r.setup, _case(r)): r for r in results}
    lines = []
    for r in results:
        if r.setup.startswith("old"):
            continue
        baseline = f"old-{r.setup}" if f"old-{r.setup}" in setups else default
        base = by_case.get((baseline, _case(r)))
        if r.setup != baseline and base is not None and base.tps:
            lines.append(
                f"{r.setup} against {baseline}: {r.ltms} LTM(s), {r.rows} row(s)/tx, {r.mode}, "
                f"{r.clients} clients: {r.tps:.0f} vs {base.tps:.0f} tx/s, ratio "
                f"{r.tps / base.tps:.2f}; p50 {_ms(r.p50_ms)} vs {_ms(base.p50_ms)} ms; server "
                f"CPU {_server_cpu_ms(r):.2f} vs {_server_cpu_ms(base):.2f} ms/tx"
            )
    return lines


def _server_cpu_ms(r: Result) -> float:
    """Milliseconds of server CPU (coordinating processes and LTMs) per committed transaction."""
    if not r.tps:
        return 0.0
    return 10 * (r.cpu.get("coordinator", 0) + r.cpu.get("ltms", 0)) / r.tps


def _case(r: Result) -> tuple[object, ...]:
    return (r.ltms, r.rows, r.mode, r.clients, r.channels, r.offered)


# The measured columns every benchmark table shares (see the rows each adds).
MEASURE_COLUMNS = (
    "committed tx/s",
    "p50 ms",
    "p99 ms",
    "max ms",
    "retries/s",
    "errors",
    "CPU coord/LTMs/client/other",
)


def print_table(results: Sequence[Result], fsync: bool) -> None:
    table = Table(
        title=f"aggview transactions ({'fsync' if fsync else 'no fsync'})",
        caption="ch: client channels; CPU: % of one core used by the coordinator, the LTMs, "
        "this client and other processes",
    )
    for name in ("setup", "LTMs", "rows/tx", "load", "ch", *MEASURE_COLUMNS):
        table.add_column(name, justify="right")
    for r in results:
        load = f"closed {r.clients}" if r.mode == "closed" else f"open {r.offered:g}/s"
        if r.unfinished:
            load += f" ({r.unfinished} unfinished)"
        table.add_row(
            r.setup,
            str(r.ltms),
            str(r.rows),
            load,
            str(r.channels),
            f"{r.tps:.0f}",
            _ms(r.p50_ms),
            _ms(r.p99_ms),
            _ms(r.max_ms),
            f"{r.retries_per_s:.1f}",
            str(sum(r.errors.values())),
            _cpu(r),
        )
    out.print(table)


async def _first_get(address: str, key: int, timeout: float = 60.0) -> dict[str, Any]:
    """Times the first successful get, the first commit and a batch of cold reads."""
    ready = RetryPolicy(  # every 5 ms, for ``timeout`` seconds
        attempts=None,
        first_delay=0.005,
        max_delay=0.005,
        spread=(1.0, 1.0),
        deadline=timeout,
        retryable=retry_on(errors.Unavailable),
    )
    async with AsyncClient(address, timeout=10) as client:
        row = await ready.arun(lambda: client.get(TABLE, {"id": key}))
        got = time.perf_counter()
        if row is None:
            raise RuntimeError(f"row {key} is missing after the restart")
        await transaction(client, [key])
        committed = time.perf_counter()
        return {"got": got, "committed": committed}


async def _timed_gets(address: str, keys: Sequence[int], concurrency: int = 32) -> float:
    async with AsyncClient(address) as client:
        pending = iter(keys)
        t0 = time.perf_counter()

        async def worker() -> None:
            for key in pending:
                await client.get(TABLE, {"id": key})

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t0


async def _load_for_restart(address: str, args: argparse.Namespace) -> None:
    async with AsyncClient(address) as client:
        await client.sql(CREATE)
        await preload(client, args.preload, args.batch)


def run_restart(args: argparse.Namespace) -> dict[str, Any]:
    fsync = not args.no_fsync
    keys = random.Random(1).sample(range(args.preload), min(1000, args.preload))
    with tempfile.TemporaryDirectory(prefix="aggview-bench-restart-", dir=args.tmp) as tmp:
        data = Path(tmp)
        with running_cluster(data, 1, fsync) as cluster:
            t0 = time.perf_counter()
            asyncio.run(_load_for_restart(cluster.address, args))
            loaded = time.perf_counter() - t0
            err.print(f"preloaded {args.preload} rows into 1 LTM in {loaded:.1f}s")
            warm_gets = asyncio.run(_timed_gets(cluster.address, keys))
            t_stop = time.perf_counter()
        stopped = time.perf_counter() - t_stop
        store_bytes = sum(p.stat().st_size for p in data.glob("store.db*"))
        log_bytes = sum(p.stat().st_size for p in (data / "ltm-0").glob("*.wal"))
        err.print(f"stopped cleanly in {stopped:.2f}s; restarting over the same directory")

        t_start = time.perf_counter()
        with running_cluster(data, 1, fsync) as cluster:
            listening = time.perf_counter()
            first = asyncio.run(_first_get(cluster.address, keys[0]))
            cold_gets = asyncio.run(_timed_gets(cluster.address, keys[1:]))
    figures = {
        "rows": args.preload,
        "fsync": fsync,
        "preload_s": round(loaded, 3),
        "stop_s": round(stopped, 3),
        "store_bytes": store_bytes,
        "ltm_log_bytes_after_stop": log_bytes,
        "start_to_listening_s": round(listening - t_start, 3),
        "start_to_first_get_s": round(first["got"] - t_start, 3),
        "start_to_first_commit_s": round(first["committed"] - t_start, 3),
        "warm_gets_per_s": round(len(keys) / warm_gets),
        "cold_gets_per_s": round((len(keys) - 1) / cold_gets),
    }
    table = Table(title=f"restart of 1 LTM over {args.preload} rows")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in figures.items():
        table.add_row(name, str(value))
    out.print(table)
    out.print(f"start to first successful get: {figures['start_to_first_get_s']:.3f} s")
    return figures


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.transactions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--ltms", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 5, 20], help="rows per tx")
    parser.add_argument("--clients", type=int, default=32, help="closed loop: concurrent tasks")
    parser.add_argument(
        "--channels",
        type=int,
        nargs="+",
        default=[1],
        help="gRPC connections the tasks share (several values: one run each)",
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="measured time per case")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured time per case")
    parser.add_argument(
        "--rate", type=float, nargs="+", help="open loop at these tx/s instead of closed loop"
    )
    parser.add_argument(
        "--load-fraction",
        type=float,
        nargs="+",
        help="after the closed loop, open loop at these fractions of its throughput",
    )
    parser.add_argument("--arrivals", choices=["poisson", "fixed"], default="poisson")
    parser.add_argument(
        "--drain", type=float, default=30.0, help="open loop: wait this long for stragglers"
    )
    parser.add_argument("--preload", type=int, default=100_000, help="rows in the table")
    parser.add_argument("--batch", type=int, default=500, help="rows per preload transaction")
    parser.add_argument("--no-fsync", action="store_true", help="servers skip fsync of logs")
    parser.add_argument(
        "--setup",
        nargs="+",
        choices=[
            "plain",
            "tls",
            "replicated",
            "hbase",
            "one-process",
            "processes-2",
            "processes-4",
            "replicated-processes-2",
            "old",
            "old-one-process",
            "old-processes-2",
            "old-processes-4",
            "old-replicated",
            "old-replicated-processes-2",
            "old-tls",
        ],
        default=["plain"],
        help="plaintext (--insecure); TLS with tokens and member checks; replicated LTM logs "
        "(plaintext); the store on HBase (--hbase); the whole cluster in one process "
        "(--processes 1); in 2 or 4 processes that each coordinate (--processes P), also "
        "with their logs copied to each other (replicated-processes-2); the "
        "servers of --old (plaintext; old-<layout>: in that layout; old-tls: secure, in the "
        "default layout). Several: each is also "
        "compared with old, if measured, else with plain",
    )
    parser.add_argument(
        "--old", help="with --setup old: a checkout of older code (git worktree add DIR REV)"
    )
    parser.add_argument(
        "--hbase", help="with --setup hbase: a real HBase's Thrift server, hbase://HOST:PORT"
    )
    parser.add_argument(
        "--no-check", dest="check", action="store_false", help="skip the final sum(v) check"
    )
    parser.add_argument("--restart", action="store_true", help="time a restart instead")
    parser.add_argument("--tmp", help="where to make the data directories (default: $TMPDIR)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rate and args.load_fraction:
        raise SystemExit("--rate and --load-fraction exclude each other")
    if min(args.ltms) < 1 or min(args.rows) < 1 or min(args.channels) < 1 or args.clients < 1:
        raise SystemExit("--ltms, --rows, --channels and --clients must be at least 1")
    if max(args.rows) > args.preload:
        raise SystemExit("--rows cannot exceed --preload")
    # clean up as on Ctrl-C, also when started in the background (where SIGINT is ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    meta = {
        "argv": sys.argv[1:] if argv is None else argv,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    try:
        if args.restart:
            report: dict[str, Any] = {**meta, "restart": run_restart(args)}
        else:
            results = run_load(args)
            print_table(results, not args.no_fsync)
            for line in setup_ratios(results):
                out.print(line)
            report = {
                **meta,
                "results": [{**asdict(r), "retries_per_s": r.retries_per_s} for r in results],
            }
    except KeyboardInterrupt:
        err.print("interrupted; clusters stopped")
        return 130
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
