"""A nemesis for a cluster of members on separate hosts (bench.netns), and a checker.

While clients in the root namespace run conditional transfers (each with its ledger row, in one
transaction: loadgen.transfers), snapshot scans and a sync view over the ledger, the nemesis
injects faults one after another, each followed by a heal and a wait for the cluster to settle:

    leader-cut    the leader's host cut off (its link down) for 3x the failover delay, healed
    follower-cut  a follower's host cut off as long, healed
    flap          a member's link 1 s down / 1 s up, three times (shorter than the failover delay)
    kill          a member killed (SIGKILL), restarted with the same command after 0-1.5x the delay
    pause         a member paused (SIGSTOP) 2.5x the failover delay, then SIGCONT
    two-lost      two members killed within one failover delay, both restarted later
    slow          the link between two members (--slow-pair) delayed 200 ms per read, 3x the delay
    link-cut      that link held (nothing passes; both still reach the rest): a partial partition
    one-way-cut   only the connections the first of the pair opens to the second held
    cut-restart   a follower cut off, healed, and at once killed and restarted: the leader moves its
                  partitions while it restarts (the sequence that lost acknowledged transfers)

A member that exits on its own is restarted at once with the same command (as ``aggview start``
does), and counted. At the end every fault is healed, the load stops, and the checker verifies:
no acknowledged transfer lost (its ledger row exists), none half applied (every balance equals
its initial amount plus what the ledger says it received minus paid), every snapshot consistent
(its total is the invariant, its balances agree with its ledger, its view equals its ledger's
recomputation, it holds every transfer acknowledged before it started), the view equal to its
recomputation, and real-time order: a transaction that started after another was acknowledged
has a larger timestamp (two members granting timestamps at once shows as a violation). Outcomes
unknown to the client (the call failed mid-way) are allowed, counted, and must resolve
consistently (the ledger row is there iff the balances moved: the ledger-balance check). Per
fault it measures the unavailability window: the longest gap between acknowledged transfers from
the fault's start to the next fault's.

    python -m bench.nemesis --faults 20 --kinds leader-cut follower-cut --json nemesis.json

Needs root and ``ip netns``; the result table goes to stdout, everything to the JSON file.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import datetime
import json
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aggclient import Client, ConditionFailed
from aggview import errors
from aggview.processes import paused
from bench.netns import HostCluster, unavailable
from coordinator import leadership
from loadgen import transfers
from ltm.store import open_store, ownership
from ltm.store.sqlite import writer_lock

ACCOUNTS, LEDGER, VIEW = "accounts", "ledger", "moved"
ACCOUNT_COUNT = 30
# One-row writes, one thread per key, each key on one partition: while a member is cut off,
# the others' keys say whether the rest of the cluster kept committing its own partitions'
# transactions (the transfers touch three or four partitions, so nearly all wait for the cut one).
PROBES, PROBE_KEYS, PROBE_EVERY = "probes", 6, 0.05
_FAULTED = re.compile(r"member (\d+)")
VIEW_SQL = (
    f"CREATE MATERIALIZED VIEW {VIEW} WITH (refresh = 'sync') AS SELECT dst, COUNT(*) AS n, "
    f"SUM(amount) AS total FROM {LEDGER} GROUP BY dst"
)
KINDS = (
    "leader-cut",
    "follower-cut",
    "flap",
    "kill",
    "pause",
    "two-lost",
    "slow",
    "link-cut",
    "one-way-cut",
    "cut-restart",
)
NEEDS_SLOW_PAIR = {"slow", "link-cut", "one-way-cut"}
# log lines worth quoting: who leads, who is declared dead, what moved, what was forgotten
NOTABLE = re.compile(
    r"leads \(term|declared dead|takes over|forgot|fell out of sync|no in-sync standby|"
    r"deposed|no longer leads|exited|Traceback|ERROR|CRITICAL|clock stream"
)
_LEADS = re.compile(r"member (\d+) leads \(term (\d+)\)")
_TERM = re.compile(r"(?:leads|takes the lead|took the lead) \(term (\d+)\)")
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


@dataclass
class Commit:
    start: float
    end: float
    timestamp: int
    ref: str


@dataclass
class Scan:
    """One snapshot of accounts, ledger and view, and what was wrong with it."""

    start: float
    end: float
    timestamp: int
    inconsistent: bool  # total not the invariant, or a negative balance
    partial: bool  # balances disagree with the ledger at the same snapshot
    view_wrong: bool  # the view differs from its recomputation from the ledger
    stale: int  # transfers acknowledged before the scan started that it does not hold


@dataclass
class Fault:
    kind: str
    start: float
    healed: float = 0.0
    settled: float | None = None  # when the cluster was whole again (None: not in time)
    detail: str = ""


@dataclass
class History:
    """What clients saw and the nemesis did (times: time.monotonic())."""

    commits: list[Commit] = field(default_factory=list)  # in acknowledgement order
    unknown: list[tuple[float, str]] = field(default_factory=list)  # (start, ref)
    refused: int = 0  # condition failed: nothing applied, by the client's own answer
    scans: list[Scan] = field(default_factory=list)
    scan_errors: Counter[str] = field(default_factory=Counter)
    client_errors: Counter[str] = field(default_factory=Counter)
    exits: list[tuple[float, int, int | None]] = field(default_factory=list)  # (time, member, code)
    # every transfer: (start, end, outcome: "ok", "refused" or the error's class, the member
    # the client sent it to: None for the address it was given)
    calls: list[tuple[float, float, str, int | None]] = field(default_factory=list)
    # every acknowledged probe write: (key, when acknowledged, the member the client sent it to)
    probes: list[tuple[int, float, int | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def check_scan(
    balances: list[dict[str, Any]],
    ledger: list[dict[str, Any]],
    view: list[dict[str, Any]],
    acked: list[str],
) -> tuple[bool, bool, bool, int]:
    """(inconsistent, partial, view wrong, stale) of one snapshot: ``acked`` were acknowledged
    before it started."""
    amounts = [row["balance"] for row in balances]
    inconsistent = (
        len(amounts) != ACCOUNT_COUNT
        or sum(amounts) != transfers.INITIAL * ACCOUNT_COUNT
        or min(amounts, default=0) < 0
    )
    expected = {i: transfers.INITIAL for i in range(ACCOUNT_COUNT)}
    groups: dict[int, tuple[int, int]] = {}
    for entry in ledger:
        expected[entry["src"]] -= entry["amount"]
        expected[entry["dst"]] += entry["amount"]
        n, total = groups.get(entry["dst"], (0, 0))
        groups[entry["dst"]] = (n + 1, total + entry["amount"])
    partial = {row["id"]: row["balance"] for row in balances} != expected
    view_wrong = {row["dst"]: (row["n"], row["total"]) for row in view} != groups
    held = {entry["id"] for entry in ledger}
    stale = sum(1 for ref in acked if ref not in held)
    return inconsistent, partial, view_wrong, stale


class Workload:
    """Transfer threads and a snapshot-scan thread against the cluster, recording into History."""

    def __init__(self, address: str, history: History, clients: int, seed: int) -> None:
        self.address, self.history = address, history
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._transfers, args=(seed * 1000 + i,), daemon=True)
            for i in range(clients)
        ]
        self.threads.append(threading.Thread(target=self._scans, daemon=True))
        self.threads += [
            threading.Thread(target=self._probes, args=(key,), daemon=True)
            for key in range(PROBE_KEYS)
        ]

    def start(self) -> Workload:
        for thread in self.threads:
            thread.start()
        return self

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)

    def _transfers(self, seed: int) -> None:
        rng, history = random.Random(seed), self.history
        with Client(self.address, timeout=10) as client:
            while not self.stop.is_set():
                src, dst = rng.sample(range(ACCOUNT_COUNT), 2)
                ref = uuid.UUID(int=rng.getrandbits(128)).hex
                start = time.monotonic()
                try:
                    ts = transfers.transfer(
                        client, ACCOUNTS, LEDGER, src, dst, rng.randint(1, 60), ref
                    )
                except ConditionFailed:
                    outcome = "refused"
                    with history.lock:
                        history.refused += 1
                except errors.AggviewError as exc:
                    outcome = type(exc).__name__
                    with history.lock:
                        history.unknown.append((start, ref))
                        history.client_errors[outcome] += 1
                else:
                    outcome = "ok"
                    with history.lock:
                        history.commits.append(Commit(start, time.monotonic(), ts, ref))
                with history.lock:
                    history.calls.append((start, time.monotonic(), outcome, client.last_member))
                if outcome not in ("ok", "refused"):
                    time.sleep(0.05)

    def _probes(self, key: int) -> None:
        """One-row writes on ``key``, each noted with the member whose partition holds the
        row (its home, as the client routes it when no member is avoided; not the member it
        went to, which is another while the client routes around a silent one)."""
        with Client(self.address, timeout=10) as client:
            while not self.stop.wait(PROBE_EVERY):
                try:
                    with client.transaction() as tx:
                        tx.add(PROBES, {"id": key}, {"n": 1})
                except errors.AggviewError:
                    continue
                home = client._routing().member_for(tx.operations)
                with self.history.lock:
                    self.history.probes.append((key, time.monotonic(), home))

    def _scans(self) -> None:
        history = self.history
        with Client(self.address, timeout=10) as client:
            while not self.stop.wait(0.2):
                with history.lock:
                    acked = [c.ref for c in history.commits]
                start = time.monotonic()
                try:
                    with client.snapshot() as snap:
                        balances = snap.scan(ACCOUNTS)
                        ledger = snap.scan(LEDGER)
                        view = snap.view(VIEW)
                except errors.AggviewError as exc:
                    with history.lock:
                        history.scan_errors[type(exc).__name__] += 1
                    time.sleep(0.2)
                    continue
                scan = Scan(
                    start,
                    time.monotonic(),
                    snap.timestamp,
                    *check_scan(balances, ledger, view, acked),
                )
                with history.lock:
                    history.scans.append(scan)


class Nemesis:
    """Injects faults into a HostCluster; restarts members that exit on their own."""

    def __init__(self, cluster: HostCluster, history: History, rng: random.Random) -> None:
        self.cluster, self.history, self.rng = cluster, history, rng
        self.delay = cluster.failover_after
        self.held: set[int] = set()  # members down on purpose: not restarted by the supervisor
        self.locks = [threading.Lock() for _ in cluster.servers]
        self.stop = threading.Event()
        self.store = open_store(cluster.store_url)
        self.supervisor = threading.Thread(target=self._supervise, daemon=True)

    def start(self) -> Nemesis:
        self.supervisor.start()
        return self

    def close(self) -> None:
        self.stop.set()
        self.supervisor.join(60)
        self.store.close()

    # --- members

    def leader(self) -> int:
        """The leader the store records (member 0 if it cannot be read)."""
        try:
            return leadership.read(self.store).member
        except Exception:  # the store busy or mid-write: any member will do for the fault
            return 0

    def followers(self) -> list[int]:
        leader = self.leader()
        return [m for m in range(self.cluster.members) if m != leader]

    def _supervise(self) -> None:
        while not self.stop.wait(0.2):
            for m, server in enumerate(self.cluster.servers):
                if m in self.held or server.running():
                    continue
                with self.locks[m]:
                    if m in self.held or server.running():
                        continue
                    self._restart(m, on_its_own=True)

    def _restart(self, m: int, on_its_own: bool) -> None:
        server = self.cluster.servers[m]
        if on_its_own:
            code = server.process.returncode if server.process is not None else None
            with self.history.lock:
                self.history.exits.append((time.monotonic(), m, code))
        try:
            server.start(timeout=30)
        except RuntimeError:  # exited at start (counted when the supervisor sees it gone)
            server.kill()
            time.sleep(0.5)

    def kill(self, m: int) -> None:
        with self.locks[m]:
            self.held.add(m)
            self.cluster.servers[m].kill()

    def restart_together(self, members: list[int]) -> None:
        """Restarts ``members`` at once, as their own supervisors would, then waits for each:
        a follower waits at start for the leader, so one restarted after the other held a
        lost leader down for a lost follower's whole start timeout."""
        for m in sorted(members):  # in one order, as every caller takes the locks
            self.locks[m].acquire()
        try:
            launched = {
                m: self.cluster.servers[m].launch()
                for m in members
                if not self.cluster.servers[m].running()
            }
            for m, offset in launched.items():
                try:
                    self.cluster.servers[m].wait_listening(offset, timeout=30)
                except RuntimeError:  # exited at start: the supervisor restarts it
                    self.cluster.servers[m].kill()
            self.held.difference_update(members)
        finally:
            for m in members:
                self.locks[m].release()

    def restart(self, m: int) -> None:
        with self.locks[m]:
            if not self.cluster.servers[m].running():
                self._restart(m, on_its_own=False)
            self.held.discard(m)

    def signal(self, m: int, sig: signal.Signals) -> None:
        process = self.cluster.servers[m].process
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, sig)

    # --- faults: each returns what it did

    def leader_cut(self) -> str:
        return self._cut(self.leader(), "leader")

    def follower_cut(self) -> str:
        return self._cut(self.rng.choice(self.followers()), "follower")

    def _cut(self, m: int, role: str) -> str:
        self.cluster.network.cut(m)
        time.sleep(3 * self.delay)
        self.cluster.network.heal(m)
        return f"{role} member {m} cut off {3 * self.delay:.1f}s"

    def flap(self) -> str:
        m = self.rng.randrange(self.cluster.members)
        for _ in range(3):
            self.cluster.network.cut(m)
            time.sleep(1.0)
            self.cluster.network.heal(m)
            time.sleep(1.0)
        return f"member {m} link 1s down / 1s up x3"

    def kill_restart(self) -> str:
        m = self.rng.randrange(self.cluster.members)
        was = "leader " if m == self.leader() else ""
        down = self.rng.uniform(0, 1.5 * self.delay)
        self.kill(m)
        time.sleep(down)
        self.restart(m)
        return f"{was}member {m} killed, restarted after {down:.1f}s"

    def pause(self) -> str:
        m = self.leader() if self.rng.random() < 0.5 else self.rng.randrange(self.cluster.members)
        was = "leader " if m == self.leader() else ""
        process = self.cluster.servers[m].process
        pids = [process.pid] if process is not None else []
        with paused(pids, writer_lock(self.cluster.data / "store.db")):  # outside a write
            time.sleep(2.5 * self.delay)
        return f"{was}member {m} paused {2.5 * self.delay:.1f}s"

    def two_lost(self) -> str:
        a, b = self.rng.sample(range(self.cluster.members), 2)
        apart = self.rng.uniform(0.2, 0.8 * self.delay)
        self.kill(a)
        time.sleep(apart)
        self.kill(b)
        time.sleep(1.5 * self.delay)
        self.restart_together([a, b])
        return f"members {a} and {b} killed {apart:.1f}s apart, restarted"

    def slow(self) -> str:
        for proxy in self.cluster.detours:
            proxy.set_delay(0.2)
        time.sleep(3 * self.delay)
        for proxy in self.cluster.detours:
            proxy.calm()
        return f"link {self.cluster.slow_pair} delayed 200 ms per read"

    def link_cut(self, one_way: bool = False) -> str:
        held = self.cluster.detours[:2] if one_way else self.cluster.detours
        for proxy in held:
            proxy.hold()
        time.sleep(3 * self.delay)
        for proxy in held:
            proxy.calm()
        a, b = self.cluster.slow_pair or (0, 0)
        return f"link {a}->{b} held" if one_way else f"link {a}<->{b} held"

    def cut_restart(self) -> str:
        m = self.rng.choice(self.followers())
        self.cluster.network.cut(m)
        time.sleep(2.5 * self.delay)
        self.cluster.network.heal(m)
        after = self.rng.uniform(0, 1.0)
        time.sleep(after)
        self.kill(m)
        self.restart(m)
        return f"member {m} cut off {2.5 * self.delay:.1f}s, healed, restarted {after:.1f}s later"

    def inject(self, kind: str) -> str:
        faults: dict[str, Callable[[], str]] = {
            "leader-cut": self.leader_cut,
            "follower-cut": self.follower_cut,
            "flap": self.flap,
            "kill": self.kill_restart,
            "pause": self.pause,
            "two-lost": self.two_lost,
            "slow": self.slow,
            "link-cut": self.link_cut,
            "one-way-cut": lambda: self.link_cut(one_way=True),
            "cut-restart": self.cut_restart,
        }
        return faults[kind]()

    def heal_all(self) -> None:
        """Whatever a fault left (an exception mid-way): links up, proxies calm, all running."""
        for m in range(self.cluster.members):
            self.cluster.network.heal(m)
            self.signal(m, signal.SIGCONT)
        for proxy in self.cluster.detours:
            proxy.calm()
        for m in list(self.held):
            self.restart(m)

    def settled(self, since: float) -> bool:
        """Every member running, every partition home with an in-sync copy, a commit since."""
        if not all(server.running() for server in self.cluster.servers):
            return False
        with self.history.lock:
            if not self.history.commits or self.history.commits[-1].end <= since:
                return False
        try:
            records = [ownership.read(self.store, p) for p in range(self.cluster.partitions)]
        except Exception:  # the store busy: not known yet
            return False
        members = self.cluster.members
        return all(r.owner == r.partition % members and r.in_sync for r in records)

    def wait_settled(self, timeout: float) -> float | None:
        since = time.monotonic()
        deadline = since + timeout
        while time.monotonic() < deadline:
            if self.settled(since):
                return time.monotonic()
            time.sleep(0.1)
        return None


