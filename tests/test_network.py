"""Network trouble between the members: every way to a member (the other members' and the
clients' routed requests) goes through a loopback proxy that, on a seeded schedule, delays
traffic, holds it back (dropped packets) and cuts connections, while transfers and
view-maintaining writes run. Afterwards no row stays locked, nothing acknowledged is lost or
partial, and both views equal recomputation."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aggclient import Client
from agglauncher.cluster import LocalCluster
from tests.chaos_proxy import ChaosProxy
from tests.test_failpoints import (
    BOUND,
    Seen,
    check_data,
    create_schema,
    prepared_counts,
    start_workers,
    wait_serving,
)

TROUBLE_SECONDS = 8.0


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[LocalCluster, list[ChaosProxy]]]:
    proxies: list[ChaosProxy] = []

    def route(member: int, address: str) -> str:
        proxies.append(ChaosProxy(address).start())
        return proxies[-1].address

    cluster = LocalCluster(
        tmp_path / "data",
        ltms=3,
        processes=3,
        checkpoint_interval=0.5,
        verbose=True,
        member_route=route,
    )
    try:
        yield cluster.start(), proxies
    finally:
        cluster.stop()
        cluster.kill()
        for proxy in proxies:
            proxy.close()


def make_trouble(proxies: list[ChaosProxy], rng: random.Random, seconds: float) -> list[str]:
    """Seeded trouble on random links until ``seconds`` have passed; what was done, in order."""
    done: list[str] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        proxy_index = rng.randrange(len(proxies))
        proxy = proxies[proxy_index]
        kind = rng.choice(["delay", "hold", "cut", "cut all"])
        if kind == "delay":
            delay = rng.uniform(0.005, 0.05)
            proxy.set_delay(delay)
            time.sleep(rng.uniform(0.3, 1.0))
            proxy.set_delay(0.0)
            done.append(f"delay {delay * 1000:.0f} ms on link {proxy_index}")
        elif kind == "hold":
            held = rng.uniform(0.2, 1.5)
            proxy.hold()
            time.sleep(held)
            proxy.release()
            done.append(f"hold link {proxy_index} for {held:.1f}s")
        elif kind == "cut":
            proxy.cut()
            done.append(f"cut link {proxy_index}")
        else:
            for each in proxies:
                each.cut()
            done.append("cut every link")
        time.sleep(rng.uniform(0.1, 0.5))
    for proxy in proxies:
        proxy.calm()
    return done


@pytest.mark.parametrize("seed", [1, 2])
def test_delays_drops_and_cuts_lose_nothing(
    proxied: tuple[LocalCluster, list[ChaosProxy]], seed: int
) -> None:
    cluster, proxies = proxied
    rng = random.Random(seed)
    create_schema(cluster.address)
    stop, seen = threading.Event(), Seen()
    workers = start_workers(cluster.address, seed, stop, seen)
    try:
        trouble = make_trouble(proxies, rng, TROUBLE_SECONDS)
        acked_in_trouble = len(seen.acked_refs)
        time.sleep(1.0)  # calm: the load goes on
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=60)
    print(f"seed {seed}: {trouble}; errors seen by clients: {dict(seen.errors)}")
    assert acked_in_trouble > 10, f"seed {seed}: too little progress through {trouble}"
    assert seen.errors["Unavailable"] > 0, f"seed {seed}: the trouble was not felt: {trouble}"

    violations: list[str] = []

    def check(name: str, condition: bool, detail: str = "") -> None:
        if not condition:
            violations.append(f"{name}: {detail}")

    deadline = time.monotonic() + BOUND
    while (counts := prepared_counts(cluster)) != [0] * cluster.ltms:
        assert time.monotonic() < deadline, f"seed {seed}: rows still locked {counts}"
        time.sleep(0.1)
    wait_serving(cluster.address)
    with Client(cluster.address, timeout=BOUND) as client:
        check_data(client, seen, check)
    assert not violations, f"seed {seed} after {trouble}: {violations}"
