"""The runtime's nodes and switches in one process, on a virtual clock, over the seeds' network
model: every message arrives, and messages between one pair of nodes arrive in the order they
were sent (seed 000 §2). Between pairs, delays are what the ``Network`` says: the same for all
(nothing overtakes anything), random per message from a seed (reordering across pairs), plus
holds of chosen messages, so that later FETCHes overtake an earlier PUT on cue.

Seeded and deterministic: a failing schedule reproduces from its seed.
"""

from __future__ import annotations

import heapq
import itertools
import pickle
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cumulus.m3.interpreter import Interpreter
from cumulus.m3.program import Program
from cumulus.runtime.messages import Key, Message
from cumulus.runtime.node import Node
from cumulus.runtime.placement import Placement
from cumulus.runtime.switch import Switch

Address = tuple[str, int]  # ("switch", i) or ("node", i)
Update = tuple[str, str, Sequence[Any] | Mapping[str, Any]]  # (sign, relation, row)
Hold = Callable[[Address, Address, Message], float]


@dataclass
class Network:
    seed: int | None = None  # None: every message takes `base`; else uniform in base..base+jitter
    base: float = 1.0
    jitter: float = 20.0
    hold: Hold | None = None  # extra delay for chosen messages (src, dst, message) -> seconds

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def delay(self, src: Address, dst: Address, message: Message) -> float:
        delay = self.base
        if self.seed is not None:
            delay += self._rng.uniform(0, self.jitter)
        if self.hold is not None:
            delay += self.hold(src, dst, message)
        return delay


@dataclass
class Report:
    updates: int = 0
    messages: Counter[str] = field(default_factory=Counter)
    corrective: int = 0
    max_depth: int = 0
    finished_at: float = 0.0


class Simulator:
    def __init__(
        self,
        program: Program,
        *,
        nodes: int = 2,
        switches: int = 1,
        network: Network | None = None,
        gap: float = 1.0,
        measure_bytes: bool = False,
    ) -> None:
        if switches < 1:
            raise ValueError("a Cumulus runtime needs at least one switch")
        self.placement = Placement(program, nodes)
        self.nodes = [Node(self.placement, i) for i in range(nodes)]
        self.switches = [Switch(self.placement, i) for i in range(switches)]
        self.network = network or Network()
        self.gap = gap  # virtual seconds between two updates entering the system
        self.now = 0.0
        self._queue: list[tuple[float, int, Address, Address, Any]] = []
        self._seq = itertools.count()
        self._last: dict[tuple[Address, Address], float] = {}
        self._fed = 0
        self._measure_bytes = measure_bytes
        self.bytes: Counter[str] = Counter()
        self._entered: dict[Any, float] = {}  # timestamp -> virtual time it entered
        self._done: dict[Any, float] = {}  # timestamp -> virtual time of its last write
        self.report = Report()

    def _send(self, src: Address, dst: Address, message: Message) -> None:
        at = self.now + self.network.delay(src, dst, message)
        at = max(at, self._last.get((src, dst), 0.0) + 1e-9)  # per-pair FIFO
        self._last[(src, dst)] = at
        kind = type(message).__name__
        self.report.messages[kind] += 1
        if self._measure_bytes:
            self.bytes[kind] += len(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        heapq.heappush(self._queue, (at, next(self._seq), src, dst, message))

    def run(self, stream: Iterable[Update]) -> Report:
        """Feeds the stream and runs until quiescence: no message left anywhere."""
        self.feed(stream)
        return self.finish()

    def check(self, update: Update) -> None:
        """Raises, naming the row, if the update does not fit the program (nothing changes)."""
        sign, relation, row = update
        self.switches[0].check(sign, relation, row)

    def feed(self, stream: Iterable[Update]) -> None:
        """Update i goes to switch i mod K, one every ``gap`` of virtual time."""
        for sign, relation, row in stream:
            self._until(self._fed * self.gap)
            switch = self.switches[self._fed % len(self.switches)]
            ts, messages = switch.update(sign, relation, row)
            self._fed += 1
            self.report.updates += 1
            self._entered[ts] = self.now
            for node, message in messages:
                self._send(("switch", switch.number), ("node", node), message)

    def finish(self) -> Report:
        self._until(float("inf"))
        self.report.corrective = sum(n.stats.corrective_sent for n in self.nodes)
        self.report.max_depth = max((n.stats.max_depth for n in self.nodes), default=0)
        self.report.finished_at = self.now
        return self.report

    def _until(self, time: float) -> None:
        while self._queue and self._queue[0][0] <= time:
            at, _, _, dst, message = heapq.heappop(self._queue)
            self.now = at
            node = self.nodes[dst[1]]
            for target, reply in node.handle(message):
                self._send(("node", node.number), ("node", target), reply)
            for ts in node.completed:
                self._done[ts] = at
            node.completed.clear()
        if time != float("inf"):
            self.now = max(self.now, time)

    def latencies(self) -> list[float]:
        """Virtual time from each update's entry to its last write (updates that wrote)."""
        return [self._done[ts] - at for ts, at in self._entered.items() if ts in self._done]

    def log_sizes(self) -> dict[str, int]:
        return {
            "write_log_entries": sum(
                len(h) for n in self.nodes for m in n.maps.values() for h in m.history.values()
            ),
            "read_log_entries": sum(len(log) for n in self.nodes for log in n.reads.values()),
            "operations": sum(len(n.operations) for n in self.nodes),
        }

    def as_interpreter(self) -> Interpreter:
        """An interpreter holding the gathered maps, for reading views the way it reads them."""
        reader = Interpreter(self.placement.program)
        for name, entries in self.maps().items():
            store = reader.maps[name]
            for key, value in entries.items():
                store.add(key, value)
        return reader

    def maps(self) -> dict[str, dict[Key, Any]]:
        """Every program map, gathered from the nodes (newest values)."""
        out: dict[str, dict[Key, Any]] = {m.name: {} for m in self.placement.program.maps}
        for node in self.nodes:
            for name in out:
                out[name].update(node.entries(name))
        return out