def schedule(kinds: list[str], count: int, rng: random.Random) -> list[str]:
    """``count`` faults, every kind once per round, each round in a random order."""
    order: list[str] = []
    while len(order) < count:
        round_ = list(kinds)
        rng.shuffle(round_)
        order += round_
    return order[:count]


# ------------------------------------------------------------------------------ checking


def realtime_violations(commits: list[Commit], scans: list[Scan]) -> list[tuple[float, str]]:
    """Operations whose timestamp is not above (a scan: not at least) that of every transfer
    acknowledged before they started; (start, description) each."""
    ended = sorted(commits, key=lambda c: c.end)
    ends = [c.end for c in ended]
    highest: list[int] = []
    for c in ended:
        highest.append(max(highest[-1], c.timestamp) if highest else c.timestamp)

    def before(start: float) -> int:
        i = bisect.bisect_left(ends, start)
        return highest[i - 1] if i else -1

    found = [
        (c.start, f"transfer {c.ref} got {c.timestamp} after {before(c.start)} was acknowledged")
        for c in commits
        if c.timestamp <= before(c.start)
    ]
    found += [
        (s.start, f"snapshot at {s.timestamp} after {before(s.start)} was acknowledged")
        for s in scans
        if s.timestamp < before(s.start)
    ]
    return sorted(found)


