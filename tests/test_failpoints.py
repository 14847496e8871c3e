"""Failure injection at every failpoint (``aggview.failpoints``): a real crash there, under load.

For each point a fresh cluster of three members (each hosts a partition and coordinates) runs
concurrent conditional transfers (``loadgen.transfers``) and view-maintaining writes (events in
pairs, under a sync and an async view); a member is restarted with the point armed, crashes
there (``os._exit``), and is restarted clean. Every member coordinates the transactions routed
to it and takes part in the others', so a crash at any point leaves some transactions in doubt
at the other members, some at its own partition.
Then, with no invariant violation allowed:

- every transaction a client saw committed is there, and none is partial: balances agree with
  the ledger, acknowledged event pairs have the acknowledged values, and a pair whose outcome the
  client never heard is wholly before or wholly after;
- the sync view equals its query recomputed from a scan; the async view does after a refresh;
- no row stays locked: every LTM ends with nothing prepared, and a transaction over every
  account commits within a bound;
- outcomes follow the decision logs: a transaction left undecided at a partition by the crash
  is committed if and only if its coordinating member logged its commit (presumed abort
  otherwise).

Seeded (``AGGVIEW_FAILPOINT_SEEDS=1,2,3`` runs more seeds; a failure names its seed). Each case
records what happened (``record_property``; ``AGGVIEW_FAILPOINT_REPORT=file`` appends JSON).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from polling import wait_for

from aggclient import Client, ConditionFailed
from agglauncher.cluster import LocalCluster
from aggview import errors, failpoints
from aggview.member_log import DECISIONS
from aggview.processes import Server
from aggview.wal import WriteAheadLog
from coordinator.catalog import CATALOG_TABLE
from loadgen import transfers
from ltm.store import open_store
from tests.test_failover import status

ACCOUNTS, GROUPS = 24, 4
PAIR = 500_000  # an event pair is (id, id + PAIR), written by one transaction
VIEW_SELECT = (
    "SELECT grp, SUM(amount) AS total, COUNT(*) AS n, MAX(amount) AS top FROM events GROUP BY grp"
)
CRASH_WITHIN = 15.0  # seconds of load before a point that never fires fails the case
BOUND = 10.0  # seconds within which locks must be gone and a new transaction must commit
MEMBERS = 3  # one partition each
SEEDS = [int(s) for s in os.environ.get("AGGVIEW_FAILPOINT_SEEDS", "1").split(",")]


@dataclass(frozen=True)
class Case:
    point: str
    hits: tuple[int, int]  # the seeded hit number is drawn from this range


CASES = [
    Case(failpoints.LTM_AFTER_PREPARE_LOGGED, (20, 60)),
    Case(failpoints.LTM_AFTER_COMMIT_APPLIED, (20, 60)),
    Case(failpoints.LTM_MID_CHECKPOINT, (1, 3)),
    Case(failpoints.COORDINATOR_BEFORE_DECISION_LOGGED, (20, 80)),
    Case(failpoints.COORDINATOR_AFTER_DECISION_LOGGED, (20, 80)),
    Case(failpoints.COORDINATOR_MID_COMMIT_FANOUT, (30, 120)),
    Case(failpoints.MID_REFRESH, (2, 5)),
]
ELSEWHERE = {
    failpoints.COORDINATOR_LOCAL_FLUSH,  # hosted partitions only: test_one_process.py
    failpoints.COORDINATOR_SUPERSEDED,  # a stall, not a crash point: test_failover.py
    failpoints.COORDINATOR_BEFORE_DRAIN,  # a wait, not a crash point: test_view_mode_switch.py
}
assert {c.point for c in CASES} | ELSEWHERE == set(failpoints.POINTS), "a failpoint untested"


@dataclass
class Seen:
    """What the clients saw, which the checks hold the recovered cluster to."""

    acked_refs: list[str] = field(default_factory=list)  # transfers acknowledged
    unknown_refs: set[str] = field(default_factory=set)  # the call failed: outcome unknown
    events: dict[int, int | None] = field(default_factory=dict)  # acknowledged: amount or gone
    # (pair, state before, state after) of event transactions whose outcome is unknown
    uncertain: list[tuple[tuple[int, int], tuple[Any, Any], tuple[Any, Any]]] = field(
        default_factory=list
    )
    errors: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    logged: set[int] = field(default_factory=set)  # commits seen in a decision log


def transfer_worker(address: str, seed: int, stop: threading.Event, seen: Seen) -> None:
    rng = random.Random(seed)
    with Client(address, timeout=10) as client:
        while not stop.is_set():
            src, dst = rng.sample(range(ACCOUNTS), 2)
            ref = uuid.UUID(int=rng.getrandbits(128)).hex
            try:
                transfers.transfer(client, "accounts", "ledger", src, dst, rng.randint(1, 60), ref)
                with seen.lock:
                    seen.acked_refs.append(ref)
            except ConditionFailed:
                pass
            except errors.AggviewError as exc:
                with seen.lock:
                    seen.unknown_refs.add(ref)
                    seen.errors[type(exc).__name__] += 1
                stop.wait(0.05)


def event_worker(address: str, worker: int, seed: int, stop: threading.Event, seen: Seen) -> None:
    """Inserts, updates and deletes event pairs, each pair in one transaction, so a partial
    commit shows; a pair whose outcome is unknown is never touched again."""
    rng = random.Random(seed * 100 + worker)
    ids = itertools.count(1 + 100_000 * worker)
    mine: dict[tuple[int, int], tuple[int, int, int]] = {}  # pair -> (group, amount, amount)
    with Client(address, timeout=10) as client:
        while not stop.is_set():
            r = rng.random()  # below 0.5 insert a pair, below 0.8 update one, else delete
            if not mine or r < 0.5:
                first = next(ids)
                pair, group = (first, first + PAIR), rng.randrange(GROUPS)
                before: tuple[Any, Any] = (None, None)
            else:
                pair = rng.choice(sorted(mine))
                group, *amounts = mine[pair]
                before = (amounts[0], amounts[1])
            after: tuple[Any, Any] = (rng.randint(1, 50), rng.randint(1, 50))
            if before != (None, None) and r >= 0.8:
                after = (None, None)
            try:
                with client.transaction() as tx:
                    for key, old, new in zip(pair, before, after, strict=True):
                        if old is None:
                            tx.insert("events", {"id": key, "grp": group, "amount": new})
                        elif new is None:
                            tx.delete("events", {"id": key})
                        else:
                            tx.update("events", {"id": key}, {"amount": new})
            except errors.AggviewError as exc:
                with seen.lock:
                    seen.uncertain.append((pair, before, after))
                    seen.errors[type(exc).__name__] += 1
                    for key in pair:
                        seen.events.pop(key, None)
                mine.pop(pair, None)
                stop.wait(0.05)
                continue
            with seen.lock:
                seen.events.update(zip(pair, after, strict=True))
            if after == (None, None):
                del mine[pair]
            else:
                mine[pair] = (group, after[0], after[1])


def retrying(action: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Runs ``action`` until it stops failing as unavailable (a server just restarted)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return action()
        except errors.AggviewError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def wait_serving(address: str) -> None:
    with Client(address, timeout=5) as client:
        retrying(lambda: client.scan("accounts"))


def prepared_counts(cluster: LocalCluster, down: Server | None = None) -> list[int]:
    """Transactions each partition holds prepared (its rows locked), from the Status RPC of
    the member hosting it (partition p at member p % members); -1 for those of ``down``."""
    members = min(cluster.processes, cluster.ltms)
    counts = []
    for p in range(cluster.ltms):
        member = cluster.member(p % members)
        if member is down:
            counts.append(-1)
            continue
        counts.append(status(cluster, p % members, partition=p).prepared)
    return counts


def refresher_member(cluster: LocalCluster, view: str) -> Server:
    """The member that runs ``view``'s refresher (view number n at member n % members), from
    the catalog in the store."""
    store = open_store(cluster.store_url)
    try:
        [(_, entry)] = store.scan_prefix(CATALOG_TABLE, f"view:{view}".encode())
    finally:
        store.close()
    return cluster.member(json.loads(entry)["number"] % min(cluster.processes, cluster.ltms))


def partition_logs(cluster: LocalCluster) -> list[list[dict[str, Any]]]:
    """Each partition's records, from its member's one log (``aggview.member_log``)."""
    by_partition: dict[str, list[dict[str, Any]]] = {}
    for directory in sorted(cluster.data.glob("member-*/member")):
        for record in wal_records(directory):
            if str(record.get("log", "")).startswith("partition-"):
                by_partition.setdefault(record["log"], []).append(record)
    return list(by_partition.values())


def decision_records(cluster: LocalCluster) -> list[dict[str, Any]]:
    """Every member's decision records, from its one log."""
    return [
        record
        for directory in sorted(cluster.data.glob("member-*/member"))
        for record in wal_records(directory)
        if record.get("log") == DECISIONS
    ]


