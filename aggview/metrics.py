"""A member's metrics, in Prometheus's text format on ``/metrics`` (``--metrics-port``).

Every series is defined here, in one place. Each member has its own ``Metrics`` and with it its
own ``CollectorRegistry`` (never prometheus-client's global one), so several members in one
process (tests) keep their series apart. Two kinds of series:

* events counted where they happen (commits, aborts, WAL flushes, view maintenance and
  refreshes): a counter's ``inc`` or a histogram's ``observe``, nothing more on the hot path;
* state the member keeps anyway (its role, its partitions, the lookup cache's and the clock's
  counts, its views): read when Prometheus scrapes, from a ``MemberState`` the coordinator
  builds then (``Metrics.watch``), at no cost between scrapes.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

# Commits take from a fraction of a millisecond (one partition, in process) to seconds (a
# member failing over); a WAL flush is one write and fdatasync.
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
# a commit's stages, as ``aggview_commit_stage_seconds`` labels them
STAGES = ("timestamp", "prepare", "durable")
# A refresh drains a view's captured changes: milliseconds to many seconds.
REFRESH_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# What an abort counts as when it is not one of ours (aggview.errors IDENTITIES name the rest).
CANCELLED = "CANCELLED"
INTERNAL = "INTERNAL"


@dataclass
class ViewState:
    name: str
    mode: str  # sync, async or cumulus
    state: str  # initializing, draining or live
    # a cumulus view's runtime counts where it runs (the leader): ``CumulusView.counts``
    runtime: dict[str, Any] | None = None


@dataclass
class MemberState:
    """What a member is now, read at each scrape."""

    member: int
    leader: bool
    term: int  # the leadership term (replicated clusters; 0: none)
    partitions: int  # partitions served here, taken over ones included
    lookup_hits: int
    lookup_misses: int
    clock_grants: int  # grants of timestamps this member's clock made (the leader's)
    views: list[ViewState] = field(default_factory=list)
    # partition -> its log reaches an in-sync copy (replicated clusters)
    copies_in_sync: dict[int, bool] = field(default_factory=dict)


class Metrics:
    """One member's series on its own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # the series every commit or flush adds to: kept per thread, without prometheus-client's
        # lock and checks, and summed at a scrape (``_HotSeries``)
        self._shards: dict[int, _Shard] = {}
        r.register(_HotSeries(self._shards))
        self.aborted = Counter(
            "aggview_transactions_aborted",
            "Transactions this member coordinated that aborted after their first prepare, by "
            "the reason their error travels with (aggview.errors IDENTITIES; CANCELLED: the "
            "caller went away). A system transaction's retries count each attempt",
            ["reason"],
            registry=r,
        )
        self._refresh = Histogram(
            "aggview_view_refresh_seconds",
            "How long one refresh of an async view, or one epoch of a cumulus view, took here",
            ["view"],
            buckets=REFRESH_BUCKETS,
            registry=r,
        )
        self._refreshed: dict[str, float] = {}  # view -> when its last refresh here ended
        self.metrics_port = 0  # where ``serve`` listens (0: not serving)

    # ----------------------------------------------------------- events, where they happen

    def committed(
        self, system: bool, started: float, asked: float = 0.0, prepared: float = 0.0
    ) -> None:
        """A transaction committed; ``time.perf_counter()`` at its grant (``started``), when
        it asked for its timestamp (``asked``; 0: not measured) and when its every round had
        voted yes (``prepared``; 0: not measured): a client's commit is also counted in its
        stages."""
        shard = self._shard()
        now = time.perf_counter()
        shard.latency.observe(now - started)
        shard.committed[system] += 1
        if asked and prepared:  # a client's commit (``Commits.commit``)
            timestamp, prepare, durable = shard.stages
            timestamp.observe(started - asked)
            prepare.observe(prepared - started)
            durable.observe(now - prepared)

    def aborted_by(self, exc: BaseException) -> None:
        reason = getattr(exc, "reason", None)
        if not isinstance(reason, str):
            reason = INTERNAL if isinstance(exc, Exception) else CANCELLED
        self.aborted.labels(reason).inc()

    def wal_observer(self, log: str) -> Callable[[float], None]:
        """What a write-ahead log calls after each flush, with its seconds (any thread)."""

        def flushed(took: float) -> None:
            self._shard().flushes_of(log).observe(took)

        return flushed

    def maintained(self, view: str, seconds: float) -> None:
        maintenance = self._shard().maintenance
        maintenance[view] = maintenance.get(view, 0.0) + seconds

    def _shard(self) -> _Shard:
        """This thread's counts: one writer each, so adding needs no lock."""
        ident = threading.get_ident()
        shard = self._shards.get(ident)
        if shard is None:
            shard = self._shards[ident] = _Shard()
        return shard

    def refreshed(self, view: str, seconds: float) -> None:
        self._refresh.labels(view).observe(seconds)
        self._refreshed[view] = time.monotonic()

    def lags(self) -> dict[str, float]:
        """Seconds since each view's last refresh (or epoch) here."""
        now = time.monotonic()
        return {view: now - at for view, at in dict(self._refreshed).items()}

    # ----------------------------------------------------------- state, read at a scrape

    def watch(self, state: Callable[[], MemberState]) -> None:
        """Reports ``state()`` at every scrape (called on the HTTP server's thread)."""
        self.registry.register(_StateCollector(state, self.lags))

    def serve(self, host: str, port: int) -> int:
        """Serves ``/metrics`` on a thread of its own; returns the port (``port`` 0: a free
        one)."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        self.metrics_port = int(server.server_port)
        return self.metrics_port

    def close(self) -> None:
        server = getattr(self, "_server", None)
        if server is not None:
            threading.Thread(target=server.shutdown, daemon=True).start()
            server.server_close()


def _ignore(*_: object) -> None:
    """What a log calls after a flush when no series are kept."""


class NoMetrics(Metrics):
    """``--no-metrics``: the hot path's events are not counted (what remains of the metrics'
    cost is this method call), nothing is served. The refresh times are still kept:
    ``aggview status`` shows the lags from them."""

    def committed(
        self, system: bool, started: float, asked: float = 0.0, prepared: float = 0.0
    ) -> None:
        pass

    def aborted_by(self, exc: BaseException) -> None:
        pass

    def wal_observer(self, log: str) -> Callable[[float], None]:
        return _ignore

    def maintained(self, view: str, seconds: float) -> None:
        pass

    def refreshed(self, view: str, seconds: float) -> None:
        self._refreshed[view] = time.monotonic()

    def watch(self, state: Callable[[], MemberState]) -> None:
        pass

    def serve(self, host: str, port: int) -> int:
        raise ValueError("a member run with --no-metrics serves no /metrics")


class _Buckets:
    """A histogram's counts written by one thread: ``observe`` is a bisect and two additions
    (prometheus-client's takes a lock per bucket and checks its argument: 2 µs, and a commit
    at one client has about three flushes)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # bucket i: value <= bounds[i]
        self.total += value


