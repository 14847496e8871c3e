"""Which LTM owns a row: a stable hash of (table id, encoded key) over the number of LTMs.

The number of partitions is fixed when a cluster's data directory is created; the coordinator
refuses to start over the same data with another count (repartitioning is not supported)."""

from __future__ import annotations

import re
import zlib

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
    if PARTIALS_ID.match(table_id):
        return int.from_bytes(key[-PARTITION_BYTES:], "big") % partitions
    match = CHANGES_ID.match(table_id)
    if match:
        table_id, key = table_id[match.end() :], key[:-8]
    else:
        match = INDEX_ID.match(table_id)
        if match:
            width = match.group(1)
            end = key.find(TEXT_END) + len(TEXT_END) if width == "t" else int(width)
            table_id, key = table_id[match.end() :], key[end:]
    return zlib.crc32(key, zlib.crc32(table_id.encode())) % partitions


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
