"""``docker/compose.yaml`` run for real: HBase (the image of the pinned jars) and three
coordinating members, a transaction, a sync view and a read through ltm-0's published port
(a free port of 127.0.0.1), in a compose project of its own that ``down -v`` removes whatever
happens. Skips, saying why, where no Docker engine can run (the ``docker_images`` fixture)."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from decimal import Decimal
from pathlib import Path

import pytest
from docker_session import DockerImages

from aggclient import Client
from aggview.processes import free_port

COMPOSE = Path(__file__).resolve().parents[1] / "docker" / "compose.yaml"
SERVICES = ("hbase", "ltm-0", "ltm-1", "ltm-2")
START_TIMEOUT = 240.0


def _health(project: str) -> dict[str, str]:
    """Each container's state in the project, by service (its health where it has a check),
    in one ``docker ps`` by compose's project label."""
    listed = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "--filter",
            f"label=com.docker.compose.project={project}",
            "--format",
            '{{.Label "com.docker.compose.service"}}\t{{.Status}}',
        ],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    found = {}
    for line in listed.splitlines():
        service, _, status = line.partition("\t")
        found[service] = status
    return found


def _all_healthy(health: dict[str, str]) -> bool:
    return all("(healthy)" in health.get(service, "") for service in SERVICES)


def test_compose_runs_a_cluster_on_hbase(docker_images: DockerImages) -> None:
    cli = docker_images.compose
    if cli is None:
        pytest.skip(docker_images.compose_problem)
    project = f"aggview-test-{uuid.uuid4().hex[:10]}"
    port = free_port()
    env = {**os.environ, "AGGVIEW_PORT": str(port), "AGGVIEW_HBASE_IMAGE": docker_images.hbase}

    def compose(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        command = [*cli, "-p", project, "-f", str(COMPOSE), *args]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)

    try:
        up = compose("up", "-d", "--no-build", timeout=START_TIMEOUT)
        assert up.returncode == 0, up.stdout + up.stderr
        deadline = time.monotonic() + 60
        while not _all_healthy(health := _health(project)):
            assert time.monotonic() < deadline, f"not healthy: {health}"
            time.sleep(0.5)

        with Client(f"127.0.0.1:{port}", route=False, timeout=30) as client:
            client.sql(
                "CREATE TABLE orders (id INT PRIMARY KEY, shop TEXT NOT NULL, "
                "amount DECIMAL(12,2) NOT NULL)"
            )
            client.sql(  # sync: maintained inside each transaction
                "CREATE MATERIALIZED VIEW shop_totals AS SELECT shop, SUM(amount) AS total, "
                "COUNT(*) AS n FROM orders GROUP BY shop"
            )
            with client.transaction() as tx:  # rows on every partition, one commit
                for i in range(12):
                    tx.insert("orders", {"id": i, "shop": f"s{i % 3}", "amount": Decimal(i)})
            with client.transaction() as tx:
                tx.add("orders", {"id": 0}, {"amount": Decimal("100.50")})
                tx.delete("orders", {"id": 11})
            totals = sorted((r["shop"], r["total"], r["n"]) for r in client.view("shop_totals"))
            assert totals == [
                ("s0", Decimal("118.50"), 4),
                ("s1", Decimal("22"), 4),
                ("s2", Decimal("15"), 3),
            ]
            assert len(client.scan("orders")) == 11
    except BaseException:
        print(compose("logs", "--no-color", "--tail", "30").stdout[-8000:])  # with the failure
        raise
    finally:
        down = compose("down", "-v", "--remove-orphans", "-t", "5")
        assert down.returncode == 0, down.stdout + down.stderr