@dataclass
class _Shard:
    """One thread's part of the hot-path series."""

    latency: _Buckets = field(default_factory=lambda: _Buckets(LATENCY_BUCKETS))
    committed: list[int] = field(default_factory=lambda: [0, 0])  # [client, system]
    flushes: dict[str, _Buckets] = field(default_factory=dict)  # by log
    maintenance: dict[str, float] = field(default_factory=dict)  # seconds by view
    # a commit's stages (``STAGES``): waiting for its timestamp, preparing, made durable
    stages: list[_Buckets] = field(
        default_factory=lambda: [_Buckets(LATENCY_BUCKETS) for _ in STAGES]
    )

    def flushes_of(self, log: str) -> _Buckets:
        buckets = self.flushes.get(log)
        if buckets is None:
            buckets = self.flushes[log] = _Buckets(LATENCY_BUCKETS)
        return buckets


def _histogram(family: HistogramMetricFamily, labels: list[str], parts: list[_Buckets]) -> None:
    """Adds the sum of ``parts`` (same bounds) to ``family`` as one labelled histogram."""
    bounds = parts[0].bounds
    counts = [sum(p.counts[i] for p in parts) for i in range(len(bounds) + 1)]
    cumulative, buckets = 0, []
    for bound, count in zip((*map(str, bounds), "+Inf"), counts, strict=True):
        cumulative += count
        buckets.append((bound, cumulative))
    family.add_metric(labels, buckets, sum(p.total for p in parts))


class _HotSeries(Collector):
    """The per-thread shards summed at a scrape, under the series' usual names and types."""

    def __init__(self, shards: dict[int, _Shard]) -> None:
        self.shards = shards

    def collect(self) -> Iterator[Metric]:
        shards = list(self.shards.values())
        committed = CounterMetricFamily(
            "aggview_transactions_committed",
            "Transactions this member coordinated that committed, by kind (client: a client's "
            "or a bulk load; system: a view refresh or epoch, an initialization, DDL)",
            labels=["kind"],
        )
        for kind, index in (("client", 0), ("system", 1)):
            committed.add_metric([kind], sum(s.committed[index] for s in shards))
        yield committed
        latency = HistogramMetricFamily(
            "aggview_commit_latency_seconds",
            "From a transaction's timestamp grant to its durable commit (every committed one)",
        )
        _histogram(latency, [], [s.latency for s in shards] or [_Buckets(LATENCY_BUCKETS)])
        yield latency
        flushes = CounterMetricFamily(
            "aggview_wal_flushes",
            "Group flushes (write and fdatasync) of this member's logs, by log (partition: "
            "the partitions' logs; decisions: its decision log)",
            labels=["log"],
        )
        flush_seconds = HistogramMetricFamily(
            "aggview_wal_flush_seconds",
            "How long one group flush of a log took, on the log's thread",
            labels=["log"],
        )
        for log in sorted({log for s in shards for log in s.flushes}):
            parts = [s.flushes[log] for s in shards if log in s.flushes]
            flushes.add_metric([log], sum(sum(p.counts) for p in parts))
            _histogram(flush_seconds, [log], parts)
        yield flushes
        yield flush_seconds
        stages = HistogramMetricFamily(
            "aggview_commit_stage_seconds",
            "Where a client's commit coordinated here spent its time: waiting for its "
            "timestamp (a follower: a round trip to the leader's clock), preparing (view "
            "maintenance included), then until its commit was durable and applied",
            labels=["stage"],
        )
        for i, stage in enumerate(STAGES):
            _histogram(
                stages, [stage], [s.stages[i] for s in shards] or [_Buckets(LATENCY_BUCKETS)]
            )
        yield stages
        maintenance = CounterMetricFamily(
            "aggview_view_maintenance_seconds",
            "Seconds this member's transactions spent computing a sync view's deltas "
            "(wall-clock, lookups of dimension rows included)",
            labels=["view"],
        )
        for view in sorted({view for s in shards for view in s.maintenance}):
            maintenance.add_metric([view], sum(s.maintenance.get(view, 0.0) for s in shards))
        yield maintenance


