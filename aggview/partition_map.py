"""Which LTM owns a row: a stable hash of (table id, encoded key) over the number of LTMs.

The number of partitions is fixed when a cluster's data directory is created; the coordinator
refuses to start over the same data with another count (repartitioning is not supported)."""

from __future__ import annotations

import re
import zlib

CHANGES_ID = re.compile(r"c\d+_")  # change table number N of base table T: "c<N>_" + T's id


def changes_table(number: int, table_id: str) -> str:
    """The id of a change table of ``table_id``; its keys are the base key + an 8-byte ts."""
    return f"c{number}_{table_id}"


def partition_of(table_id: str, key: bytes, partitions: int) -> int:
    """A change row lives with the base row it describes, so appending it adds no
    participant to the writing transaction."""
    match = CHANGES_ID.match(table_id)
    if match:
        table_id, key = table_id[match.end() :], key[:-8]
    return zlib.crc32(key, zlib.crc32(table_id.encode())) % partitions
