"""The store interface: the only thing an LTM needs of HBase or the embedded SQLite store.

Public methods live here and check their arguments once, so every adapter refuses the same
inputs with the same errors; adapters implement the small protected primitives below. Scans
are paged here too, each page a fresh bounded request starting just after the last key seen,
so no adapter holds a lock, cursor or scanner while a slow consumer works through a page.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from types import TracebackType

from aggview.errors import FailedPrecondition, InvalidArgument, StoreError
from aggview.keycodec import prefix_end

Mutation = tuple[str, bytes, bytes | None]
"""(store table, key, value); a value of None deletes the key."""

Guard = tuple[str, bytes, bytes | None]
"""(store table, key, expected value); None expects the key to be absent."""


class GuardFailed(FailedPrecondition):
    """A guarded write found another value under its guard key, and applied nothing."""


_TABLE_NAME_RE = re.compile(r"[A-Za-z0-9_]{1,200}")


def check_table_name(name: object) -> str:
    """Letters, digits and underscore only, so every adapter can use the name verbatim."""
    if not isinstance(name, str) or not _TABLE_NAME_RE.fullmatch(name):
        raise InvalidArgument(
            f"store table name must be 1..200 letters, digits or underscores; got {name!r}"
        )
    return name


def check_key(key: object, what: str = "key") -> bytes:
    if not isinstance(key, bytes | bytearray | memoryview):
        raise InvalidArgument(f"store {what} must be bytes; got {type(key).__name__}")
    key = bytes(key)
    if not key:
        raise InvalidArgument(f"store {what} must not be empty")
    return key


def check_value(value: object) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidArgument(f"store value must be bytes or None; got {type(value).__name__}")
    return bytes(value)


def _check_bound(bound: object, what: str) -> bytes | None:
    if bound is None:
        return None
    if not isinstance(bound, bytes | bytearray | memoryview):
        raise InvalidArgument(f"scan {what} must be bytes or None; got {type(bound).__name__}")
    return bytes(bound) or None  # b"" as start means "from the beginning"


class Store(ABC):
    """Byte-keyed tables with ordered scans.

    Keys are non-empty byte strings ordered bytewise; values are byte strings (possibly empty).
    Methods may be called from several threads at once.
    """

    _closed: bool = False
    # A point lookup costs less than handing it to a thread (an embedded store on local
    # disk): callers on an event loop may then call it directly. Remote stores keep False.
    fast_point_reads: bool = False

    # --- primitives an adapter implements (arguments already checked) ---------------------

    @abstractmethod
    def _create_table(self, name: str) -> None: ...

    @abstractmethod
    def _drop_table(self, name: str) -> None: ...

    @abstractmethod
    def _list_tables(self) -> list[str]: ...

    @abstractmethod
    def _get_many(self, table: str, keys: list[bytes]) -> dict[bytes, bytes]:
        """Present keys only; raise UnknownTable if the table does not exist."""

    @abstractmethod
    def _write(self, mutations: list[Mutation], tables: list[str]) -> None:
        """Apply mutations (no key twice) to ``tables`` (their distinct names), all or none.

        Must raise UnknownTable and apply nothing if one of ``tables`` does not exist.
        """

    @abstractmethod
    def _compare_and_set(
        self, table: str, key: bytes, expected: bytes | None, value: bytes
    ) -> None:
        """Put ``value`` under ``key`` only if it holds ``expected`` (None: absent), as one
        atomic step; else raise GuardFailed. A missing table holds nothing: expecting a value
        there fails the guard, expecting absence raises UnknownTable."""

    def _write_guarded(self, guard: Guard, mutations: list[Mutation], tables: list[str]) -> None:
        """Check the guard, then write. This default is two steps, so a writer that changes
        the guard key in between is missed; adapters that can do both at once override it.
        (A compare-and-set never comes here: :meth:`_compare_and_set`.)"""
        table, key, expected = guard
        current = self._get_many(table, [key]).get(key) if table in self._list_tables() else None
        if current != expected:
            raise GuardFailed(f"{table}: the guard key holds another value")
        self._write(mutations, tables)

    @abstractmethod
    def _scan_page(
        self, table: str, start: bytes | None, stop: bytes | None, limit: int
    ) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` pairs with start <= key < stop in key order, in one bounded request."""

    @abstractmethod
    def _close(self) -> None: ...

    # --- public interface -----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self!r} is closed")

    def create_table(self, name: str) -> None:
        """Create an empty table; a no-op if it exists."""
        self._check_open()
        self._create_table(check_table_name(name))

    def drop_table(self, name: str) -> None:
        """Drop a table and its rows; a no-op if it does not exist."""
        self._check_open()
        self._drop_table(check_table_name(name))

    def list_tables(self) -> list[str]:
        self._check_open()
        return sorted(self._list_tables())

    def get(self, table: str, key: bytes) -> bytes | None:
        self._check_open()
        key = check_key(key)
        return self._get_many(check_table_name(table), [key]).get(key)

    def get_many(self, table: str, keys: Sequence[bytes]) -> dict[bytes, bytes]:
        """Values of the keys that exist, read as of one moment; missing keys are absent."""
        self._check_open()
        check_table_name(table)
        unique = list(dict.fromkeys(check_key(k) for k in keys))
        return self._get_many(table, unique)

    def last_key(self, table: str) -> bytes | None:
        """The greatest key the table holds (None: it holds none). A participant learns from
        it which keys are new without reading them (``ltm.participant.state``)."""
        self._check_open()
        return self._last_key(check_table_name(table))

    @abstractmethod
    def _last_key(self, table: str) -> bytes | None: ...

    def write(self, mutations: Iterable[Mutation]) -> None:
        """Apply puts and deletes, possibly across tables, atomically where the store can.

        When one batch names the same (table, key) more than once, the last mutation wins.
        """
        self._check_open()
        batch = self._checked(mutations)
        if batch:
            self._write(batch, list(dict.fromkeys(t for t, _, _ in batch)))

    @staticmethod
    def _checked(mutations: Iterable[Mutation]) -> list[Mutation]:
        """Checked mutations, the last one of each (table, key) kept, in last-write order."""
        latest: dict[tuple[str, bytes], bytes | None] = {}
        for mutation in mutations:
            try:
                table, key, value = mutation
            except (TypeError, ValueError):
                raise InvalidArgument(
                    f"mutation must be (table, key, value or None); got {mutation!r}"
                ) from None
            entry = (check_table_name(table), check_key(key))
            latest.pop(entry, None)  # re-insert so the batch keeps its last-write order
            latest[entry] = None if value is None else check_value(value)
        return [(t, k, v) for (t, k), v in latest.items()]

    def write_guarded(self, guard: Guard, mutations: Iterable[Mutation]) -> None:
        """Like :meth:`write`, but only if the guard key holds the expected value (else
        :class:`GuardFailed`, nothing applied): a fenced writer (an LTM whose partition moved
        to a newer epoch) cannot overwrite its successor's rows.

        A *compare-and-set* -- the mutations are one put of the guard key itself -- is atomic
        on every adapter: of writers that all expect one value, exactly one wins. Any other
        guarded write (other keys, several, or a delete) is atomic where the adapter can make
        it so: the embedded store checks and writes in one transaction; HBase, atomic per row
        only (its Thrift1 ``checkAndPut`` puts one cell), checks, then writes, so a writer
        that changes the guard key in between is missed.
        """
        self._check_open()
        table, key, expected = guard
        guard = (
            check_table_name(table),
            check_key(key, "guard key"),
            None if expected is None else check_value(expected),
        )
        batch = self._checked(mutations)
        if len(batch) == 1 and batch[0][:2] == guard[:2] and batch[0][2] is not None:
            self._compare_and_set(guard[0], guard[1], guard[2], batch[0][2])
            return
        tables = list(dict.fromkeys(t for t, _, _ in batch))
        self._write_guarded(guard, batch, tables)

    def count(self, table: str) -> int:
        """How many rows a table holds (bulk loads compare it with the rows they staged)."""
        self._check_open()
        return self._count(check_table_name(table))

    def _count(self, table: str) -> int:
        """A full scan; adapters that can count without reading every row override it."""
        return sum(1 for _ in self.scan(table))

    def scan(
        self,
        table: str,
        start: bytes | None = None,
        stop: bytes | None = None,
        *,
        limit: int | None = None,
        batch_size: int = 1000,
    ) -> Iterator[tuple[bytes, bytes]]:
        """Pairs with start <= key < stop in ascending key order, fetched page by page.

        The first page is read before returning, so a bad table fails at the call; later pages
        see writes committed meanwhile beyond the last key returned, never a key twice.
        """
        self._check_open()
        check_table_name(table)
        lower = _check_bound(start, "start")
        upper = _check_bound(stop, "stop")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise InvalidArgument(f"scan limit must be an int or None; got {limit!r}")
        if limit is not None and limit < 0:
            raise InvalidArgument(f"scan limit must not be negative; got {limit}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidArgument(f"scan batch_size must be a positive int; got {batch_size!r}")
        if limit == 0 or (lower is not None and upper is not None and lower >= upper):
            return iter(())
        first_size = batch_size if limit is None else min(batch_size, limit)
        first = self._scan_page(table, lower, upper, first_size)
        return self._pages(table, first, first_size, upper, limit, batch_size)

    def _pages(
        self,
        table: str,
        page: list[tuple[bytes, bytes]],
        asked: int,
        stop: bytes | None,
        limit: int | None,
        batch_size: int,
    ) -> Iterator[tuple[bytes, bytes]]:
        remaining = limit
        while True:
            yield from page
            if remaining is not None:
                remaining -= len(page)
            if len(page) < asked or remaining == 0 or not page:
                return
            self._check_open()
            asked = batch_size if remaining is None else min(batch_size, remaining)
            # last + b"\x00" is the smallest key above last: the next page starts just after it.
            page = self._scan_page(table, page[-1][0] + b"\x00", stop, asked)

    def scan_prefix(
        self,
        table: str,
        prefix: bytes,
        *,
        limit: int | None = None,
        batch_size: int = 1000,
    ) -> Iterator[tuple[bytes, bytes]]:
        """Pairs whose key starts with ``prefix``, in key order (an empty prefix scans all)."""
        if not isinstance(prefix, bytes | bytearray | memoryview):
            raise InvalidArgument(f"scan prefix must be bytes; got {type(prefix).__name__}")
        prefix = bytes(prefix)
        return self.scan(
            table, prefix or None, prefix_end(prefix), limit=limit, batch_size=batch_size
        )

    def close(self) -> None:
        """Release connections; idempotent. Later calls raise StoreError."""
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
