"""Which LTM owns a row: a stable hash of (table id, encoded key) over the number of LTMs.

The number of partitions is fixed when a cluster's data directory is created; the coordinator
refuses to start over the same data with another count (repartitioning is not supported)."""

from __future__ import annotations

import zlib


def partition_of(table_id: str, key: bytes, partitions: int) -> int:
    return zlib.crc32(key, zlib.crc32(table_id.encode())) % partitions
