"""Who serves each partition, at which epoch, and which LTM keeps a copy of its log.

The record lives in the shared store, so it outlives every process. The coordinator writes it
to fail a partition over (a new epoch, the standby as owner); the owner writes it when its
standby falls out of sync or catches up again. An LTM serves a partition only at the epoch the
record gives it, and checks the record before it checkpoints: a superseded primary (fenced by
the newer epoch) never writes the store again."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, replace

from aggview import errors
from ltm.store.base import Store

TABLE = "_partitions"
PARTITION_HEADER = "aggview-partition"  # which partition a call to an LTM is for (default: its own)
EPOCH_HEADER = "aggview-epoch"  # the epoch the caller believes in (checked when sent)


def partition_metadata(partition: int, epoch: int) -> tuple[tuple[str, str], ...]:
    return ((PARTITION_HEADER, str(partition)), (EPOCH_HEADER, str(epoch)))


class Superseded(errors.FailedPrecondition):
    """A newer epoch owns the partition: this copy of it is fenced off."""


@dataclass(frozen=True)
class Ownership:
    partition: int
    epoch: int
    owner: int
    standby: int | None = None  # the LTM the owner replicates its log to
    standby_address: str = ""
    in_sync: bool = False  # the standby holds every flush the owner acknowledged

    def evolve(self, **changes: object) -> Ownership:
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def failover_target(self) -> int | None:
        """Only an in-sync standby may take over: any other would lose committed work."""
        return self.standby if self.in_sync else None


def _key(partition: int) -> bytes:
    return struct.pack(">I", partition)


def read(store: Store, partition: int) -> Ownership:
    """The partition's record; a cluster that never failed over has epoch 0 and each partition
    owned by the LTM of the same number."""
    if TABLE not in store.list_tables():
        return Ownership(partition, 0, partition)
    raw = store.get(TABLE, _key(partition))
    if raw is None:
        return Ownership(partition, 0, partition)
    return Ownership(partition, **json.loads(raw))


def write(store: Store, record: Ownership) -> None:
    store.create_table(TABLE)  # a no-op once it exists
    fields = {k: v for k, v in record.__dict__.items() if k != "partition"}
    store.write([(TABLE, _key(record.partition), json.dumps(fields).encode())])


def check_owner(store: Store, partition: int, epoch: int, owner: int) -> Ownership:
    """Raises :class:`Superseded` if a newer epoch took the partition from ``owner``."""
    current = read(store, partition)
    if current.epoch != epoch or current.owner != owner:
        raise Superseded(
            f"partition {partition} is served by LTM {current.owner} at epoch {current.epoch} "
            f"now, not by LTM {owner} at epoch {epoch}"
        )
    return current