def wal_records(directory: Path) -> list[dict[str, Any]]:
    """The records of a log that may be live: its segments are copied first (a checkpoint may
    drop one meanwhile: then again), and the copy replayed."""
    for _ in range(50):
        with tempfile.TemporaryDirectory() as tmp:
            try:
                for path in sorted(directory.glob("*.wal")):
                    shutil.copyfile(path, Path(tmp) / path.name)
            except FileNotFoundError:
                continue
            log = WriteAheadLog(Path(tmp), fsync=False)
            records = list(log.replay())
            asyncio.run(log.close())
            return records
    raise AssertionError(f"could not copy a stable log from {directory}")


def undecided_ledger_rows(records: list[dict[str, Any]]) -> dict[int, list[str]]:
    """Timestamp -> ledger refs of transactions PREPARED and not decided in an LTM's log."""
    prepared: dict[int, list[str]] = {}
    for record in records:
        if record["kind"] == "prepared":
            refs = prepared.setdefault(record["ts"], [])
            for row in record["after"].values():
                if row is not None and set(row) == {"id", "src", "dst", "amount"}:
                    refs.append(row["id"])
        elif record["kind"] in ("commit", "abort"):
            prepared.pop(record["ts"], None)
    return prepared


def wait_for_exit(server: Server, timeout: float) -> int | None:
    assert server.process is not None
    try:
        return server.process.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    running = LocalCluster(
        tmp_path / "data", ltms=MEMBERS, processes=MEMBERS, checkpoint_interval=0.5, verbose=True
    )
    try:
        yield running.start()
    finally:
        running.kill()  # its data is thrown away: no need to wait for clean shutdowns


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed{s}")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.point)
def test_crash_at_failpoint(
    cluster: LocalCluster, case: Case, seed: int, record_property: Callable[[str, Any], None]
) -> None:
    rng = random.Random(f"{case.point}/{seed}")
    create_schema(cluster.address)
    victim = cluster.member(rng.randrange(MEMBERS))
    if case.point == failpoints.MID_REFRESH:
        victim = refresher_member(cluster, "ev_async")
    at = rng.randint(*case.hits)
    report: dict[str, Any] = {"point": case.point, "seed": seed, "process": victim.role, "at": at}
    violations: list[str] = []
    try:
        victim.stop()
        victim.start(env={failpoints.ENV: f"{case.point}=crash@{at}"})
        wait_serving(cluster.address)
        seen, undecided = crash_under_load(cluster, case, victim, seed, report, violations)
        if not violations:  # serving again: hold it to what the clients saw
            check_recovered(cluster, seen, undecided, report, violations)
    finally:
        report["violations"] = violations
        for key, value in report.items():
            record_property(key, value)
        if path := os.environ.get("AGGVIEW_FAILPOINT_REPORT"):
            with open(path, "a") as out:
                out.write(json.dumps(report, default=str) + "\n")
        print(json.dumps(report, default=str))
    assert report["hit"], f"seed {seed}: {case.point} never fired: {report}"
    assert report["acknowledged"] > 10, f"seed {seed}: too little progress: {report}"
    assert not violations, f"seed {seed}, {case.point}: {violations}"


