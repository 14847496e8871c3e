"""One point of the dashboard benchmark: closed-loop clients committing transactions of k events,
and beside them the probes that measure freshness and the reads the consistency verdict judges.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field
from typing import Any

from aggclient.client import AsyncClient
from aggview import errors
from loadgen import dashboard
from loadgen.consistency import Ledger, Totals

VIEW = "sql1"  # the view of SQL-1 the benchmark measures


@dataclass
class Point:
    committed: int
    events: int
    aborted: int
    latencies: list[float]
    seconds: float
    freshness: list[float]  # seconds from a probe's commit to a read that holds it
    probes: int  # probe transactions committed (one event each, beside the load's)
    reads: list[tuple[int, Totals]]  # whole-view reads: (consistent at, groups)
    # a cumulus view fed between epochs: the same for its tentative reads (their timestamp:
    # the last change fed, at which they should be exact)
    tentative_freshness: list[float] = field(default_factory=list)
    tentative_reads: list[tuple[int, Totals]] = field(default_factory=list)
    moved: int = 0  # product moves and category renames committed (not in ``committed``)


async def measure(
    client: AsyncClient,
    k: int,
    seconds: float,
    clients: int,
    scale: dashboard.Scale,
    ids: Any,
    ledger: Ledger | None = None,
    hot: bool = False,
    tentative: bool = False,
    moves: float = 0.0,
    renames: float = 0.0,
) -> Point:
    """``clients`` closed loops committing transactions of k new events for ``seconds``; with
    a view (``ledger``: every commit is recorded there), one loop measuring how soon the view
    holds a commit and one reading it whole, for the consistency verdict; ``tentative``: both
    for a cumulus view's tentative reads too; ``moves``: the share of the loops' transactions
    that move a product to another category instead (a write of the dimension every event
    joins: concurrent with events of the same product at other members, what makes a
    cumulus view's corrective updates); ``renames``: the share that rename a category (a few
    rows every event reads)."""
    load = _Load(
        client, k, scale, ids, ledger, hot, tentative, time.perf_counter() + seconds, moves, renames
    )
    started = time.perf_counter()
    watchers = [load.probes(), load.reader()] if ledger is not None else []
    await asyncio.gather(*(load.loop(next(ids)) for _ in range(clients)), *watchers)
    elapsed = time.perf_counter() - started
    return Point(
        len(load.latencies),
        len(load.latencies) * k,
        load.aborted,
        load.latencies,
        elapsed,
        load.freshness,
        load.probed,
        load.reads,
        load.tentative_freshness,
        load.tentative_reads,
        load.moved,
    )


@dataclass
class _Load:
    """One point's loops until ``deadline`` (perf_counter), and what they measured."""

    client: AsyncClient
    k: int
    scale: dashboard.Scale
    ids: Any
    ledger: Ledger | None
    hot: bool
    tentative: bool
    deadline: float
    moves: float = 0.0
    renames: float = 0.0
    latencies: list[float] = field(default_factory=list)
    freshness: list[float] = field(default_factory=list)
    reads: list[tuple[int, Totals]] = field(default_factory=list)
    tentative_freshness: list[float] = field(default_factory=list)
    tentative_reads: list[tuple[int, Totals]] = field(default_factory=list)
    aborted: int = 0
    probed: int = 0
    moved: int = 0

    def committed(self, ts: int, events: list[dict[str, Any]]) -> None:
        if self.ledger is not None:
            for event in events:
                self.ledger.add_to(ts, event["prod_id"], event["cost"])

    def failed(self, exc: errors.AggviewError) -> None:
        if self.ledger is not None and isinstance(exc, errors.Unavailable):
            self.ledger.unknown += 1  # it may have committed: the verdict says so

    async def reader(self) -> None:
        """Reads the whole view every 50 ms, for the consistency verdict."""
        client = self.client
        while time.perf_counter() < self.deadline:
            with contextlib.suppress(errors.AggviewError):
                rows = await client.view(VIEW)
                self.reads.append((rows.timestamp, dashboard.view_totals(rows)))
                if self.tentative:
                    rows = await client.view(VIEW, consistency="tentative")
                    self.tentative_reads.append((rows.timestamp, dashboard.view_totals(rows)))
            await asyncio.sleep(0.05)

    async def probes(self) -> None:
        """Commits one event at a time and measures how soon the view holds it."""
        rng = random.Random(-1)
        while time.perf_counter() < self.deadline:
            try:
                async with self.client.transaction() as tx:
                    event = dashboard.event(rng, next(self.ids), self.scale, self.hot)
                    tx.insert("events", event)
            except errors.AggviewError as exc:
                self.failed(exc)  # an aborted probe measures nothing
                continue
            acknowledged = time.perf_counter()
            self.probed += 1
            self.committed(tx.timestamp, [event])
            with contextlib.suppress(errors.AggviewError):
                await self._wait_until_read(f"shop {event['shop_id']}", tx.timestamp, acknowledged)
            await asyncio.sleep(0.02)

    async def _wait_until_read(self, shop: str, timestamp: int, acknowledged: float) -> None:
        """Reads the probe's group until a read holds ``timestamp``: a tentative read first
        (fed), then a committed one."""
        client = self.client
        if self.tentative:
            while (
                await client.view(VIEW, {"shop": shop}, consistency="tentative")
            ).timestamp < timestamp:
                await asyncio.sleep(0.005)
            self.tentative_freshness.append(time.perf_counter() - acknowledged)
        while (await client.view(VIEW, {"shop": shop})).timestamp < timestamp:
            await asyncio.sleep(0.005)
        self.freshness.append(time.perf_counter() - acknowledged)

    async def loop(self, seed: int) -> None:
        """One closed-loop client: a transaction of k new events after another."""
        rng = random.Random(seed)
        # where changes are asked, each client's first transaction is one: a run that a loaded
        # machine cuts to a few transactions still changes a dimension under its mode's reads
        first_change = bool(self.moves or self.renames)
        while time.perf_counter() < self.deadline:
            draw = rng.random() if self.moves or self.renames else 1.0
            if first_change or draw < self.moves + self.renames:
                move = draw < self.moves if draw < self.moves + self.renames else self.moves > 0
                first_change = False
                await self.change_dimension(rng, seed, move)
                continue
            started = time.perf_counter()
            events = [
                dashboard.event(rng, next(self.ids), self.scale, self.hot) for _ in range(self.k)
            ]
            try:
                async with self.client.transaction() as tx:
                    for event in events:
                        tx.insert("events", event)
            except errors.AggviewError as exc:
                self.aborted += 1
                self.failed(exc)
                continue
            self.latencies.append(time.perf_counter() - started)
            self.committed(tx.timestamp, events)

    async def change_dimension(self, rng: random.Random, seed: int, move: bool) -> None:
        """Moves a product to another category (its events' cost moves with it), or renames a
        category (its groups' names change)."""
        if move:
            product, category = dashboard.move(rng, self.scale, self.hot)
        else:
            category, name = dashboard.rename(rng, self.scale, f"{seed}.{self.moved}")
        try:
            async with self.client.transaction() as tx:
                if move:
                    tx.update("products", {"id": product}, {"cat_id": category})
                else:
                    tx.update("categories", {"id": category}, {"name": name})
        except errors.AggviewError as exc:
            self.aborted += 1
            self.failed(exc)
            return
        self.moved += 1
        if self.ledger is not None:
            if move:
                self.ledger.move(tx.timestamp, product, category)
            else:
                self.ledger.rename(tx.timestamp, category, name)
