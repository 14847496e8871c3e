"""Who serves each partition, at which epoch, and which LTM keeps a copy of its log.

The record lives in the shared store, so it outlives every process: one key per partition (one
HBase row and cell) holds the *fence* (epoch and owner), the *standby* (who gets the log, and
whether it is in sync) and, for a member's decision log, its last *adoption*. Every change of
it is a compare-and-set of that one value (``Store.write_guarded`` of the key, guarded on the
key): atomic on every store, HBase included (``checkAndPut``). A move expects the whole value
it read; the owner's own changes (its standby's state, a hand-over, an adoption) expect the
value they read after checking that it names them at their epoch, and read again when only
something else in it changed meanwhile.

An LTM serves a partition only at the epoch the fence gives it, and every store write it makes
for the partition is guarded by the record (:func:`write_fenced`): a superseded primary cannot
write again. Rows are other keys than the record, so on HBase that guard is a check, then a
write (docs/DECISIONS.md, "The ownership record is one row", says what that leaves open)."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from aggview import errors
from ltm.store.base import GuardFailed, Mutation, Store

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
    # The stored value this record was read with (None: its key is absent): every change is a
    # compare-and-set on it. It names the epoch, so it never comes back once the epoch moved.
    version: bytes | None = field(default=None, compare=False, repr=False)
    # A decision log's newest adoption: (epoch, the commits the adopter's copy held).
    adopted: tuple[int, tuple[int, ...]] | None = field(default=None, compare=False, repr=False)

    def evolve(self, **changes: object) -> Ownership:
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def failover_target(self) -> int | None:
        """Only an in-sync standby may take over: any other would lose committed work."""
        return self.standby if self.in_sync else None

    def same_fence(self, other: Ownership) -> bool:
        """Whether ``other`` names the same owner at the same epoch (the fence)."""
        return (self.epoch, self.owner) == (other.epoch, other.owner)


def _key(partition: int) -> bytes:
    return b"r" + struct.pack(">I", partition)


def _encode(record: Ownership) -> bytes:
    value: dict[str, object] = {
        "epoch": record.epoch,
        "owner": record.owner,
        "standby": record.standby,
        "standby_address": record.standby_address,
        "in_sync": record.in_sync,
    }
    if record.adopted is not None:
        epoch, committed = record.adopted
        value["adopted"] = {"epoch": epoch, "committed": list(committed)}
    return json.dumps(value).encode()


def _adoption(value: Any) -> tuple[int, tuple[int, ...]] | None:
    return None if value is None else (int(value["epoch"]), tuple(value["committed"]))


def _decode(partition: int, raw: bytes) -> Ownership:
    fields = json.loads(raw)
    return Ownership(
        partition,
        fields["epoch"],
        fields["owner"],
        fields["standby"],
        fields["standby_address"],
        fields["in_sync"],
        version=raw,
        adopted=_adoption(fields.get("adopted")),
    )


# The layout before one key per partition (a data directory of an earlier build): the fence,
# the standby and the adoption under three keys. Read while the one key is absent; the first
# change writes the one key, which shadows them from then on (they are never written again).
_LEGACY_FENCE, _LEGACY_STANDBY, _LEGACY_ADOPTED = b"f", b"s", b"a"


def _legacy_keys(partition: int) -> list[bytes]:
    index = struct.pack(">I", partition)
    return [kind + index for kind in (_LEGACY_FENCE, _LEGACY_STANDBY, _LEGACY_ADOPTED)]


def _legacy(partition: int, found: dict[bytes, bytes]) -> Ownership:
    fence, standby, adopted = (found.get(k) for k in _legacy_keys(partition))
    record = Ownership(partition, 0, partition)  # no fence key: epoch 0, each LTM its own
    if fence is not None:
        record = record.evolve(**json.loads(fence))
    if standby is not None:
        fields = json.loads(standby)
        fields.pop("at", None)  # the epoch it was written at
        record = record.evolve(**fields)
    if adopted is not None:
        record = record.evolve(adopted=_adoption(json.loads(adopted)))
    return record  # version None: a change expects the one key absent


def _floor_key(partition: int) -> bytes:
    return b"l" + struct.pack(">I", partition)


def lsn_floor(store: Store, partition: int) -> int:
    """The highest LSN a checkpoint of the partition has stored (0: none yet). Its log
    numbers every later record above it, whichever log that is: a log of another layout
    (``aggview start --processes``, ``--replicate``) starts its LSNs afresh, and a change it
    logged below a stored row's LSN would be skipped by replay as already stored."""
    try:
        raw = store.get(TABLE, _floor_key(partition))
    except errors.UnknownTable:
        return 0
    return 0 if raw is None else int(raw)


def lsn_floor_mutation(partition: int, lsn: int) -> tuple[str, bytes, bytes]:
    """What a checkpoint writes with its rows (``lsn``: its log's LSN at the snapshot)."""
    return (TABLE, _floor_key(partition), str(lsn).encode())


def read(store: Store, partition: int) -> Ownership:
    if TABLE not in store.list_tables():
        return Ownership(partition, 0, partition)
    found = store.get_many(TABLE, [_key(partition), *_legacy_keys(partition)])
    raw = found.get(_key(partition))
    return _legacy(partition, found) if raw is None else _decode(partition, raw)


