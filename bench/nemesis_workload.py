"""The nemesis's workload: transfer, snapshot-scan and probe threads against the cluster, and
the History of what clients saw, which the checker (bench.nemesis_checker) judges.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aggclient import Client, ConditionFailed
from aggview import errors
from loadgen import transfers

ACCOUNTS, LEDGER, VIEW = "accounts", "ledger", "moved"
ACCOUNT_COUNT = 30
# One-row writes, one thread per key, each key on one partition: while a member is cut off,
# the others' keys say whether the rest of the cluster kept committing its own partitions'
# transactions (the transfers touch three or four partitions, so nearly all wait for the cut one).
PROBES, PROBE_KEYS, PROBE_EVERY = "probes", 6, 0.05
VIEW_SQL = (
    f"CREATE MATERIALIZED VIEW {VIEW} WITH (refresh = 'sync') AS SELECT dst, COUNT(*) AS n, "
    f"SUM(amount) AS total FROM {LEDGER} GROUP BY dst"
)


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
    # every probe write tried: (key, start, end, outcome: "ok" or the error's class, its home
    # member, the member the client sent it to): where a gap in the others' writes went
    probe_calls: list[tuple[int, float, float, str, int | None, int | None]] = field(
        default_factory=list
    )
    lock: threading.Lock = field(default_factory=threading.Lock)


def recompute(
    ledger: list[dict[str, Any]],
) -> tuple[dict[int, int], dict[int, tuple[int, int]]]:
    """What the ledger says: each account's balance, and the view's (count, total) per
    destination; the checks compare what the cluster holds with these."""
    expected = {i: transfers.INITIAL for i in range(ACCOUNT_COUNT)}
    groups: dict[int, tuple[int, int]] = {}
    for entry in ledger:
        expected[entry["src"]] -= entry["amount"]
        expected[entry["dst"]] += entry["amount"]
        n, total = groups.get(entry["dst"], (0, 0))
        groups[entry["dst"]] = (n + 1, total + entry["amount"])
    return expected, groups


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
    expected, groups = recompute(ledger)
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
        row (its home, as the client's routing places it; not the member it went to, which
        is another while the client routes around a silent one)."""
        with Client(self.address, timeout=10) as client:
            while not self.stop.wait(PROBE_EVERY):
                start, outcome = time.monotonic(), "ok"
                try:
                    with client.transaction() as tx:
                        tx.add(PROBES, {"id": key}, {"n": 1})
                except errors.AggviewError as exc:
                    outcome = type(exc).__name__
                # the member hosting the row, not the one the client routes to while it
                # avoids that member (the leader then): a cut member's keys counted as
                # the others' after a previous fault's avoidance
                home = client._routing()._hosting_most(tx.operations)
                end = time.monotonic()
                with self.history.lock:
                    if outcome == "ok":
                        self.history.probes.append((key, end, home))
                    self.history.probe_calls.append(
                        (key, start, end, outcome, home, client.last_member)
                    )

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
