"""What the switch and the DW nodes say to each other (seed 000 §3.2, seed 001 Trigger
Dispatch), as plain values: one implementation of the nodes runs on every host.

Messages are coalesced per (source, destination, timestamp) and carry trigger and statement
numbers, never code: every node holds the program.

- ``Dispatch`` (switch -> node): the update's PUTs for the statements whose target partition the
  node holds (each with the number of PUSHes to wait for) and its FETCHes for the statements
  whose right-hand maps it holds (which factors, and the writers to push them to);
- ``Push`` (node -> writer): for each statement asked, the slices of the factors it read, as of
  just before the update's timestamp (an empty slice too: the writer must hear from everyone);
- ``Corrective`` (node -> writer): a write that reached a map after the node had already served
  reads of it at later timestamps: the delta, and exactly which reads it corrects.

- ``Settled`` (writer -> the corrective's source): the corrective and every corrective it caused
  in turn have been applied (Dijkstra-Scholten termination: a node knows its corrections are
  done without the map graph being acyclic, which seed 000's Figure 6 program is not).

Epochs (seed 000 §3.4): ``EpochEnd`` (switch -> node) closes a cut; ``EpochReady`` (node ->
coordinator) says the node's maps are final up to the cut; ``EpochCommit`` (coordinator -> node)
commits it; a node whose logs grow asks for an early end with ``EpochEndRequest``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# (counter, switch): each switch numbers its own stream; ties between streams go to the lower
# switch id. Strictly increasing per stream, total across streams, and no switch waits for
# another to stamp an update (seed 000 §3.1 "combine a TS ... with ID of the update stream").
Timestamp = tuple[int, int]
Key = tuple[Any, ...]
WILD = object()  # a key position the read leaves open (a loop variable)
COORDINATOR = -1  # the address, in a node's outbox, of the epoch coordinator (the switches' side)


@dataclass(frozen=True)
class Fetch:
    statement: int
    factors: tuple[int, ...]  # the factors of the statement whose map this node holds
    writers: tuple[int, ...]  # the nodes holding the target partitions


@dataclass(frozen=True)
class Dispatch:
    ts: Timestamp
    trigger: int  # index into the program's triggers
    args: Key
    puts: tuple[tuple[int, int], ...]  # (statement, number of PUSH messages to wait for)
    fetches: tuple[Fetch, ...]
    # conservative mode: how many updates with PUTs for this node come before this one (seed 001's
    # version number); a FETCH is served once those have all been written. Unused when speculative.
    puts_before: int = 0


@dataclass(frozen=True)
class Slice:
    statement: int
    factor: int
    entries: tuple[tuple[Key, Any], ...]


@dataclass(frozen=True)
class Push:
    ts: Timestamp
    source: int
    statements: tuple[int, ...]  # every statement this push answers (slices may be empty)
    slices: tuple[Slice, ...]


@dataclass(frozen=True)
class Read:
    """One read a corrective revises: the reading update, its statement and factor."""

    ts: Timestamp
    statement: int
    factor: int


@dataclass(frozen=True)
class Corrective:
    source: int
    write_ts: Timestamp
    map: str
    key: Key
    delta: Any
    reads: tuple[Read, ...]
    depth: int  # 1 for a late write; n + 1 for a revision caused by a depth-n corrective
    seq: int = 0  # numbered per source, for its Settled


@dataclass(frozen=True)
class Settled:
    seq: int  # the source's number of the corrective that is settled


@dataclass(frozen=True)
class EpochEnd:
    """Every update of this switch with a timestamp counter up to ``cut`` was dispatched before
    this message, and the switch stamps none at or below it any more."""

    cut: int
    switch: int


@dataclass(frozen=True)
class EpochReady:
    cut: int
    source: int


@dataclass(frozen=True)
class EpochCommit:
    cut: int


@dataclass(frozen=True)
class EpochEndRequest:
    source: int


Message = (
    Dispatch | Push | Corrective | Settled | EpochEnd | EpochReady | EpochCommit | EpochEndRequest
)