class _StateCollector(Collector):
    def __init__(
        self, state: Callable[[], MemberState], lags: Callable[[], dict[str, float]]
    ) -> None:
        self.state = state
        self.lags = lags

    def describe(self) -> list[Any]:
        return []  # unknown until a scrape: the registry then asks collect() each time

    def collect(self) -> Iterator[Metric]:
        s = self.state()
        role = GaugeMetricFamily(
            "aggview_member_role",
            "1 for the role this member has now (leader: it keeps the clock and the catalog)",
            labels=["role"],
        )
        role.add_metric(["leader"], 1 if s.leader else 0)
        role.add_metric(["follower"], 0 if s.leader else 1)
        yield role
        yield GaugeMetricFamily(
            "aggview_member_term", "The leadership term (replicated clusters; 0: none)", s.term
        )
        yield GaugeMetricFamily(
            "aggview_partitions_held",
            "Partitions this member serves now, taken over ones included",
            s.partitions,
        )
        yield CounterMetricFamily(
            "aggview_lookup_cache_hits", "Dimension-row lookups the cache answered", s.lookup_hits
        )
        yield CounterMetricFamily(
            "aggview_lookup_cache_misses",
            "Dimension-row lookups the cache could not answer (read from the partitions)",
            s.lookup_misses,
        )
        yield CounterMetricFamily(
            "aggview_clock_grants",
            "Grants of timestamps this member's clock made (the leader's; 0 at a follower)",
            s.clock_grants,
        )
        info = GaugeMetricFamily(
            "aggview_view_info",
            "1 per view, with its mode (sync, async, cumulus)",
            labels=["view", "mode"],
        )
        live = GaugeMetricFamily(
            "aggview_view_live",
            "1 when the view is readable, 0 while it initializes",
            labels=["view"],
        )
        lag = GaugeMetricFamily(
            "aggview_view_lag_seconds",
            "Seconds since this member last refreshed the async view (a cumulus view: ran an "
            "epoch of it); absent until it has once",
            labels=["view"],
        )
        lags = self.lags()
        for view in s.views:
            info.add_metric([view.name, view.mode], 1)
            live.add_metric([view.name], 1 if view.state == "live" else 0)
            if view.name in lags:
                lag.add_metric([view.name], lags[view.name])
        yield info
        yield live
        yield lag
        yield from _runtime_series(s.views)
        copies = GaugeMetricFamily(
            "aggview_log_copy_in_sync",
            "1 when a partition served here has its log copied to an in-sync backup "
            "(replicated clusters)",
            labels=["partition"],
        )
        for partition, in_sync in sorted(s.copies_in_sync.items()):
            copies.add_metric([str(partition)], 1 if in_sync else 0)
        yield copies


def _runtime_series(views: list[ViewState]) -> Iterator[Metric]:
    """Each cumulus view's runtime, at the member it runs on (as of its last epoch)."""
    updates = CounterMetricFamily(
        "aggview_cumulus_updates",
        "Updates fed to the view's runtime since it was loaded (a change is a delete and an "
        "insert)",
        labels=["view"],
    )
    messages = CounterMetricFamily(
        "aggview_cumulus_messages",
        "Messages between the runtime's switches and DW nodes, by kind",
        labels=["view", "kind"],
    )
    corrective = CounterMetricFamily(
        "aggview_cumulus_corrective_updates",
        "Corrective updates: a DW node's read revised by a write that arrived late",
        labels=["view"],
    )
    epochs = CounterMetricFamily(
        "aggview_cumulus_epochs", "Epochs the view's runtime committed", labels=["view"]
    )
    cpu = CounterMetricFamily(
        "aggview_cumulus_cpu_seconds",
        "CPU seconds this process spent driving the view's runtime",
        labels=["view"],
    )
    for view in views:
        counts = view.runtime
        if not counts:
            continue
        updates.add_metric([view.name], counts.get("updates", 0))
        for kind, n in sorted((counts.get("messages") or {}).items()):
            messages.add_metric([view.name, str(kind)], n)
        corrective.add_metric([view.name], counts.get("corrective", 0))
        epochs.add_metric([view.name], counts.get("epochs", 0))
        cpu.add_metric([view.name], counts.get("cpu_seconds", 0.0))
    yield from (updates, messages, corrective, epochs, cpu)
