"""kill -9 of an LTM, and separately of the coordinator, at random points under load.

After each restart the cluster must serve again, and every transfer a client saw committed
must be there, with nothing half-applied (see ``loadgen.transfers.check``). Seeded: a failure
names its seed and reproduces with it."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from polling import wait_for

from aggclient import Client
from agglauncher.cluster import LocalCluster
from aggview import errors
from aggview.member_log import DECISIONS, partition_tag, split
from aggview.processes import Server
from loadgen import transfers

ACCOUNTS = 30


def wait_until_serving(address: str, accounts: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    with Client(address, timeout=5) as client:
        while True:
            try:
                client.scan(accounts)
                return
            except errors.AggviewError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def acknowledged_inserts_survive_a_kill(
    cluster: LocalCluster, victim: Server, writer_address: Callable[[int], str]
) -> None:
    """Seven writers insert one row per transaction (writer w through ``writer_address(w)``)
    until ``victim`` is killed with -9; after its restart every insert a writer saw commit
    is there."""
    with Client(cluster.address) as client:
        client.sql("CREATE TABLE notes (id INT PRIMARY KEY, body TEXT NOT NULL)")
    acknowledged: list[int] = []
    stop = threading.Event()

    def writer(first: int) -> None:
        with Client(writer_address(first), timeout=5) as client:
            for i in range(first, first + 100_000, 7):
                if stop.is_set():
                    return
                try:
                    with client.transaction() as tx:
                        tx.insert("notes", {"id": i, "body": f"note {i}"})
                except errors.AggviewError:  # the kill: an unknown outcome, not counted
                    return
                acknowledged.append(i)

    workers = [threading.Thread(target=writer, args=(w,)) for w in range(7)]
    for worker in workers:
        worker.start()
    wait_for("some inserts to commit", lambda: len(acknowledged) > 200)
    victim.kill()
    stop.set()
    for worker in workers:
        worker.join(timeout=30)
    victim.start()
    wait_until_serving(cluster.address, "notes")
    with Client(cluster.address) as client:
        present = {row["id"] for row in client.scan("notes")}
    missing = [i for i in acknowledged if i not in present]
    assert not missing, f"{len(missing)} acknowledged inserts lost, e.g. {missing[:5]}"


def kill_twice_under_load(
    cluster: LocalCluster, victim: Callable[[random.Random], Server], seed: int
) -> transfers.Outcomes:
    """Transfers from 6 clients while ``victim`` (picked by a seeded draw) is killed with -9
    and restarted twice; each time the clients must commit again. Returns what they saw."""
    rng = random.Random(seed)
    with Client(cluster.address) as client:
        transfers.create(client, "accounts", "ledger", ACCOUNTS)
    with transfers.running(
        cluster.address, "accounts", "ledger", ACCOUNTS, clients=6, seed=seed, join_timeout=60
    ) as outcomes:
        for _ in range(2):
            time.sleep(rng.uniform(0.3, 1.2))
            server = victim(rng)
            server.kill()
            time.sleep(rng.uniform(0.0, 0.5))
            server.start()
            wait_until_serving(cluster.address, "accounts")
            restarted = len(outcomes.committed)
            wait_for(
                f"seed {seed}: the clients' transfers to commit again after the restart",
                lambda n=restarted: len(outcomes.committed) > n,
            )
    assert len(outcomes.committed) > 20, f"seed {seed}: too little progress {outcomes}"
    return outcomes


@pytest.mark.parametrize("victim", ["ltm", "coordinator"])
@pytest.mark.parametrize("seed", [1, 2])
def test_kill_and_restart_under_load(fresh_cluster: LocalCluster, victim: str, seed: int) -> None:
    cluster = fresh_cluster

    def pick(rng: random.Random) -> Server:
        if victim == "ltm":
            return cluster.member(rng.randrange(cluster.ltms))
        return cluster.coordinator

    outcomes = kill_twice_under_load(cluster, pick, seed)
    with Client(cluster.address) as client:
        transfers.check(client, "accounts", "ledger", ACCOUNTS, outcomes.committed)
    # and it keeps serving transactions
    with Client(cluster.address) as client:
        transfers.transfer(client, "accounts", "ledger", 0, 1, 0, f"after-{seed}")


def test_clean_restart_keeps_everything(fresh_cluster: LocalCluster) -> None:
    cluster = fresh_cluster
    with Client(cluster.address) as client:
        transfers.create(client, "accounts", "ledger", ACCOUNTS)
        for i in range(20):
            transfers.transfer(client, "accounts", "ledger", i, i + 1, 5, f"t{i}")
    cluster.stop()
    cluster.servers.clear()
    cluster.start()
    with Client(cluster.address) as client:
        transfers.check(client, "accounts", "ledger", ACCOUNTS, [f"t{i}" for i in range(20)])
        transfers.transfer(client, "accounts", "ledger", 3, 4, 1, "after")


def test_a_layout_changes_only_after_a_clean_stop(tmp_path: Path) -> None:
    """Each layout logs its partitions in its own directories: after a kill -9, a start in
    another layout is refused (it would not replay what the last run acknowledged), the same
    layout recovers everything, and after a clean stop the layout may change."""
    data = tmp_path / "data"
    cluster = LocalCluster(data, ltms=2, processes=2, checkpoint_interval=1000.0)
    try:
        cluster.start()
        with Client(cluster.address) as client:
            client.sql("CREATE TABLE kept (id INT PRIMARY KEY, v INT)")
            for i in range(20):
                with client.transaction() as tx:
                    tx.insert("kept", {"id": i, "v": i})
    finally:
        cluster.kill()  # no checkpoint: the rows are in the LTMs' logs only
    with pytest.raises(errors.FailedPrecondition, match=r"--processes 2 and did not stop clean"):
        LocalCluster(data, ltms=2, processes=1).start()
    with LocalCluster(data, ltms=2, processes=2) as same:  # the same layout replays its logs
        with Client(same.address) as client:
            assert len(client.scan("kept")) == 20
    with LocalCluster(data, ltms=2, processes=1) as one:  # after a clean stop: any layout
        with Client(one.address) as client:
            assert len(client.scan("kept")) == 20
            with client.transaction() as tx:
                tx.insert("kept", {"id": 20, "v": 20})
    with LocalCluster(data, ltms=2, processes=2) as back:
        with Client(back.address) as client:
            assert len(client.scan("kept")) == 21


def test_logs_change_layout_without_losing_what_was_acknowledged(tmp_path: Path) -> None:
    """A member logs its partitions and decisions in one log (``aggview.member_log``); one
    started with --replicate logs each on its own, and a member upgraded from the layout
    before has them on their own too. Each start takes the other layout's records in with
    their LSNs and numbers later ones above them, and so does a log of another --processes
    layout, which starts afresh, above the LSNs the store holds: a row checkpointed in one
    layout and updated in the next survives a kill -9 there (replayed, not skipped as
    already stored)."""
    data = tmp_path / "data"

    def run(step: int, clean: bool, replicate: bool = False, processes: int = 2) -> None:
        cluster = LocalCluster(
            data, ltms=2, processes=processes, replicate=replicate, checkpoint_interval=1000.0
        )
        try:
            cluster.start()
            with Client(cluster.address) as client:
                if step == 0:
                    client.sql("CREATE TABLE kept (id INT PRIMARY KEY, v INT)")
                    for i in range(12):
                        with client.transaction() as tx:
                            tx.insert("kept", {"id": i, "v": 0})
                rows = {row["id"]: row["v"] for row in client.scan("kept")}
                assert rows == dict.fromkeys(range(12), step), f"step {step}"
                for i in range(0, 12, 2):  # pairs: over both partitions, often
                    with client.transaction() as tx:
                        tx.update("kept", {"id": i}, {"v": step + 1})
                        tx.update("kept", {"id": i + 1}, {"v": step + 1})
        finally:
            if clean:
                cluster.stop()  # every partition checkpointed: the store has the LSNs
            else:
                cluster.kill()

    run(0, clean=True)
    run(1, clean=False, replicate=True)  # split into own logs
    run(2, clean=True, replicate=True)  # replayed from them
    run(3, clean=False)  # taken back into one log per member
    for member in sorted(data.glob("member-*")):  # the layout before: each log on its own
        partition = partition_tag(int(member.name.split("-")[1]))  # member m hosts m of 2
        own = {DECISIONS: member, partition: member / "partitions" / partition}
        split(member / "member", own)
    run(4, clean=False)  # taken in from them
    run(5, clean=True)
    run(6, clean=False, processes=1)  # a fresh log, numbered above what the store holds
    run(7, clean=True, processes=1)
    run(8, clean=False)
    run(9, clean=True)
