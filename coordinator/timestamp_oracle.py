"""Strictly increasing 64-bit timestamps that survive restarts.

The oracle reserves blocks durably in the store's ``_meta`` table and hands out timestamps
from memory; a restart continues above the last reserved block, so no timestamp is issued
twice even if the coordinator died mid-block."""

from __future__ import annotations

from collections.abc import Callable

BLOCK = 100_000
_KEY = "timestamps_reserved"


class TimestampOracle:
    def __init__(self, get_meta: Callable[[str], str | None], set_meta: Callable[[str, str], None]):
        self._set_meta = set_meta
        self._last = int(get_meta(_KEY) or "0")
        self._reserved = self._last

    def next(self) -> int:
        return self.take(1)

    def take(self, count: int) -> int:
        """``count`` consecutive timestamps; returns the first."""
        if self._last + count > self._reserved:
            reserved = self._last + count + BLOCK
            self._set_meta(_KEY, str(reserved))  # may fail (a deposed leader): nothing granted
            self._reserved = reserved
        first = self._last + 1
        self._last += count
        return first

    def current(self) -> int:
        """The youngest timestamp issued so far."""
        return self._last
