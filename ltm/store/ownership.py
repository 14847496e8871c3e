"""Who serves each partition, at which epoch, and which LTM keeps a copy of its log.

The record lives in the shared store, so it outlives every process, in two keys per partition:
the *fence* (epoch and owner), which only the coordinator changes, to fail a partition over;
and the *standby* (who gets the log, and whether it is in sync), which the owner keeps current.
An LTM serves a partition only at the epoch the fence gives it, and every store write it makes
for the partition is guarded by that fence: a superseded primary can never write again."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from aggview import errors
from ltm.store.base import Guard, GuardFailed, Mutation, Store

TABLE = "_partitions"
PARTITION_HEADER = "aggview-partition"  # which partition a call to an LTM is for (default: its own)
EPOCH_HEADER = "aggview-epoch"  # the epoch the caller believes in (checked when sent)


class Superseded(errors.FailedPrecondition):
    """A newer epoch owns the partition: this copy of it is fenced off."""


def partition_metadata(partition: int, epoch: int) -> tuple[tuple[str, str], ...]:
    return ((PARTITION_HEADER, str(partition)), (EPOCH_HEADER, str(epoch)))


@dataclass(frozen=True)
class Ownership:
    partition: int
    epoch: int
    owner: int
    standby: int | None = None  # the LTM the owner replicates its log to
    standby_address: str = ""
    in_sync: bool = False  # the standby holds every flush the owner acknowledged
    # The stored standby value this record was read with: a move is a compare-and-set on it
    # (it names the epoch, so it never comes back once changed; see ``move``).
    version: bytes | None = field(default=None, compare=False, repr=False)

    def evolve(self, **changes: object) -> Ownership:
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def failover_target(self) -> int | None:
        """Only an in-sync standby may take over: any other would lose committed work."""
        return self.standby if self.in_sync else None

    def guard(self) -> Guard:
        """A store write under this guard lands only while this owner holds this epoch."""
        value = _fence_value(self.partition, self.epoch, self.owner)
        return (TABLE, _fence_key(self.partition), value)


def _fence_key(partition: int) -> bytes:
    return b"f" + struct.pack(">I", partition)


def _standby_key(partition: int) -> bytes:
    return b"s" + struct.pack(">I", partition)


def _adopted_key(partition: int) -> bytes:
    return b"a" + struct.pack(">I", partition)


def _fence_value(partition: int, epoch: int, owner: int) -> bytes | None:
    """None (no key) for the state every cluster starts in: epoch 0, each LTM its own."""
    if epoch == 0 and owner == partition:
        return None
    return json.dumps({"epoch": epoch, "owner": owner}).encode()


def read(store: Store, partition: int) -> Ownership:
    if TABLE not in store.list_tables():
        return Ownership(partition, 0, partition)
    found = store.get_many(TABLE, [_fence_key(partition), _standby_key(partition)])
    fence = found.get(_fence_key(partition))
    record = Ownership(partition, 0, partition)
    if fence is not None:
        record = record.evolve(**json.loads(fence))
    standby = found.get(_standby_key(partition))
    if standby is not None:
        fields = json.loads(standby)
        fields.pop("at", None)  # the epoch it was written at: part of the version only
        record = record.evolve(**fields)
    return record.evolve(version=standby)


def _standby_value(record: Ownership) -> bytes:
    fields = {"standby": record.standby, "standby_address": record.standby_address}
    return json.dumps({**fields, "in_sync": record.in_sync, "at": record.epoch}).encode()


def write(store: Store, record: Ownership) -> None:
    """An unconditional write of a partition's record (tests, and tools that set a cluster
    up); members change ownership only by :func:`move` or :func:`hand_over`."""
    store.create_table(TABLE)  # a no-op once it exists
    store.write(_record_mutations(record))


def _record_mutations(record: Ownership) -> list[Mutation]:
    p = record.partition
    return [
        (TABLE, _fence_key(p), _fence_value(p, record.epoch, record.owner)),
        (TABLE, _standby_key(p), _standby_value(record)),
    ]


class Moved(errors.FailedPrecondition):
    """The record changed since it was read (another member moved the partition, or its
    owner changed its standby's state): the move that read it applies nothing."""


def move(store: Store, was: Ownership, moved: Ownership) -> None:
    """A new epoch and owner (and standby) for a partition, only if the record is still the
    one ``was`` was read as: a compare-and-set on the standby value, which every change of the
    record rewrites (its owner's ``write_standby``, a ``hand_over``, another ``move``) and
    which names the epoch. So two members can never both move one partition from one epoch,
    and a move decided on "the standby is in sync" fails if the owner dropped its standby
    (and went on alone) in between."""
    assert moved.epoch > was.epoch, "a move raises the epoch"
    store.create_table(TABLE)
    try:
        store.write_guarded(
            (TABLE, _standby_key(was.partition), was.version), _record_mutations(moved)
        )
    except GuardFailed:
        current = read(store, was.partition)
        raise Moved(
            f"partition {was.partition}'s record changed since it was read (epoch "
            f"{was.epoch}, owner {was.owner}; now epoch {current.epoch}, owner "
            f"{current.owner}, standby in sync: {current.in_sync})"
        ) from None


def hand_over(store: Store, record: Ownership, moved: Ownership) -> None:
    """The owner's own write of a new epoch and owner, only while the fence still names it
    at ``record``'s epoch (a planned handover: nobody else moves a partition that is served)."""
    _write_fenced(store, record, _record_mutations(moved))


def write_standby(store: Store, record: Ownership) -> None:
    """The owner's write of its standby's state, only while the fence still names it."""
    _write_fenced(store, record, [(TABLE, _standby_key(record.partition), _standby_value(record))])


def write_adopted(store: Store, record: Ownership, copied: Iterable[int]) -> None:
    """A member's decision log adopted under ``record``: the commits its copy held, written
    under the fence before the adopter answers for the log. The member, back, forgets any
    other commit its own log has (see ``DecisionLog.reconcile``)."""
    value = json.dumps({"epoch": record.epoch, "committed": sorted(copied)}).encode()
    _write_fenced(store, record, [(TABLE, _adopted_key(record.partition), value)])


def _write_fenced(store: Store, record: Ownership, mutations: list[Mutation]) -> None:
    """``mutations`` land only while the fence still names ``record``'s owner and epoch;
    otherwise :class:`Superseded` says who holds it now."""
    store.create_table(TABLE)
    try:
        store.write_guarded(record.guard(), mutations)
    except GuardFailed:
        raise superseded(store, record) from None


def read_adopted(store: Store, partition: int) -> tuple[int, set[int]] | None:
    """The newest adoption of a decision log, as (epoch, commits copied); None if never."""
    if TABLE not in store.list_tables():
        return None
    raw = store.get_many(TABLE, [_adopted_key(partition)]).get(_adopted_key(partition))
    if raw is None:
        return None
    adopted = json.loads(raw)
    return adopted["epoch"], set(adopted["committed"])


def superseded(store: Store, record: Ownership) -> Superseded:
    return _superseded(read(store, record.partition), record)


def _superseded(current: Ownership, record: Ownership) -> Superseded:
    return Superseded(
        f"partition {record.partition} is served by LTM {current.owner} at epoch "
        f"{current.epoch} now, not by LTM {record.owner} at epoch {record.epoch}"
    )


def check_owner(store: Store, partition: int, epoch: int, owner: int) -> Ownership:
    """Raises :class:`Superseded` unless ``owner`` holds the partition at ``epoch``."""
    current = read(store, partition)
    if current.epoch != epoch or current.owner != owner:
        raise _superseded(current, Ownership(partition, epoch, owner))
    return current
