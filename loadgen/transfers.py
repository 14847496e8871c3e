"""Conditional transfers between accounts, with a ledger: the invariant workload.

Every transfer moves an amount from one account to another only if the source can pay, and
records itself in a ledger row in the same transaction. So at every snapshot the total of the
balances is constant, no balance is negative, and each balance equals its initial amount plus
what the ledger says it received minus what it paid: any partial or lost transaction shows.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from aggclient import Client, ConditionFailed
from aggview import errors

INITIAL = 100


def create(client: Client, accounts: str, ledger: str, count: int) -> None:
    client.sql(f"CREATE TABLE {accounts} (id INT PRIMARY KEY, balance INT NOT NULL)")
    client.sql(
        f"CREATE TABLE {ledger} (id TEXT PRIMARY KEY, src INT NOT NULL, dst INT NOT NULL, "
        "amount INT NOT NULL)"
    )
    with client.transaction() as tx:
        for i in range(count):
            tx.insert(accounts, {"id": i, "balance": INITIAL})


def transfer(
    client: Client, accounts: str, ledger: str, src: int, dst: int, amount: int, ref: str
) -> int:
    with client.transaction() as tx:
        tx.add(accounts, {"id": src}, {"balance": -amount}, require={"balance": (">=", amount)})
        tx.add(accounts, {"id": dst}, {"balance": amount})
        tx.insert(ledger, {"id": ref, "src": src, "dst": dst, "amount": amount})
    assert tx.timestamp is not None
    return tx.timestamp


@dataclass
class Outcomes:
    """What the clients saw: acknowledged transfers, refusals, and unknown outcomes."""

    committed: list[str] = field(default_factory=list)
    condition_failed: int = 0
    unknown: int = 0  # the call failed (server down): it may or may not have committed
    retries: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    messages: list[str] = field(default_factory=list)  # the first few errors' own words
    lock: threading.Lock = field(default_factory=threading.Lock)


def run_clients(
    address: str,
    accounts: str,
    ledger: str,
    count: int,
    *,
    clients: int,
    stop: threading.Event,
    outcomes: Outcomes,
    seed: int = 0,
    max_transfers: int | None = None,
) -> list[threading.Thread]:
    """Starts ``clients`` threads doing random transfers until ``stop`` is set."""

    def work(worker: int) -> None:
        rng = random.Random(seed * 1000 + worker)
        done = 0
        with Client(address, timeout=20) as client:
            while not stop.is_set() and (max_transfers is None or done < max_transfers):
                done += 1
                src, dst = rng.sample(range(count), 2)
                ref = uuid.UUID(int=rng.getrandbits(128)).hex
                try:
                    transfer(client, accounts, ledger, src, dst, rng.randint(1, 60), ref)
                    with outcomes.lock:
                        outcomes.committed.append(ref)
                except ConditionFailed:
                    with outcomes.lock:
                        outcomes.condition_failed += 1
                except errors.AggviewError as exc:
                    with outcomes.lock:
                        outcomes.unknown += 1
                        outcomes.errors[type(exc).__name__] += 1
                        if len(outcomes.messages) < 10:
                            outcomes.messages.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(0.05)
            with outcomes.lock:
                outcomes.retries += client.retries

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    return threads


@contextlib.contextmanager
def running(
    address: str,
    accounts: str,
    ledger: str,
    count: int,
    *,
    clients: int,
    seed: int = 0,
    join_timeout: float | None = None,
) -> Iterator[Outcomes]:
    """``clients`` threads doing random transfers while the block runs; yields what they see.
    On leaving, however the block ends, the clients stop and are joined (each waited for up to
    ``join_timeout`` seconds), so no caller leaves them running."""
    stop = threading.Event()
    outcomes = Outcomes()
    workers = run_clients(
        address, accounts, ledger, count, clients=clients, stop=stop, outcomes=outcomes, seed=seed
    )
    try:
        yield outcomes
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=join_timeout)


def check(client: Client, accounts: str, ledger: str, count: int, committed: list[str]) -> None:
    """Raises AssertionError if any invariant is broken."""
    balances = {row["id"]: row["balance"] for row in client.scan(accounts)}
    entries = {row["id"]: row for row in client.scan(ledger)}
    assert len(balances) == count, f"accounts missing: {count - len(balances)}"
    missing = [ref for ref in committed if ref not in entries]
    assert not missing, f"{len(missing)} acknowledged transfers lost, e.g. {missing[:3]}"
    expected = {i: INITIAL for i in range(count)}
    for entry in entries.values():
        expected[entry["src"]] -= entry["amount"]
        expected[entry["dst"]] += entry["amount"]
    assert balances == expected, "balances disagree with the ledger: a partial transaction"
    assert sum(balances.values()) == INITIAL * count
    assert min(balances.values()) >= 0
