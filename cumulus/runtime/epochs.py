"""The switches' side of epochs (seed 000 §3.4), as a state machine.

``begin`` picks the cut: the highest timestamp counter any switch has stamped. Every switch
moves its counter up to it and sends EPOCH END to every node after its own updates, so a node
that has heard from every switch has every update up to the cut. Nodes answer EPOCH READY when
their maps are final up to it; when all have, EPOCH COMMIT goes out and the cut is the newest
consistent snapshot. One epoch is open at a time; an EPOCH END REQUEST (a node's logs grew)
starts one at once, or right after the open one commits.

Switches of their own (``external``: each a coordinating member's, stamping its commits'
timestamps): the caller picks the cut (``open_at``) and each switch closes it when its member
says everything it committed up to the cut is dispatched (``close``); the coordinator then
never closes a switch by itself, so an END REQUEST only marks that an epoch is wanted.
"""

from __future__ import annotations

from collections.abc import Sequence

from cumulus.runtime.messages import (
    COORDINATOR,
    EpochCommit,
    EpochEndRequest,
    EpochReady,
    Message,
)
from cumulus.runtime.switch import Switch

# (sender, node, message): the sender is a switch number, or COORDINATOR for commits
Sends = list[tuple[int, int, Message]]


class EpochCoordinator:
    def __init__(self, switches: Sequence[Switch], nodes: int, external: bool = False) -> None:
        self.switches = list(switches)
        self.external = external
        self.nodes = nodes
        self.committed = 0
        self.open: int | None = None  # the cut being closed
        self.requested = False
        self._ready: set[int] = set()

    def newest(self) -> int:
        return max(s.clock.counter for s in self.switches)

    def begin(self) -> Sends:
        """Closes an epoch, unless one is open or nothing was stamped since the last."""
        if self.open is not None or self.external:
            self.requested = True
            return []
        cut = self.newest()
        if cut <= self.committed:
            return []
        self.open, self._ready, self.requested = cut, set(), False
        return [(s.number, node, end) for s in self.switches for node, end in s.close(cut)]

    def open_at(self, cut: int) -> None:
        """Opens the epoch ending at ``cut`` (external switches): nodes get each switch's EPOCH
        END from ``close``."""
        if self.open is not None:
            raise ValueError(f"epoch {self.open} is still open; cannot open {cut}")
        if cut <= self.committed:
            raise ValueError(f"cut {cut} is not above the committed {self.committed}")
        self.open, self._ready, self.requested = cut, set(), False

    def close(self, switch: int, cut: int) -> Sends:
        """Switch ``switch`` has dispatched everything of its own up to ``cut``."""
        if cut != self.open:
            raise ValueError(f"switch {switch} closed {cut}, the open epoch is {self.open}")
        return [(switch, node, end) for node, end in self.switches[switch].close(cut)]

    def handle(self, message: Message) -> Sends:
        if isinstance(message, EpochEndRequest):
            return self.begin()
        if not isinstance(message, EpochReady) or message.cut != self.open:
            raise TypeError(f"the epoch coordinator cannot handle {message!r}")
        self._ready.add(message.source)
        if len(self._ready) < self.nodes:
            return []
        self.committed, self.open = message.cut, None
        sends: Sends = [(COORDINATOR, node, EpochCommit(message.cut)) for node in range(self.nodes)]
        if self.requested and not self.external:
            sends += self.begin()
        return sends
