"""What the benchmarks measure and how they print it: a point's Result, CPU per role (CpuMeter),
percentiles, and the consoles and table cells every ``bench`` command shares.
"""

from __future__ import annotations

import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from agglauncher.cluster import LocalCluster
from aggview.processes import process_cpu_seconds

out = Console(width=None if sys.stdout.isatty() else 132)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 132)
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def run_facts(argv: list[str] | None, **settings: Any) -> dict[str, Any]:
    """What a benchmark's JSON report says about its run: the command line (``argv``, or this
    process's), the machine, ``settings`` and when it started, so two reports can be compared."""
    return {
        "argv": sys.argv[1:] if argv is None else argv,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        **settings,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


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


def per_process_cpu(r: Result) -> str:
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


def cpu_cell(r: Result) -> str:
    return "/".join(f"{r.cpu.get(k, 0):.0f}" for k in ("coordinator", "ltms", "client", "other"))


def ms_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


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