def start_workers(
    address: str, seed: int, stop: threading.Event, seen: Seen
) -> list[threading.Thread]:
    """Three transfer clients and two event clients, running until ``stop``."""
    workers = [
        threading.Thread(target=transfer_worker, args=(address, seed * 10 + i, stop, seen))
        for i in range(3)
    ] + [
        threading.Thread(target=event_worker, args=(address, i, seed, stop, seen)) for i in range(2)
    ]
    for worker in workers:
        worker.start()
    return workers


def create_schema(address: str) -> None:
    """Accounts and a ledger for transfers; events with a sync and an async view."""
    with Client(address, timeout=30) as client:
        transfers.create(client, "accounts", "ledger", ACCOUNTS)
        client.sql(
            "CREATE TABLE events (id INT PRIMARY KEY, grp INT NOT NULL, amount INT NOT NULL)"
        )
        client.sql(f"CREATE MATERIALIZED VIEW ev_sync AS {VIEW_SELECT}")
        client.sql(
            "CREATE MATERIALIZED VIEW ev_async WITH (refresh = 'async', interval_ms = 200) "
            f"AS {VIEW_SELECT}"
        )


def crash_under_load(
    cluster: LocalCluster,
    case: Case,
    victim: Server,
    seed: int,
    report: dict[str, Any],
    violations: list[str],
) -> tuple[Seen, dict[int, list[str]]]:
    """Load until the armed process crashes; notes what the crash left undecided (from the
    logs, before anyone resolves it); restarts the process clean; load goes on a little."""
    stop, seen = threading.Event(), Seen()
    workers = start_workers(cluster.address, seed, stop, seen)
    undecided: dict[int, list[str]] = {}
    # A decision log forgets a commit once every participant has it: its records are
    # gathered from the crash until the end, while the crashed member cannot have it yet.
    polling = threading.Event()
    poller = threading.Thread(target=note_logged_commits, args=(cluster, seen, polling))
    try:
        exit_code = wait_for_exit(victim, CRASH_WITHIN)
        note_logged_commits(cluster, seen)
        poller.start()
        report["exit_code"] = exit_code
        report["hit"] = exit_code == failpoints.CRASH_EXIT and (
            f"failpoint {case.point}: crash" in victim.tail(200)
        )
        counts = prepared_counts(cluster, down=victim)
        report["prepared_at_crash"] = sum(c for c in counts if c > 0)
        for records in partition_logs(cluster):
            for ts, refs in undecided_ledger_rows(records).items():
                undecided.setdefault(ts, []).extend(refs)
        report["undecided_at_crash"] = len(undecided)
        victim.kill()  # if it never crashed
        victim.start()
        try:
            wait_serving(cluster.address)
        except errors.AggviewError as exc:
            violations.append(f"not serving after the restart: {exc!r}")
        time.sleep(0.5)
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=60)
        polling.set()
        if poller.is_alive():
            poller.join()
        note_logged_commits(cluster, seen)
    report.update(
        acknowledged=len(seen.acked_refs) + len(seen.events),
        unknown=len(seen.unknown_refs) + len(seen.uncertain),
        errors=dict(seen.errors),
    )
    return seen, undecided