def read_logs(cluster: HostCluster) -> list[tuple[float, int, str]]:
    """The members' notable log lines as (time.monotonic() equivalent, member, line)."""
    offset = time.time() - time.monotonic()
    found = []
    for m in range(cluster.members):
        path = cluster.log_path(m)
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            match = _LOG_TIME.match(line)
            if match and NOTABLE.search(line):
                stamp = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
                found.append((stamp.timestamp() - offset, m, line))
    return sorted(found)


def final_state(address: str, timeout: float = 90.0) -> dict[str, Any]:
    """Accounts, ledger and view from one snapshot, once the cluster answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with Client(address, timeout=10) as client, client.snapshot() as snap:
                return {
                    "balances": snap.scan(ACCOUNTS),
                    "ledger": snap.scan(LEDGER),
                    "view": snap.view(VIEW),
                }
        except errors.AggviewError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def evidence(
    logs: list[tuple[float, int, str]], at: float | None, starts: list[float]
) -> list[str]:
    """The notable log lines from 15 s before to 3 s after the first violation seen."""
    if at is None:
        return []
    zero = starts[0] if starts else 0.0
    return [
        f"+{when - zero:.2f}s m{member} {line}"
        for when, member, line in logs
        if at - 15 <= when <= at + 3
    ]


def _window_index(starts: list[float], at: float) -> int:
    """The fault whose window (its start to the next one's) holds ``at``; -1 before the first."""
    return bisect.bisect_right(starts, at) - 1


def analyse(
    history: History,
    faults: list[Fault],
    final: dict[str, Any],
    logs: list[tuple[float, int, str]],
    end: float,
) -> dict[str, Any]:
    """Per fault and per kind: injected, lost, partial, bad snapshots, real-time violations,
    unknown outcomes, exits, leader changes and the unavailability window."""
    starts = [f.start for f in faults]
    ledger = {row["id"]: row for row in final["ledger"]}
    rows: list[dict[str, Any]] = [
        {
            "kind": f.kind,
            "detail": f.detail,
            "at s": f.start - starts[0],
            **dict.fromkeys(COUNTS, 0),
        }
        for f in faults
    ]
    before = {"kind": "(before faults)", "detail": "", **dict.fromkeys(COUNTS, 0)}

    def row(at: float) -> dict[str, Any]:
        i = _window_index(starts, at)
        return rows[i] if i >= 0 else before

    lost = [c for c in history.commits if c.ref not in ledger]
    for c in lost:
        row(c.end)["lost"] += 1
    for scan in history.scans:
        target = row(scan.start)
        target["inconsistent"] += scan.inconsistent
        target["partial"] += scan.partial
        target["view wrong"] += scan.view_wrong
        target["stale"] += scan.stale > 0
    violations = realtime_violations(history.commits, history.scans)
    for at, _ in violations:
        row(at)["realtime"] += 1
    resolved = Counter()
    for start, ref in history.unknown:
        row(start)["unknown"] += 1
        resolved["committed" if ref in ledger else "not committed"] += 1
    for at, _, _ in history.exits:
        row(at)["exits"] += 1
    terms: dict[int, float] = {}  # each term the logs name, when first named
    for at, _, line in logs:
        if found := _TERM.search(line):
            terms.setdefault(int(found.group(1)), at)
    for at in terms.values():
        row(at)["lead changes"] += 1
    leaders: dict[int, set[int]] = {}
    for _, _, line in logs:
        if found := _LEADS.search(line):
            leaders.setdefault(int(found.group(2)), set()).add(int(found.group(1)))
    bad_times = [c.end for c in lost] + [at for at, _ in violations]
    bad_times += [s.start for s in history.scans if s.inconsistent or s.partial or s.stale]
    bad_times += [s.start for s in history.scans if s.view_wrong]
    acks = sorted(c.end for c in history.commits)
    for i, fault in enumerate(faults):
        stop = starts[i + 1] if i + 1 < len(faults) else end
        rows[i]["unavailable s"] = longest_gap(fault.start, acks, stop)
        rows[i]["others s"] = others_gap(history.probes, fault, stop)
        rows[i]["settled s"] = None if fault.settled is None else fault.settled - fault.healed

    balances = {r["id"]: r["balance"] for r in final["balances"]}
    expected = {i: transfers.INITIAL for i in range(ACCOUNT_COUNT)}
    groups: dict[int, tuple[int, int]] = {}
    for entry in final["ledger"]:
        expected[entry["src"]] -= entry["amount"]
        expected[entry["dst"]] += entry["amount"]
        n, total = groups.get(entry["dst"], (0, 0))
        groups[entry["dst"]] = (n + 1, total + entry["amount"])
    off = {i: balances.get(i, 0) - expected[i] for i in expected if balances.get(i) != expected[i]}
    view = {r["dst"]: (r["n"], r["total"]) for r in final["view"]}
    return {
        "faults": rows,
        "before_faults": before,
        "kinds": summarise(rows),
        "final": {
            "acknowledged": len(history.commits),
            "lost": len(lost),
            "lost_examples": [c.ref for c in lost[:5]],
            "accounts_off_by_ledger": off,
            "total": sum(balances.values()),
            "invariant": transfers.INITIAL * ACCOUNT_COUNT,
            "view_exact": view == groups,
            "unknown": len(history.unknown),
            "unknown_resolved": dict(resolved),
            "refused": history.refused,
            "scans": len(history.scans),
            "scan_errors": dict(history.scan_errors),
            "client_errors": dict(history.client_errors),
            "realtime_violations": [text for _, text in violations[:20]],
            "terms_led_by_two": {t: sorted(m) for t, m in leaders.items() if len(m) > 1},
            "first_violation": min(bad_times) - starts[0] if bad_times and starts else None,
            "evidence": evidence(logs, min(bad_times) if bad_times else None, starts),
            "exits": [
                (round(at - starts[0], 1) if starts else at, m, code)
                for at, m, code in history.exits
            ],
        },
    }


COUNTS = (
    "lost",
    "partial",
    "inconsistent",
    "view wrong",
    "stale",
    "realtime",
    "unknown",
    "exits",
    "lead changes",
)


def others_gap(
    probes: list[tuple[int, float, int | None]], fault: Fault, stop: float
) -> float | None:
    """For a fault of one member: the longest gap, from the fault's start to ``stop``, between
    acknowledged one-row writes on the partitions whose home is another member (None for
    faults of several members or a link)."""
    found = _FAULTED.search(fault.detail)
    if found is None or "members" in fault.detail:
        return None
    faulted = int(found.group(1))
    served: dict[int, int | None] = {}  # each key's home member
    for key, at, member in probes:
        if at < fault.start:
            served[key] = member
    keys = {key for key, member in served.items() if member is not None and member != faulted}
    if not keys:
        return None
    return longest_gap(fault.start, sorted(at for key, at, _ in probes if key in keys), stop)


def longest_gap(start: float, acks: list[float], stop: float) -> float:
    """The longest time from ``start`` to ``stop`` without an acknowledgement (``acks``
    sorted; those outside the window are ignored)."""
    inside = acks[bisect.bisect_right(acks, start) : bisect.bisect_left(acks, stop)]
    points = [start, *inside, stop]
    return max(b - a for a, b in zip(points, points[1:], strict=False))


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per kind: sums of the counts, and the unavailability's p50 and max."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        kinds.setdefault(row["kind"], []).append(row)
    summary = []
    for kind, group in kinds.items():
        gaps = [r["unavailable s"] for r in group]
        others = [r["others s"] for r in group if r.get("others s") is not None]
        summary.append(
            {
                "kind": kind,
                "injected": len(group),
                **{name: sum(r[name] for r in group) for name in COUNTS},
                "unavailable p50 s": statistics.median(gaps),
                "unavailable max s": max(gaps),
                "others p50 s": statistics.median(others) if others else None,
                "others max s": max(others) if others else None,
            }
        )
    return summary


def safety_failures(report: dict[str, Any]) -> list[str]:
    """What broke the safety checks (empty: none): the things a test asserts."""
    final, failures = report["final"], []
    if final["lost"]:
        failures.append(f"{final['lost']} acknowledged transfers lost")
    if final["accounts_off_by_ledger"]:
        failures.append(f"balances disagree with the ledger: {final['accounts_off_by_ledger']}")
    if final["total"] != final["invariant"]:
        failures.append(f"total {final['total']} instead of {final['invariant']}")
    if final["terms_led_by_two"]:
        failures.append(f"two members led one term: {final['terms_led_by_two']}")
    if not final["view_exact"]:
        failures.append("the view differs from its recomputation from the ledger")
    rows = [report["before_faults"], *report["faults"]]
    for name in ("inconsistent", "partial", "view wrong", "stale", "realtime"):
        count = sum(r[name] for r in rows)
        if count:
            failures.append(f"{count} snapshots/transactions: {name}")
    return failures


def table(report: dict[str, Any]) -> str:
    """The per-kind table, as text."""
    header = [
        "kind",
        "injected",
        *COUNTS,
        "unavail p50 s",
        "unavail max s",
        "others p50 s",
        "others max s",
    ]
    lines = [header]
    for row in report["kinds"]:
        lines.append(
            [
                row["kind"],
                str(row["injected"]),
                *(str(row[name]) for name in COUNTS),
                f"{row['unavailable p50 s']:.1f}",
                f"{row['unavailable max s']:.1f}",
                *(
                    "-" if row.get(name) is None else f"{row[name]:.1f}"
                    for name in ("others p50 s", "others max s")
                ),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines
    )


# ------------------------------------------------------------------------------ running


@dataclass
class Config:
    faults: int = 10
    kinds: list[str] = field(default_factory=lambda: list(KINDS))
    seed: int = 1
    members: int = 3
    failover_after: float = 2.0
    clients: int = 4
    warmup: float = 3.0  # load before the first fault
    calm: float = 1.0  # load between a fault's settling and the next fault
    settle_timeout: float = 20.0
    fsync: bool = True
    slow_pair: tuple[int, int] = (0, 1)


def run(config: Config, data: Path, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Starts the hosts and members, runs the load and the faults, checks; the report."""
    unknown_kinds = set(config.kinds) - set(KINDS)
    if unknown_kinds:
        raise ValueError(f"unknown fault kinds: {sorted(unknown_kinds)}")
    rng = random.Random(config.seed)
    history, faults = History(), []
    slow = config.slow_pair if NEEDS_SLOW_PAIR & set(config.kinds) else None
    cluster = HostCluster(
        data,
        members=config.members,
        partitions=config.members,
        failover_after=config.failover_after,
        fsync=config.fsync,
        slow_pair=slow,
    )
    with cluster:
        say(f"members at {[cluster.address(m) for m in range(config.members)]}; data in {data}")
        with Client(cluster.client_address, timeout=30) as client:
            transfers.create(client, ACCOUNTS, LEDGER, ACCOUNT_COUNT)
            client.sql(VIEW_SQL)
            client.sql(f"CREATE TABLE {PROBES} (id INT PRIMARY KEY, n INT NOT NULL)")
            with client.transaction() as tx:
                for key in range(PROBE_KEYS):
                    tx.insert(PROBES, {"id": key, "n": 0})
        workload = Workload(cluster.client_address, history, config.clients, config.seed).start()
        nemesis = Nemesis(cluster, history, rng).start()
        try:
            nemesis.wait_settled(config.settle_timeout)
            time.sleep(config.warmup)
            try:
                inject_faults(config, nemesis, history, rng, faults, say)
            except KeyboardInterrupt:  # a long run stopped early is still checked and reported
                say(f"interrupted after {len(faults)} faults: checking what ran")
                if faults and faults[-1].settled is None:
                    faults[-1].settled = nemesis.wait_settled(config.settle_timeout)
            nemesis.heal_all()
            end = time.monotonic()
            nemesis.wait_settled(config.settle_timeout)
            workload.join()
            stuck: list[str] = []
            try:  # members are still restarted if they exit
                final = final_state(cluster.client_address)
            except errors.AggviewError as exc:
                # A liveness failure: said with the members' last words, then every member is
                # killed and restarted (what an operator would do) so that safety is still
                # checked, on what survived a kill -9 besides.
                stuck.append(f"no snapshot within 90 s after the last fault ({exc})")
                for at, member, line in read_logs(cluster)[-40:]:
                    say(f"  m{member} {time.strftime('%H:%M:%S', time.localtime(at))} {line}")
                say(f"liveness: {stuck[0]}; restarting every member")
                for m in range(cluster.members):
                    nemesis.kill(m)
                for m in range(cluster.members):
                    nemesis.restart(m)
                final = final_state(cluster.client_address)
        finally:
            workload.join()
            nemesis.heal_all()
            nemesis.close()
        logs = read_logs(cluster)
    report = analyse(history, faults, final, logs, end)
    report["config"] = asdict(config)
    report["log_lines"] = [
        (round(at - (faults[0].start if faults else 0), 2), m, line) for at, m, line in logs
    ]
    zero = faults[0].start if faults else 0.0
    report["calls"] = [  # the per-transfer trace, times from the first fault
        (round(start - zero, 3), round(stop - zero, 3), outcome, member)
        for start, stop, outcome, member in history.calls
    ]
    report["safety_failures"] = safety_failures(report)
    report["liveness_failures"] = stuck
    return report


def inject_faults(
    config: Config,
    nemesis: Nemesis,
    history: History,
    rng: random.Random,
    faults: list[Fault],
    say: Callable[[str], None],
) -> None:
    """The scheduled faults one after the other, each healed and waited out; each goes into
    ``faults`` as it starts (an interrupted run keeps those that ran)."""
    for n, kind in enumerate(schedule(config.kinds, config.faults, rng)):
        fault = Fault(kind, time.monotonic())
        faults.append(fault)
        try:
            fault.detail = nemesis.inject(kind)
        finally:
            nemesis.heal_all()
            fault.healed = time.monotonic()
        fault.settled = nemesis.wait_settled(config.settle_timeout)
        settled = "not settled" if fault.settled is None else "settled"
        with history.lock:
            acked = len(history.commits)
        say(
            f"fault {n + 1}/{config.faults}: {kind}: {fault.detail}; {settled}; "
            f"{acked} acknowledged so far"
        )
        time.sleep(config.calm)


@contextlib.contextmanager
def data_dir(path: str | None) -> Iterator[Path]:
    if path:
        Path(path).mkdir(parents=True, exist_ok=True)
        yield Path(path)
    else:
        with tempfile.TemporaryDirectory(prefix="nemesis-") as temp:
            yield Path(temp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=len(KINDS), help="faults to inject")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--failover-after", type=float, default=2.0)
    parser.add_argument("--clients", type=int, default=4, help="transfer threads")
    parser.add_argument("--settle-timeout", type=float, default=20.0)
    parser.add_argument("--slow-pair", type=int, nargs=2, default=[0, 1])
    parser.add_argument("--no-fsync", action="store_true")
    parser.add_argument("--data", help="keep the members' data and logs here (default: temp)")
    parser.add_argument("--json", default="nemesis.json", help="where the full result goes")
    args = parser.parse_args(argv)
    why = unavailable()
    if why:
        print(f"nemesis: {why}", file=sys.stderr)
        return 2
    config = Config(
        faults=args.faults,
        kinds=args.kinds,
        seed=args.seed,
        members=args.members,
        failover_after=args.failover_after,
        clients=args.clients,
        settle_timeout=args.settle_timeout,
        fsync=not args.no_fsync,
        slow_pair=(args.slow_pair[0], args.slow_pair[1]),
    )
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # cleanup runs on SIGTERM too
    with data_dir(args.data) as data:
        report = run(config, data, say=lambda text: print(text, file=sys.stderr, flush=True))
    Path(args.json).write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(table(report))
    final = report["final"]
    print(
        f"acknowledged {final['acknowledged']}, unknown {final['unknown']} "
        f"({final['unknown_resolved']}), scans {final['scans']}"
    )
    for failure in report["safety_failures"]:
        print(f"SAFETY: {failure}")
    if report["safety_failures"]:
        print("member log lines around the first violation:", *final["evidence"], sep="\n")
    for failure in report["liveness_failures"]:
        print(f"LIVENESS: {failure} (every member was restarted to read the final state)")
    return 1 if report["safety_failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
