"""Which LTM owns a row: a stable hash of (table id, encoded key) over the number of LTMs.

The number of partitions is fixed when a cluster's data directory is created; the coordinator
refuses to start over the same data with another count (repartitioning is not supported)."""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from aggview.keycodec import TEXT_END

CHANGES_ID = re.compile(r"c\d+_")  # change table number N of base table T: "c<N>_" + T's id
# Index number N of a column of base table T: "j<N>_<W>_" + T's id, where W is the width of
# the column's encoded value (a number, or "t" for TEXT, which ends at TEXT_END).
INDEX_ID = re.compile(r"j\d+_(\d+|t)_")
# View number N kept as partial rows: a group's state is the sum of one row per partition
# that changed it, keyed by the group key + that partition (2 bytes), and lives there.
PARTIALS_ID = re.compile(r"u\d+_")
PARTITION_BYTES = 2


def is_partials(table_id: str) -> bool:
    return PARTIALS_ID.match(table_id) is not None


def partial_key(group_key: bytes, partition: int) -> bytes:
    """The key of a group's partial row that lives on ``partition``."""
    return group_key + partition.to_bytes(PARTITION_BYTES, "big")


def group_of(partial: bytes) -> bytes:
    return partial[:-PARTITION_BYTES]


def changes_table(number: int, table_id: str) -> str:
    """The id of a change table of ``table_id``; its keys are the base key + an 8-byte ts."""
    return f"c{number}_{table_id}"


def index_table(number: int, width: int | None, table_id: str) -> str:
    """The id of an index of ``table_id``; its keys are the encoded column value (``width``
    bytes, None for TEXT) + the base key."""
    return f"j{number}_{'t' if width is None else width}_{table_id}"


def partition_of(table_id: str, key: bytes, partitions: int) -> int:
    """A change row or an index entry lives with the base row it describes, so writing it
    adds no participant to the writing transaction. (Indexes read by range ask every LTM
    anyway.)"""
    kind = _KINDS.get(table_id) or _kind(table_id)
    if kind.of == _PARTIALS:
        return int.from_bytes(key[-PARTITION_BYTES:], "big") % partitions
    if kind.of == _CHANGES:
        key = key[:-8]
    elif kind.of == _INDEX:
        key = key[_value_end(kind, key) :]
    return zlib.crc32(key, kind.seed) % partitions


def indexed_row(table_id: str, key: bytes) -> tuple[str, bytes] | None:
    """The base row (table id, key) an index entry describes; None for any other row."""
    kind = _KINDS.get(table_id) or _kind(table_id)
    if kind.of != _INDEX:
        return None
    return kind.base, key[_value_end(kind, key) :]


def index_base(table_id: str) -> str | None:
    """The id of the table an index describes; None for a table id of any other kind."""
    kind = _KINDS.get(table_id) or _kind(table_id)
    return kind.base if kind.of == _INDEX else None


_PLAIN, _PARTIALS, _CHANGES, _INDEX = range(4)


@dataclass(frozen=True)
class _Kind:
    of: int  # _PLAIN, _PARTIALS, _CHANGES or _INDEX
    base: str  # the table id its rows hash with: a change table's or an index's base table
    seed: int  # crc32 of ``base``
    width: int | None  # an index's value width in bytes (None: TEXT, ending at TEXT_END)


# table id -> its kind: a commit asks for several rows' partitions, each a dict lookup
_KINDS: dict[str, _Kind] = {}


def _kind(table_id: str) -> _Kind:
    width: int | None = None
    if PARTIALS_ID.match(table_id):
        of, base = _PARTIALS, table_id
    elif match := CHANGES_ID.match(table_id):
        of, base = _CHANGES, table_id[match.end() :]
    elif match := INDEX_ID.match(table_id):
        of, base = _INDEX, table_id[match.end() :]
        width = None if match.group(1) == "t" else int(match.group(1))
    else:
        of, base = _PLAIN, table_id
    kind = _Kind(of, base, zlib.crc32(base.encode()), width)
    if len(_KINDS) < 100_000:  # ids are few (tables, their indexes, views); a fuzzer's are not
        _KINDS[table_id] = kind
    return kind


def _value_end(kind: _Kind, key: bytes) -> int:
    """Where an index entry's key stops holding the value and starts the base row's key."""
    return key.find(TEXT_END) + len(TEXT_END) if kind.width is None else kind.width


def standby_of(partition: int, partitions: int, members: int) -> int:
    """Where ``partition``'s log is copied (chain placement): the next partition hosted by
    another process. Partition p lives at member p % members; with one LTM per process
    (members == partitions) that is simply the next LTM."""
    for step in range(1, partitions):
        candidate = (partition + step) % partitions
        if candidate % members != partition % members:
            return candidate
    raise ValueError(f"{partitions} partitions on {members} processes have no other process")


def decision_log_id(member: int, partitions: int) -> int:
    """The ownership record of member ``member``'s decision log, replicated as a partition's
    log is: numbered after the partitions."""
    return partitions + member