def check_recovered(
    cluster: LocalCluster,
    seen: Seen,
    undecided: dict[int, list[str]],
    report: dict[str, Any],
    violations: list[str],
) -> None:
    """Every check; a failed one is a violation, and so is one that cannot get an answer."""

    def check(name: str, condition: bool, detail: str = "") -> None:
        if not condition:
            violations.append(f"{name}: {detail}")

    # No row stays locked: every prepared transaction is resolved, and new work gets through.
    started = time.monotonic()
    while (counts := prepared_counts(cluster)) != [0] * cluster.ltms:
        if time.monotonic() > started + BOUND:
            break
        time.sleep(0.1)
    report["unlock_seconds"] = round(time.monotonic() - started, 3)
    check("rows still locked", counts == [0] * cluster.ltms, f"prepared per LTM {counts}")
    with Client(cluster.address, timeout=BOUND) as client:
        started = time.monotonic()
        try:
            with client.transaction() as tx:
                for i in range(ACCOUNTS):
                    tx.add("accounts", {"id": i}, {"balance": 0})
            report["relock_seconds"] = round(time.monotonic() - started, 3)
        except errors.AggviewError as exc:
            check("a transaction over every account", False, repr(exc))
            return  # every read below would wait for the same locks

        try:
            check_outcomes(client, cluster, seen, undecided, report, check)
            check_data(client, seen, check)
        except errors.AggviewError as exc:
            check("reads after recovery", False, repr(exc))


def note_logged_commits(
    cluster: LocalCluster, seen: Seen, until: threading.Event | None = None
) -> None:
    """Adds the commits in the members' decision logs to ``seen.logged``; with ``until``,
    every 0.05 s until it is set."""
    while True:
        seen.logged |= {r["ts"] for r in decision_records(cluster) if r["kind"] == "commit"}
        if until is None or until.wait(0.05):
            return


def check_outcomes(
    client: Client,
    cluster: LocalCluster,
    seen: Seen,
    undecided: dict[int, list[str]],
    report: dict[str, Any],
    check: Callable[[str, bool, str], None],
) -> None:
    """A transaction the crash left undecided at an LTM committed if and only if the
    coordinator logged its commit (presumed abort), judged by its ledger row."""
    logged = seen.logged
    ledger = {row["id"] for row in client.scan("ledger")}
    acked = set(seen.acked_refs)
    checked = 0
    for ts, refs in undecided.items():
        for ref in refs:
            checked += 1
            if ts in logged:
                check("logged commit lost", ref in ledger, f"ts {ts} ref {ref}")
            else:  # a retry of the same ref at a younger timestamp may have committed
                check("unlogged commit applied", ref not in ledger or ref in acked, f"ts {ts}")
    report["outcomes_checked"] = checked