def _replace(store: Store, expected: bytes | None, record: Ownership) -> Ownership:
    """``record`` stored if the stored value is still ``expected`` (else GuardFailed): a
    compare-and-set of the one key, atomic on every store. Returns it with its version."""
    value = _encode(record)
    key = _key(record.partition)
    store.write_guarded((TABLE, key, expected), [(TABLE, key, value)])
    return record.evolve(version=value)


def write(store: Store, record: Ownership) -> None:
    """An unconditional write of a partition's record, keeping its adoption (tests, and tools
    that set a cluster up); members change ownership only by :func:`move` or
    :func:`hand_over`."""
    store.create_table(TABLE)  # a no-op once it exists
    adopted = read(store, record.partition).adopted
    store.write([(TABLE, _key(record.partition), _encode(record.evolve(adopted=adopted)))])


class Moved(errors.FailedPrecondition):
    """The record changed since it was read (another member moved the partition, or its
    owner changed its standby's state): the move that read it applies nothing."""


def move(store: Store, was: Ownership, moved: Ownership) -> None:
    """A new epoch and owner (and standby) for a partition, only if the record is still the
    one ``was`` was read as: a compare-and-set on its whole value, which every change of the
    record rewrites (its owner's ``write_standby``, a ``hand_over``, another ``move``) and
    which names the epoch. So two members can never both move one partition from one epoch,
    and a move decided on "the standby is in sync" fails if the owner dropped its standby
    (and went on alone) in between. The adoption on record stays."""
    assert moved.epoch > was.epoch, "a move raises the epoch"
    assert moved.partition == was.partition
    store.create_table(TABLE)
    try:
        _replace(store, was.version, moved.evolve(adopted=was.adopted))
    except GuardFailed:
        current = read(store, was.partition)
        raise Moved(
            f"partition {was.partition}'s record changed since it was read (epoch "
            f"{was.epoch}, owner {was.owner}; now epoch {current.epoch}, owner "
            f"{current.owner}, standby in sync: {current.in_sync})"
        ) from None


def hand_over(store: Store, record: Ownership, moved: Ownership) -> Ownership:
    """The owner's own write of a new epoch and owner, only while the fence still names it
    at ``record``'s epoch (a planned handover: nobody else moves a partition that is served)."""
    return _change_fenced(store, record, lambda current: moved.evolve(adopted=current.adopted))


def write_standby(store: Store, record: Ownership) -> Ownership:
    """The owner's write of its standby's state, only while the fence still names it."""
    return _change_fenced(
        store,
        record,
        lambda current: current.evolve(
            standby=record.standby,
            standby_address=record.standby_address,
            in_sync=record.in_sync,
        ),
    )


def write_adopted(store: Store, record: Ownership, copied: Iterable[int]) -> Ownership:
    """A member's decision log adopted under ``record``: the commits its copy held, written
    under the fence before the adopter answers for the log. The member, back, forgets any
    other commit its own log has (see ``DecisionLog.reconcile``)."""
    adopted = (record.epoch, tuple(sorted(copied)))
    return _change_fenced(store, record, lambda current: current.evolve(adopted=adopted))


def _change_fenced(
    store: Store, record: Ownership, change: Callable[[Ownership], Ownership]
) -> Ownership:
    """``change`` of the stored record, stored only while it names ``record``'s owner at its
    epoch (else :class:`Superseded`): a compare-and-set of the value read, read again when
    something else in it changed meanwhile (the owner's own other writes). Returns what was
    stored."""
    store.create_table(TABLE)
    while True:
        current = read(store, record.partition)
        if not current.same_fence(record):
            raise _superseded(current, record)
        try:
            return _replace(store, current.version, change(current))
        except GuardFailed:
            continue  # changed since read: look again


def write_fenced(store: Store, record: Ownership, mutations: list[Mutation]) -> Ownership:
    """``mutations`` (the partition's rows) land only while the record names ``record``'s
    owner at its epoch (else :class:`Superseded`, nothing applied): guarded on the stored
    record being ``record.version``, read again when only something else in it changed (its
    standby's state). Returns the record the write was guarded on: passed next time, it
    spares that read. Atomic on SQLite; on HBase a check, then a write (``Store.write_guarded``)."""
    while True:
        try:
            store.write_guarded((TABLE, _key(record.partition), record.version), mutations)
            return record
        except GuardFailed:
            current = read(store, record.partition)
            if not current.same_fence(record):
                raise _superseded(current, record) from None
            record = current


def read_adopted(store: Store, partition: int) -> tuple[int, set[int]] | None:
    """The newest adoption of a decision log, as (epoch, commits copied); None if never."""
    adopted = read(store, partition).adopted
    return None if adopted is None else (adopted[0], set(adopted[1]))


def _superseded(current: Ownership, record: Ownership) -> Superseded:
    return Superseded(
        f"partition {record.partition} is served by LTM {current.owner} at epoch "
        f"{current.epoch} now, not by LTM {record.owner} at epoch {record.epoch}"
    )


def check_owner(store: Store, partition: int, epoch: int, owner: int) -> Ownership:
    """Raises :class:`Superseded` unless ``owner`` holds the partition at ``epoch``."""
    current = read(store, partition)
    if not current.same_fence(Ownership(partition, epoch, owner)):
        raise _superseded(current, Ownership(partition, epoch, owner))
    return current
