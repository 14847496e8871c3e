"""The runtime's nodes and switches in one process, on a virtual clock, over the seeds' network
model: every message arrives, and messages between one pair of nodes arrive in the order they
were sent (seed 000 §2). Between pairs, delays are what the ``Network`` says: the same for all
(nothing overtakes anything), random per message from a seed (reordering across pairs), plus
holds of chosen messages, so that later FETCHes overtake an earlier PUT on cue.

Epochs end every ``epoch_every`` virtual seconds (and once more at the end of a run); each
commit is recorded with its cut and times, and ``on_commit`` may read the snapshot right then.

``batch``: a switch holds up to that many updates and sends each node their messages as one
``Batch`` (sooner at an epoch end, at the end of a ``feed`` or ``feed_stamped``), and a node's
messages from one ``handle`` go as one ``Batch`` per destination: one delay, one delivery,
one round of the node's progress for them all. 1 (the default): every message on its own.

Seeded and deterministic: a failing schedule reproduces from its seed.

``stamped``: switches of their own, as a cluster's coordinating members run them: the caller
stamps each update (``feed_stamped``, a member's commit timestamps), opens each epoch at a cut
of its choosing (``open_at``) and closes it switch by switch (``close_switch``).
"""

from __future__ import annotations

import heapq
import itertools
import pickle
import random
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cumulus.m3.interpreter import Interpreter
from cumulus.m3.program import Program
from cumulus.runtime.epochs import EpochCoordinator, Sends
from cumulus.runtime.messages import (
    COORDINATOR,
    Batch,
    EpochCommit,
    EpochEnd,
    Key,
    Message,
    batched,
)
from cumulus.runtime.node import Node, ProtocolError
from cumulus.runtime.placement import Placement
from cumulus.runtime.switch import Clock, Switch

