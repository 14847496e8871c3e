"""Which LTM owns a row: a stable hash of (table id, encoded key) over the number of LTMs.

The number of partitions is fixed when a cluster's data directory is created; the coordinator
refuses to start over the same data with another count (repartitioning is not supported)."""

from __future__ import annotations

import zlib

CHANGES_PREFIX = "c_"  # change table of base table T: "c_" + T's id; keys: T's key + 8-byte ts


def changes_table(table_id: str) -> str:
    return CHANGES_PREFIX + table_id


def partition_of(table_id: str, key: bytes, partitions: int) -> int:
    """A change row lives with the base row it describes, so appending it adds no
    participant to the writing transaction."""
    if table_id.startswith(CHANGES_PREFIX):
        table_id, key = table_id[len(CHANGES_PREFIX) :], key[:-8]
    return zlib.crc32(key, zlib.crc32(table_id.encode())) % partitions
