"""Which member leads a replicated cluster (keeps the clock and the catalog), and the rules
that let another take over when it dies without ever letting two lead at once.

The record lives in the store's ``_meta`` table: the leading member and its *term*, raised by
every takeover. Only the leader's *successor* (the next member after it) takes over, after
``--failover-after`` seconds in which the leader did not answer, by a compare-and-set on the
record; a member started with ``--take-lead`` (every member is starting) takes it at once.

Two fences keep a leader that is alive but cut off (or paused) from acting after that:

- *Its store writes* (the catalog, the timestamp reservation) are guarded by the record: once
  the successor wrote its term, they fail and apply nothing.
- *Its grants* need a lease: the leader reads the record every ``RENEW_EVERY`` seconds, and
  grants only within ``LEASE`` seconds of the start of the last read that found it leading.
  The successor waits ``LEASE`` after its write before it grants: every read that started
  before the write has expired by then, and every later one sees the new term. (Only the
  rate of the two processes' clocks matters, not their agreement.)

A leader that finds another term in the record stops (``Deposed``); started again, it reads
the record and follows. Every new leader's catalog epochs start above its predecessor's
(``Catalog.first_epoch``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from aggview import errors
from ltm.store.base import Guard, Store

META_TABLE = "_meta"
_KEY = b"leader"
# Seconds a confirmation of the record lets the leader grant. The successor waits this long
# after its write, so it is part of every leader failover; renewed five times per lease, by a
# thread of the leader's own (a pool busy with store writes must not let it lapse).
LEASE = 0.5
RENEW_EVERY = 0.1


class Deposed(errors.FailedPrecondition):
    """Another member took the lead: this one must stop coordinating as the leader."""


@dataclass(frozen=True)
class Leadership:
    member: int
    term: int

    def encode(self) -> bytes:
        return json.dumps({"member": self.member, "term": self.term}).encode()


def _read_raw(store: Store) -> bytes | None:
    return store.get(META_TABLE, _KEY)  # the catalog made the table


def _parse(raw: bytes | None) -> Leadership:
    if raw is None:
        return Leadership(0, 0)
    value = json.loads(raw)
    return Leadership(int(value["member"]), int(value["term"]))


def read(store: Store) -> Leadership:
    """The record (member 0 at term 0 before anyone wrote one)."""
    return _parse(_read_raw(store))


def guard(store: Store, leadership: Leadership) -> Guard:
    """A store write under this guard lands only while ``leadership`` is the record."""
    raw = _read_raw(store)
    if raw is None or _parse(raw) != leadership:
        raise Deposed(f"member {leadership.member} no longer leads (term {leadership.term})")
    return (META_TABLE, _KEY, raw)


def take(store: Store, member: int, was: Leadership | None) -> Leadership:
    """``member`` leads from now, in a new term, provided the record still says ``was``
    (None: whatever it says; only a member starting with every other one does that).
    Raises ``GuardFailed`` when someone else changed it first."""
    raw = _read_raw(store)
    current = _parse(raw)
    new = Leadership(member, current.term + 1)
    if was is None:
        store.write([(META_TABLE, _KEY, new.encode())])
    else:
        if current != was:
            raise Deposed(f"the lead moved to member {current.member} (term {current.term})")
        store.write_guarded((META_TABLE, _KEY, raw), [(META_TABLE, _KEY, new.encode())])
    return new


def successor(leader: int, members: int) -> int:
    """Who takes over when ``leader`` dies: the next member."""
    return (leader + 1) % members


class Lease:
    """Pure: whether the leader may grant now. ``confirmed(started)``: a read of the record
    that started at ``started`` found this member leading."""

    def __init__(self, length: float = LEASE, clock: Callable[[], float] = time.monotonic) -> None:
        self.length = length
        self._now = clock
        self._until = 0.0

    def confirmed(self, started: float) -> None:
        self._until = max(self._until, started + self.length)

    def valid(self) -> bool:
        return self._now() < self._until

    def check(self, member: int) -> None:
        if not self.valid():
            raise errors.Unavailable(
                f"member {member} cannot confirm it still leads the cluster (the store did "
                "not answer, or another member took over); try again"
            )
