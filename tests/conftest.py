"""Shared fixtures: a real local cluster (separate processes, free ports) per test session."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aggview.cluster import LocalCluster
from coordinator import Client


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cluster"), ltms=3) as running:
        yield running


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.address, timeout=30) as c:
        yield c


@pytest.fixture
def table_name() -> str:
    """A fresh table name, so tests sharing the session cluster never see each other's rows."""
    return f"t_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def fresh_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster of its own, for tests that kill servers."""
    running = LocalCluster(tmp_path / "data", ltms=3, checkpoint_interval=0.5, verbose=True)
    try:
        yield running.start()
    finally:
        running.stop()
        running.kill()


@pytest.fixture(scope="session")
def spark() -> Any:
    """The one local Spark session every test shares (it starts in about 15 s)."""
    from cumulus.spark.session import spark_session, stop_session

    session = spark_session()
    yield session
    stop_session()