def check_data(client: Client, seen: Seen, check: Callable[[str, bool, str], None]) -> None:
    """Nothing acknowledged lost, nothing partial, views equal to recomputation."""
    try:
        transfers.check(client, "accounts", "ledger", ACCOUNTS, seen.acked_refs)
    except AssertionError as exc:
        check("transfers", False, str(exc))

    events = {row["id"]: row for row in client.scan("events")}
    for key, amount in seen.events.items():
        got = events[key]["amount"] if key in events else None
        check("acknowledged event", got == amount, f"id {key}: {got} != {amount}")
    known = set(seen.events)
    for pair, before, after in seen.uncertain:
        state = tuple(events[k]["amount"] if k in events else None for k in pair)
        check("partial event pair", state in (before, after), f"{pair}: {state}")
        known.update(pair)
    check("events nobody wrote", set(events) <= known, f"{sorted(set(events) - known)[:5]}")

    groups: dict[int, list[int]] = {}
    for row in events.values():
        groups.setdefault(row["grp"], []).append(row["amount"])
    expected = sorted((g, sum(a), len(a), max(a)) for g, a in groups.items())
    sync_rows = sorted(tuple(r.values()) for r in client.view("ev_sync"))
    check("sync view", sync_rows == expected, f"{sync_rows} != {expected}")
    client.refresh("ev_async")
    async_rows = sorted(tuple(r.values()) for r in client.view("ev_async"))
    check("async view after refresh", async_rows == expected, f"{async_rows} != {expected}")


@pytest.mark.parametrize(
    "point, commits",
    [
        (failpoints.COORDINATOR_BEFORE_DECISION_LOGGED, False),
        (failpoints.COORDINATOR_AFTER_DECISION_LOGGED, True),
    ],
)
def test_restarted_coordinator_resolves_what_its_crash_left_prepared(
    cluster: LocalCluster, point: str, commits: bool
) -> None:
    """Coordinator failure, one transaction at a time: the member coordinating a transfer
    dies with it prepared at another member; the rows stay held while it is down; once it is
    back, the transfer is aborted (presumed abort) or committed (its commit was logged), and
    the same rows take a new transaction within a bound."""
    with Client(cluster.address, timeout=30) as client:
        transfers.create(client, "accounts", "ledger", ACCOUNTS)
    for member in cluster.servers:  # armed everywhere: whichever coordinates it crashes
        member.stop()
    for member in cluster.servers:
        member.start(env={failpoints.ENV: f"{point}=crash@1"})
    wait_serving(cluster.address)
    with Client(cluster.address, timeout=10) as client, pytest.raises(errors.Unavailable):
        transfers.transfer(client, "accounts", "ledger", 0, 1, 10, "in-doubt")
    # the coordinating member, and it alone (waiting on each member in turn cost 5 s a survivor)
    wait_for("a member to crash", lambda: any(not m.running() for m in cluster.servers), 5)
    [coordinator] = [m for m in cluster.servers if not m.running()]
    assert coordinator.process is not None
    assert coordinator.process.returncode == failpoints.CRASH_EXIT
    time.sleep(1.5)  # the other members ask for the outcome meanwhile, and get no answer
    held = prepared_counts(cluster, down=coordinator)
    assert sum(c for c in held if c > 0) >= 1, f"the crash left nothing prepared: {held}"
    for member in cluster.servers:  # disarmed
        if member is not coordinator:
            member.stop()
            member.start()
    started = time.monotonic()
    coordinator.start()
    with Client(cluster.address, timeout=BOUND) as client:
        transfers.transfer(client, "accounts", "ledger", 0, 1, 5, "after")  # the same rows
        assert time.monotonic() - started < BOUND
        ledger = {row["id"] for row in client.scan("ledger")}
        assert ("in-doubt" in ledger) == commits
        transfers.check(client, "accounts", "ledger", ACCOUNTS, ["after"])
    assert prepared_counts(cluster) == [0] * cluster.ltms


def test_failpoint_specs_and_scopes() -> None:
    """In-process: the n-th hit fires, scopes qualify names, bad specs fail at start."""
    try:
        failpoints.arm(f"{failpoints.MID_REFRESH}=raise@2")
        failpoints.hit(failpoints.COORDINATOR_BEFORE_DECISION_LOGGED)  # not in the scope
        with failpoints.scope("refresh"):
            failpoints.hit(failpoints.COORDINATOR_BEFORE_DECISION_LOGGED)  # first hit
            with pytest.raises(failpoints.FailpointError):
                failpoints.hit(failpoints.COORDINATOR_BEFORE_DECISION_LOGGED)
            failpoints.hit(failpoints.COORDINATOR_BEFORE_DECISION_LOGGED)  # fired already
        for bad in ("ltm.after_prepare_logged", "nowhere=crash", "ltm.mid_checkpoint=explode"):
            with pytest.raises(ValueError):
                failpoints.parse(bad)
    finally:
        failpoints.arm("")
    assert not failpoints.ARMED
