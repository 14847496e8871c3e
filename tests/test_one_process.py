"""The whole cluster in one process (``aggview start --processes 1``): the coordinator serves
every partition itself, with direct calls. The same guarantees as the separate processes: the
serializability and view differential tests run here again, and kill -9 of the one process
under load loses nothing acknowledged and leaves nothing half applied."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from concurrent_inserts import insert_each
from conftest import own_cluster
from test_crash import ACCOUNTS, acknowledged_inserts_survive_a_kill, kill_twice_under_load
from test_crash import test_clean_restart_keeps_everything as test_clean_restart  # noqa: F401
from test_serializability import (  # noqa: F401
    test_concurrent_transfers_keep_every_invariant as test_transfers_keep_every_invariant,
)
from test_views_differential import (  # noqa: F401
    test_views_equal_recomputation as test_one_process_views_equal_recomputation,
)

from aggclient import AsyncClient, Client
from agglauncher.cluster import LocalCluster, default_processes
from aggview import errors, failpoints
from aggview.frames import FramedCall
from loadgen import transfers


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("one"), ltms=3, processes=1) as running:
        assert len(running.servers) == 1  # no LTM processes
        yield running


@pytest.fixture
def fresh_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with own_cluster(tmp_path, ltms=3, processes=1) as running:
        yield running


@pytest.mark.parametrize("seed", [3, 4])
def test_kill_of_the_one_process_under_load_loses_nothing(
    fresh_cluster: LocalCluster, seed: int
) -> None:
    cluster = fresh_cluster
    outcomes = kill_twice_under_load(cluster, lambda rng: cluster.coordinator, seed)
    with Client(cluster.address) as client:
        transfers.check(client, "accounts", "ledger", ACCOUNTS, outcomes.committed)


@pytest.mark.parametrize(
    ("cores", "ltms", "replicate", "expected"),
    [
        (1, 3, False, 1),
        (2, 3, False, 1),  # the first core is the log threads', gRPC's and clients'
        (3, 3, False, 2),
        (8, 3, False, 3),  # at most one per partition
        (2, 3, True, 2),  # copies of logs need another process
        (8, 1, True, 1),
    ],
)
def test_the_default_layout_is_a_member_per_core_beyond_the_first(
    cores: int, ltms: int, replicate: bool, expected: int
) -> None:
    assert default_processes(ltms, replicate, cores) == expected


def test_start_refuses_replication_in_one_process(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="replication needs two or more processes"):
        LocalCluster(tmp_path, ltms=2, processes=1, replicate=True).start()


def test_one_row_inserts_acknowledged_before_a_kill_survive_it(fresh_cluster: LocalCluster) -> None:
    """One-partition transactions commit with one durable write (no decision record): every
    insert a client saw commit is there after kill -9 and a restart."""
    cluster = fresh_cluster
    acknowledged_inserts_survive_a_kill(cluster, cluster.coordinator, lambda w: cluster.address)


def test_a_vote_that_cannot_be_made_durable_aborts_the_transaction(
    fresh_cluster: LocalCluster,
) -> None:
    """The prepares of a multi-partition transaction in this process are flushed before its
    decision; when that flush fails, the transaction aborts everywhere at once. (It used to
    stay in flight for good: its rows stayed locked and every read waited for it.)"""
    cluster = fresh_cluster
    with Client(cluster.address, timeout=30) as client:
        client.sql("CREATE TABLE spread (k INT PRIMARY KEY, v INT)")
    coordinator = cluster.coordinator
    coordinator.stop()
    coordinator.start(env={failpoints.ENV: f"{failpoints.COORDINATOR_LOCAL_FLUSH}=raise@1"})
    rows = ", ".join(f"({k}, {k})" for k in range(12))  # every partition, surely
    with Client(cluster.address, timeout=10) as client:
        with pytest.raises(errors.AggviewError):
            client.sql(f"INSERT INTO spread VALUES {rows}")
        client.sql(f"INSERT INTO spread VALUES {rows}")  # the same rows: none held
        assert sorted(r["k"] for r in client.scan("spread")) == list(range(12))


def test_a_member_alone_takes_async_clients_transactions_on_its_framed_port(
    cluster: LocalCluster,
) -> None:
    """One member is a cluster too: it offers clients' transactions on its framed port
    (``MembersReply.transact_addresses``, one address), and ``AsyncClient`` sends them
    there instead of on gRPC, each answered on its own."""

    async def main() -> tuple[list[int | str], list[dict[str, int]], list[str], bool]:
        async with AsyncClient(cluster.address) as client:
            await client.sql("CREATE TABLE alone_on_frames (id INT PRIMARY KEY, n INT NOT NULL)")

            outcomes = await insert_each(client, "alone_on_frames", 15, 10)
            framed = isinstance(client._transactions._call, FramedCall)
            rows = await client.scan("alone_on_frames")
            return outcomes, rows, client._core.framed, framed

    outcomes, rows, advertised, framed = asyncio.run(main())
    assert advertised == cluster.exchange_addresses and len(advertised) == 1
    assert framed
    committed = [o for o in outcomes if isinstance(o, int)]
    assert len(committed) == 10
    assert all("already exists" in o for o in outcomes if isinstance(o, str))
    assert {r["id"]: r["n"] for r in rows} == {i % 10: i for i in committed}
