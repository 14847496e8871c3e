"""The cluster's clock: timestamps for every coordinating member, and the two watermarks that
reads and pruning need once no single process sees every transaction.

``Clock`` runs at the leader (member 0, or the member that took over from it:
``coordinator.leadership``) and is a pure state machine. A member asks for exactly
as many timestamps as it has transactions waiting (one request per batch; never a reserve, as
an unused timestamp would hold the watermarks back) and for a read timestamp when it has reads
waiting. After its in-flight set changes it reports the oldest timestamp it has not decided,
its oldest active read, and the sequence number of the last grant it had received then. From
those the clock knows, cluster-wide:

- ``decided``: every transaction at or below it is decided. A grant that no report covers yet
  counts as undecided, so nothing slips between a grant and the report that follows it.
- ``low``: no read below it will come (participants prune the versions under it): the oldest
  active read anywhere, and never above ``decided`` (view maintenance reads the state just
  before its own timestamp).

Strictly serializable: a transaction asks for its timestamp after it began, and every grant is
above every earlier one, so a transaction that began after another committed has the larger
timestamp. A read's timestamp is the youngest granted when it asked, and it reads once that is
decided: it sees exactly the transactions that committed before it began, and never aborts one.

The catalog epoch (the set of tables, views and indexes) is the clock's too: every grant
carries it, so a member learns of a change before it runs a transaction timestamped after it.

Writes to cached rows: every member caches the dimension rows view maintenance looks up
(``coordinator.lookup_cache``), and a cached answer at ``t`` is right only if the member knows
every writer of the row below ``t``. A request says which cached rows (or whole tables) its
transactions write; the grant records that as a ``Notice``, which the leader hands to every
other member before any timestamp granted after it (on the same ordered stream, ahead of its
next grant). A request whose rows were picked under an older catalog epoch than the grant's
(the set of cached tables may have changed) becomes a notice for every table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.timestamp_oracle import TimestampOracle

RowKey = tuple[str, bytes]  # (store table id, encoded primary key)


@dataclass(frozen=True)
class Writes:
    """What transactions asking for timestamps will write in cached tables."""

    rows: tuple[RowKey, ...] = ()
    tables: tuple[str, ...] = ()  # any row of these (known only once it has read)
    epoch: int = 0  # the catalog epoch under which they were picked

    def __bool__(self) -> bool:
        return bool(self.rows or self.tables)


@dataclass(frozen=True)
class Notice:
    """Transactions ``first..last`` may write ``rows``, any row of ``tables``, or with
    ``everything`` any row at all."""

    first: int
    last: int
    rows: tuple[RowKey, ...] = ()
    tables: tuple[str, ...] = ()
    everything: bool = False


@dataclass(frozen=True)
class Grant:
    seq: int  # the member reports it has received every grant up to this one
    first: int  # count consecutive timestamps from first (none when count is 0)
    count: int
    read_ts: int  # the youngest timestamp issued before this grant, if a read was asked
    epoch: int  # the catalog epoch every timestamp of the grant runs under
    notice: Notice | None = None  # for every other member: what these timestamps write


@dataclass(frozen=True)
class Marks:
    issued: int  # the youngest timestamp issued
    decided: int  # every transaction at or below this is decided
    low: int  # no read below this will come
    epoch: int


@dataclass
class _Member:
    writes: dict[int, int] = field(default_factory=dict)  # unacknowledged grant seq -> first ts
    reads: dict[int, int] = field(default_factory=dict)  # unacknowledged grant seq -> read ts
    undecided: int | None = None  # its oldest undecided timestamp, as last reported
    reading: int | None = None  # its oldest active read, as last reported
    reported: bool = False  # until it has, it may hold anything (the leader restarted)


class Clock:
    def __init__(self, oracle: TimestampOracle, members: int, leader: int = 0) -> None:
        self.oracle = oracle
        self.leader = leader
        # The leader's own member is reported in every step; a follower holds the watermarks
        # at 0 until its first report (after a restart of the leader, or a takeover, it may
        # hold transactions timestamped by the previous one), and a dead former leader until
        # another adopted its decision log (``forget``).
        self._members = [_Member(reported=m == leader) for m in range(members)]
        self._seq = 0
        self.grants = 0  # grants made (metrics)
        self.epoch = 0
        self.configuration = b"{}"

    @property
    def members(self) -> int:
        return len(self._members)

    def grant(
        self, member: int, count: int, read: bool = False, writes: Writes | None = None
    ) -> Grant:
        """``count`` timestamps for ``member``'s waiting transactions, and a read timestamp if
        it has reads waiting; ``writes``: what those transactions write in cached tables."""
        held = self._members[member]
        self._seq += 1
        self.grants += 1
        read_ts = self.oracle.current() if read else 0
        if read:
            held.reads[self._seq] = read_ts
        first, notice = 0, None
        if count:
            first = self.oracle.take(count)
            held.writes[self._seq] = first
            last = first + count - 1
            if writes is not None and writes.epoch < self.epoch:
                notice = Notice(first, last, everything=True)
            elif writes:
                notice = Notice(first, last, writes.rows, writes.tables)
        return Grant(self._seq, first, count, read_ts, self.epoch, notice)

    def connected(self, member: int) -> None:
        """A new stream from ``member``: the grants sent on its previous one that it has not
        acknowledged never reached it, or were decided before it restarted. Its first
        report follows in the same message."""
        held = self._members[member]
        held.writes.clear()
        held.reads.clear()

    def forget(self, member: int) -> None:
        """``member`` died and another took over its decision log: each of its timestamps is
        committed (the log has it) or aborted, and no request of its own will come, so it
        holds nothing back until a new stream of its says otherwise."""
        self._members[member] = _Member(reported=True)

    def report(self, member: int, seq: int, undecided: int | None, reading: int | None) -> None:
        """What ``member`` holds after every grant up to ``seq``."""
        held = self._members[member]
        held.reported = True
        held.undecided, held.reading = undecided, reading
        for grants in (held.writes, held.reads):
            for s in [s for s in grants if s <= seq]:
                del grants[s]

    def publish(self, epoch: int, configuration: bytes) -> None:
        """A new catalog epoch, for every timestamp granted from now on, and what members
        need to run under it (handed to each with its next grant)."""
        self.epoch = epoch
        self.configuration = configuration

    def marks(self) -> Marks:
        issued = self.oracle.current()
        oldest = issued + 1
        reading = issued
        for held in self._members:
            if not held.reported:
                oldest = 1
            if held.undecided is not None:
                oldest = min(oldest, held.undecided)
            if held.writes:
                oldest = min(oldest, *held.writes.values())
            if held.reading is not None:
                reading = min(reading, held.reading)
            if held.reads:
                reading = min(reading, *held.reads.values())
        decided = oldest - 1
        return Marks(issued, decided, min(decided, reading), self.epoch)
