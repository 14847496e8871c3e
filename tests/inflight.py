"""A deterministic burst of calls in flight: the coordinator's per-client limit, observed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from pausing import paused

from aggclient.client import AsyncClient
from agglauncher.cluster import LocalCluster

Act = Callable[[AsyncClient], Awaitable[object]]


def scan_of(table: str) -> Act:
    return lambda client: client.scan(table)


async def burst(
    cluster: LocalCluster, act: Act, calls: int, other_role: str | None = None, role: str = "read"
) -> list[object]:
    """Pauses member 1 (SIGSTOP), runs ``act`` ``calls`` times at once over one client of
    member 0 (and once with ``other_role``'s token), waits until the refusals are in, resumes
    member 1. ``act`` must need member 1 (a scan does; so does a write to a row it hosts);
    the clients do not route, so member 0 coordinates and counts every call."""
    options = {**cluster.client_options(role), "route": False}
    victim = cluster.member(1).process
    assert victim is not None
    async with contextlib.AsyncExitStack() as stack:
        reader = await stack.enter_async_context(AsyncClient(cluster.address, **options))  # type: ignore[arg-type]
        tasks = []
        with paused(victim, cluster=cluster):
            tasks = [asyncio.ensure_future(act(reader)) for _ in range(calls)]
            if other_role is not None:
                other = await stack.enter_async_context(
                    AsyncClient(cluster.address, **cluster.client_options(other_role), route=False)  # type: ignore[arg-type]
                )
                tasks.append(asyncio.ensure_future(act(other)))
            await asyncio.sleep(1.0)  # refusals are immediate; the rest wait for member 1
            pending = [not task.done() for task in tasks]
        results = await asyncio.gather(*tasks, return_exceptions=True)
    outcomes: list[object] = list(results[:calls])
    if other_role is not None:
        ok = pending[calls] and not isinstance(results[calls], BaseException)
        outcomes.append("pending then done" if ok else results[calls])
    return outcomes
