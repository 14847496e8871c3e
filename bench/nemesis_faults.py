"""The nemesis's fault schedule and its injector: the kinds of fault (bench.nemesis lists what
each does), the order they come in, and the supervisor that restarts members that exit.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from aggview.processes import paused
from bench.nemesis_workload import History
from bench.netns import HostCluster
from coordinator import leadership
from ltm.store import open_store, ownership
from ltm.store.sqlite import writer_lock

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


@dataclass
class Fault:
    kind: str
    start: float
    healed: float = 0.0
    settled: float | None = None  # when the cluster was whole again (None: not in time)
    detail: str = ""
    # when the calm before it began: the previous fault's settling (or the wait for it given
    # up), the warmup's start for the first; the checker's pre-fault rate is measured after it
    calm_from: float | None = None


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
