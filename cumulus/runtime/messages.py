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

Batching (per switch and node, per pair of nodes): ``Batch`` carries several messages from one
sender to one receiver in the order sent, as one message on the link (one delay, one delivery);
the node takes them in that order, each as if it had arrived alone, so FIFO per link holds
within and across batches and the protocol is unchanged.

Epochs (seed 000 §3.4): ``EpochEnd`` (switch -> node) closes a cut; ``EpochReady`` (node ->
coordinator) says the node's maps are final up to the cut; ``EpochCommit`` (coordinator -> node)
commits it; a node whose logs grow asks for an early end with ``EpochEndRequest``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Messages are values, never changed once made; not frozen dataclasses because a frozen one's
# __init__ costs about ten times a plain one's, and the runtime makes several per update.

# (counter, switch): each switch numbers its own stream; ties between streams go to the lower
# switch id. Strictly increasing per stream, total across streams, and no switch waits for
# another to stamp an update (seed 000 §3.1 "combine a TS ... with ID of the update stream").
Timestamp = tuple[int, int]
Key = tuple[Any, ...]
WILD = object()  # a key position the read leaves open (a loop variable)
COORDINATOR = -1  # the address, in a node's outbox, of the epoch coordinator (the switches' side)


@dataclass(slots=True, unsafe_hash=True)
class Fetch:
    statement: int
    factors: tuple[int, ...]  # the factors of the statement whose map this node holds
    writers: tuple[int, ...]  # the nodes holding the target partitions


@dataclass(slots=True, unsafe_hash=True)
class Dispatch:
    ts: Timestamp
    trigger: int  # index into the program's triggers
    args: Key
    puts: tuple[tuple[int, int], ...]  # (statement, number of PUSH messages to wait for)
    fetches: tuple[Fetch, ...]
    # conservative mode: how many updates with PUTs for this node come before this one (seed 001's
    # version number); a FETCH is served once those have all been written. Unused when speculative.
    puts_before: int = 0


@dataclass(slots=True, unsafe_hash=True)
class Slice:
    statement: int
    factor: int
    entries: tuple[tuple[Key, Any], ...]


@dataclass(slots=True, unsafe_hash=True)
class Push:
    ts: Timestamp
    source: int
    statements: tuple[int, ...]  # every statement this push answers (slices may be empty)
    slices: tuple[Slice, ...]


@dataclass(slots=True, unsafe_hash=True)
class Read:
    """One read a corrective revises: the reading update, its statement and factor."""

    ts: Timestamp
    statement: int
    factor: int


@dataclass(slots=True, unsafe_hash=True)
class Corrective:
    source: int
    write_ts: Timestamp
    map: str
    key: Key
    delta: Any
    reads: tuple[Read, ...]
    depth: int  # 1 for a late write; n + 1 for a revision caused by a depth-n corrective
    seq: int = 0  # numbered per source, for its Settled


@dataclass(slots=True, unsafe_hash=True)
class Settled:
    seq: int  # the source's number of the corrective that is settled


@dataclass(slots=True, unsafe_hash=True)
class EpochEnd:
    """Every update of this switch with a timestamp counter up to ``cut`` was dispatched before
    this message, and the switch stamps none at or below it any more."""

    cut: int
    switch: int


@dataclass(slots=True, unsafe_hash=True)
class EpochReady:
    cut: int
    source: int


@dataclass(slots=True, unsafe_hash=True)
class EpochCommit:
    cut: int


@dataclass(slots=True, unsafe_hash=True)
class EpochEndRequest:
    source: int


@dataclass(slots=True, unsafe_hash=True)
class Batch:
    """Several messages of one link (a switch's to a node, a node's to another), in order."""

    messages: tuple[Message, ...]


Message = (
    Dispatch
    | Push
    | Corrective
    | Settled
    | EpochEnd
    | EpochReady
    | EpochCommit
    | EpochEndRequest
    | Batch
)


def batched(messages: list[Message]) -> Message:
    """One message for a link's messages, in order: the message itself if it is alone."""
    return messages[0] if len(messages) == 1 else Batch(tuple(messages))
