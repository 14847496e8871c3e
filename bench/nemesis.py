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
the fault's start to the next fault's; and "recovered s", the time from the heal until the
transfers' rate is back (bench.nemesis_checker.recovered), for which the next fault waits at
least ``--after-heal`` seconds from the heal.

    python -m bench.nemesis --faults 20 --kinds leader-cut follower-cut --json nemesis.json

Needs root and ``ip netns``; the result table goes to stdout, everything to the JSON file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aggclient import Client
from aggview import errors
from bench.nemesis_checker import analyse, final_state, read_logs, safety_failures, table
from bench.nemesis_faults import KINDS, NEEDS_SLOW_PAIR, Fault, Nemesis, schedule
from bench.nemesis_workload import (
    ACCOUNT_COUNT,
    ACCOUNTS,
    LEDGER,
    PROBE_KEYS,
    PROBES,
    VIEW_SQL,
    History,
    Workload,
)
from bench.netns import HostCluster, unavailable
from loadgen import transfers


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
    # the least time from a heal to the next fault: the checker's "recovered s" can only see
    # a recovery that ends before the next fault (up to this less its 1 s window)
    after_heal: float = 8.0
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
            calm_from = time.monotonic()
            time.sleep(config.warmup)
            try:
                inject_faults(config, nemesis, history, rng, faults, say, calm_from)
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
    report["probe_calls"] = [  # the per-probe trace: key, start, end, outcome, home, sent to
        (key, round(start - zero, 3), round(stop - zero, 3), outcome, home, member)
        for key, start, stop, outcome, home, member in history.probe_calls
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
    calm_from: float,
) -> None:
    """The scheduled faults one after the other, each healed and waited out, the next not
    before ``config.after_heal`` from the heal (the recovery is measured in between); each goes
    into ``faults`` as it starts (an interrupted run keeps those that ran). ``calm_from``: when
    the load began before the first."""
    for n, kind in enumerate(schedule(config.kinds, config.faults, rng)):
        fault = Fault(kind, time.monotonic(), calm_from=calm_from)
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
        calm_from = time.monotonic()
        time.sleep(max(config.calm, fault.healed + config.after_heal - calm_from))


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
    parser.add_argument(
        "--after-heal",
        type=float,
        default=Config.after_heal,
        help="least seconds from a heal to the next fault (the recovery is measured within)",
    )
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
        after_heal=args.after_heal,
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
