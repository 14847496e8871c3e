"""The benchmarks' load: clients, transactions that add 1 to k rows of ``bench``, closed and
open loops, the Ledger of what the clients saw committed (for the checks after), and the
members' statuses and counters read around a measurement.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from aggclient.client import AsyncClient
from agglauncher.cluster import LocalCluster
from aggview import errors
from aggview.net import GRPC_OPTIONS
from aggview.security import TlsDir, member_channel, member_metadata
from aggview.wire import ltm_pb2 as lpb
from aggview.wire import ltm_pb2_grpc
from bench.measurements import CpuMeter, Result

TABLE = "bench"
CREATE = f"CREATE TABLE {TABLE} (id INT PRIMARY KEY, v INT NOT NULL)"


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