FEED_BATCH = 256  # updates per batch where a cluster feeds the simulator (no virtual timing)
Address = tuple[str, int]  # ("switch", i), ("node", i) or ("coordinator", 0)
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
    # per committed epoch: (cut, virtual time it began, time it committed, newest counter then)
    epochs: list[tuple[int, float, float, int]] = field(default_factory=list)
    peak_logs: Counter[str] = field(default_factory=Counter)  # largest log sizes seen at a commit


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
        mode: str = "speculative",
        epoch_every: float | None = None,
        log_limit: int | None = None,
        on_commit: Callable[[int], None] | None = None,
        stamped: bool = False,
        batch: int = 1,
    ) -> None:
        if switches < 1:
            raise ValueError("a Cumulus runtime needs at least one switch")
        if batch < 1:
            raise ValueError("a batch holds at least one update")
        self.program = program
        self.placement = Placement(program, nodes)
        self.external = stamped  # switches of their own, stamped by the caller
        self.nodes = [
            Node(
                self.placement,
                i,
                switches=switches,
                mode=mode,
                log_limit=log_limit,
                ordered=True,
                per_switch=stamped,
            )
            for i in range(nodes)
        ]
        # conservative: one clock counts every PUT in one order, unless each switch stamps
        # its own (then each counts its own: ``Node.per_switch``)
        shared = Clock() if mode == "conservative" and not stamped else None
        self.switches = [Switch(self.placement, i, shared) for i in range(switches)]
        self.epochs = EpochCoordinator(self.switches, nodes, external=stamped)
        self.epoch_every = epoch_every
        self.on_commit = on_commit
        self._next_epoch = epoch_every if epoch_every is not None else float("inf")
        self._began = 0.0
        self.network = network or Network()
        self.gap = gap  # virtual seconds between two updates entering the system
        self.now = 0.0
        self._queue: list[tuple[float, int, Address, Address, Any]] = []
        self._seq = itertools.count()
        self._last: dict[tuple[Address, Address], float] = {}
        self._fed = 0
        self._entry = 0.0  # virtual time the next update enters
        self.stamped: list[Any] = []  # each fed update's timestamp, in the order fed
        self._measure_bytes = measure_bytes
        self.bytes: Counter[str] = Counter()
        self.batch = batch
        # per switch: its messages not sent yet (node, message), and how many updates they are
        self._held: list[list[tuple[int, Message]]] = [[] for _ in range(switches)]
        self._held_updates = [0] * switches
        self._entered: dict[Any, float] = {}  # timestamp -> virtual time it entered
        self._done: dict[Any, float] = {}  # timestamp -> virtual time of its last write
        self.report = Report()

    def _send(self, src: Address, dst: Address, message: Message) -> None:
        at = self.now + self.network.delay(src, dst, message)
        at = max(at, self._last.get((src, dst), 0.0) + 1e-9)  # per-pair FIFO
        self._last[(src, dst)] = at
        # a batch counts as one Batch and each message it carries by its own type
        inner = message.messages if type(message) is Batch else (message,)
        if len(inner) > 1:
            self.report.messages["Batch"] += 1
        for one in inner:
            self.report.messages[type(one).__name__] += 1
        if self._measure_bytes:
            for one in inner:
                size = len(pickle.dumps(one, protocol=pickle.HIGHEST_PROTOCOL))
                self.bytes[type(one).__name__] += size
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
        """Update i goes to switch i mod K, one every ``gap`` of virtual time (after a
        ``finish``, counting from its end)."""
        for sign, relation, row in stream:
            self._until(self._entry)
            self._entry += self.gap
            if self.now >= self._next_epoch:
                self._next_epoch = self.now + (self.epoch_every or 0.0)
                self._flush_all()  # a switch's EPOCH END goes after its updates
                self._epoch(self.epochs.begin())
            switch = self.switches[self._fed % len(self.switches)]
            ts, messages = switch.update(sign, relation, row)
            self.stamped.append(ts)
            self._fed += 1
            self.report.updates += 1
            self._entered[ts] = self.now
            self._hold(switch.number, messages)
        self._flush_all()

    def feed_stamped(
        self, switch: int, stream: Iterable[tuple[int, Update]], checked: bool = False
    ) -> None:
        """``stamped``: updates of switch ``switch`` with their timestamp counters (rising),
        one every ``gap`` of virtual time; ``checked``: rows as ``Switch.update_at`` takes
        them unchecked."""
        for counter, (sign, relation, row) in stream:
            self._until(self._entry)
            self._entry += self.gap
            ts, messages = self.switches[switch].update_at(counter, sign, relation, row, checked)
            self.stamped.append(ts)
            self._fed += 1
            self.report.updates += 1
            self._entered[ts] = self.now
            self._hold(switch, messages)
        self._flush(switch)

    def _hold(self, switch: int, messages: list[tuple[int, Message]]) -> None:
        """An update's messages, sent once the switch holds ``batch`` updates."""
        self._held[switch].extend(messages)
        self._held_updates[switch] += 1
        if self._held_updates[switch] >= self.batch:
            self._flush(switch)

    def _flush(self, switch: int) -> None:
        """Sends what the switch holds: one message per node, in the order stamped."""
        held, self._held[switch], self._held_updates[switch] = self._held[switch], [], 0
        by_node: dict[int, list[Message]] = {}
        for node, message in held:
            by_node.setdefault(node, []).append(message)
        for node, messages in by_node.items():
            self._send(("switch", switch), ("node", node), batched(messages))

    def _flush_all(self) -> None:
        for switch in range(len(self.switches)):
            if self._held[switch]:
                self._flush(switch)

    def open_at(self, cut: int) -> None:
        """``stamped``: the next epoch ends at ``cut``; each switch closes it (``close_switch``)."""
        self.epochs.open_at(cut)
        self._began = self.now

    def close_switch(self, switch: int, cut: int) -> None:
        """``stamped``: switch ``switch`` dispatched everything of its own up to ``cut``."""
        self._flush(switch)
        self._epoch(self.epochs.close(switch, cut))

    def finish(self) -> Report:
        """Runs to quiescence and commits a last epoch holding every update (``stamped``:
        the epoch opened and closed, if every switch closed it)."""
        self._until(float("inf"))
        while not self.external and self.epochs.committed < self.epochs.newest():
            self._epoch(self.epochs.begin())
            self._until(float("inf"))
        self.report.corrective = sum(n.stats.corrective_sent for n in self.nodes)
        self.report.max_depth = max((n.stats.max_depth for n in self.nodes), default=0)
        self.report.finished_at = self.now
        self._entry = max(self._entry, self.now)  # a later feed goes on from here, not at once
        return self.report

    def _epoch(self, sends: Sends) -> None:
        for sender, _, message in sends:  # an EPOCH END goes after the switch's updates
            if isinstance(message, EpochEnd) and self._held[sender]:
                self._flush(sender)
        for sender, node, message in sends:
            if isinstance(message, EpochCommit):
                cut = message.cut
                if not self.report.epochs or self.report.epochs[-1][0] != cut:
                    newest = self.epochs.newest()
                    self.report.epochs.append((cut, self._began, self.now, newest))
                    for name, size in self.log_sizes().items():  # a log kept empty shows 0
                        self.report.peak_logs[name] = max(self.report.peak_logs[name], size)
                    if self.on_commit is not None:
                        self.on_commit(cut)
            else:
                self._began = self.now
            src = ("coordinator", 0) if sender == COORDINATOR else ("switch", sender)
            self._send(src, ("node", node), message)

    def deliver(self) -> None:
        """Delivers every message in flight (no epoch begins here): the nodes come to rest
        with every update fed so far, and their newest values hold them all."""
        self._until(float("inf"))
        self._entry = max(self._entry, self.now)

    def _until(self, time: float) -> None:
        while self._queue and self._queue[0][0] <= time:
            at, _, _, dst, message = heapq.heappop(self._queue)
            self.now = at
            if dst[0] == "coordinator":
                self._epoch(self.epochs.handle(message))
                continue
            node = self.nodes[dst[1]]
            src = ("node", node.number)
            replies = node.handle(message)
            if self.batch == 1:
                for target, reply in replies:
                    if target == COORDINATOR:
                        self._send(src, ("coordinator", 0), reply)
                    else:
                        self._send(src, ("node", target), reply)
            else:  # one message per destination
                by_target: dict[int, list[Message]] = {}
                for target, reply in replies:
                    by_target.setdefault(target, []).append(reply)
                for target, messages in by_target.items():
                    if target == COORDINATOR:
                        for reply in messages:
                            self._send(src, ("coordinator", 0), reply)
                    else:
                        self._send(src, ("node", target), batched(messages))
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
            "operations": sum(n.kept_operations for n in self.nodes),
        }

    def preload(self, maps: Mapping[str, Mapping[Key, Any]]) -> None:
        """Maps computed before any update (over a snapshot), each entry to the node that
        holds its key."""
        if self._fed:
            raise ProtocolError("preload after updates: the maps would miss them")
        for name, entries in maps.items():
            for number, part in self.placement.parts(name, entries).items():
                self.nodes[number].preload(name, part)

    def maps(self, names: Collection[str] | None = None) -> dict[str, dict[Key, Any]]:
        """Every program map (or those ``names``), gathered from the nodes (newest values:
        tentative)."""
        out: dict[str, dict[Key, Any]] = {
            m.name: {} for m in self.placement.program.maps if names is None or m.name in names
        }
        for name in out:
            out[name] = self.placement.gather(
                name, [self.nodes[n].entries(name) for n in self.placement.read_from(name)]
            )
        return out

    def snapshot(
        self, cut: int | None = None, names: Collection[str] | None = None
    ) -> tuple[int, dict[str, dict[Key, Any]]]:
        """Every program map (or those ``names``) at a committed cut (default: the last):
        exact, one timestamp."""
        cut = self.epochs.committed if cut is None else cut
        out: dict[str, dict[Key, Any]] = {
            m.name: {} for m in self.placement.program.maps if names is None or m.name in names
        }
        for name in out:
            out[name] = self.placement.gather(
                name, [self.nodes[n].snapshot(name, cut) for n in self.placement.read_from(name)]
            )
        return cut, out


def holding(
    program: Program, maps: Mapping[str, Mapping[Key, Any]], reader: Interpreter | None = None
) -> Interpreter:
    """An interpreter holding the given maps, to read views the way it reads them: ``reader``
    emptied and filled again if given (making one compiles every trigger: about a millisecond
    per statement), else a new one."""
    if reader is None:
        reader = Interpreter(program)
    else:
        for store in reader.maps.values():  # in place: its compiled reads hold these dicts
            store.data.clear()
            for index in store.indexes.values():
                index.clear()
    for name, entries in maps.items():
        for key, value in entries.items():
            reader.maps[name].add(key, value)
    return reader
