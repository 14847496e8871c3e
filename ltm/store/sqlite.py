"""The embedded store: one SQLite file in WAL mode, shared by threads and processes.

Several LTMs and a coordinator may open the same file, so every write runs in a
``BEGIN IMMEDIATE`` transaction (the writer lock is taken up front, never upgraded, which is
what lets SQLite's busy timeout work instead of failing at once) and lock contention beyond
the busy timeout is retried. Each thread borrows a connection from a small pool for the
length of one call; ``:memory:`` databases exist per connection, so there a single
connection is shared under a lock.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from aggview.errors import StoreError, UnknownTable
from aggview.retry import RetryPolicy
from ltm.store.base import Guard, GuardFailed, Mutation, Store

T = TypeVar("T")

BUSY_TIMEOUT_MS = 30_000
RETRY_SECONDS = 60.0  # beyond the busy timeout, for the busy cases SQLite reports at once
# busy: again after 5, 10, 20 ... 500 ms, each within half of it either way
BUSY_RETRY = RetryPolicy(
    attempts=None,
    first_delay=0.005,
    max_delay=0.5,
    spread=(0.5, 1.5),
    deadline=RETRY_SECONDS,
    retryable=lambda exc: isinstance(exc, sqlite3.OperationalError) and _is_busy(exc),
)
_IN_CHUNK = 500  # bound parameters per SELECT ... IN (...), well under SQLite's limit


def _sql_table(name: str) -> str:
    """Store table name -> SQLite table name, injectively despite SQLite's case folding.

    Names without capitals map to ``t_<name>``; others to ``u_`` plus the name with ``_`` doubled
    and each capital written as ``_`` and its lower-case letter.
    """
    if name == name.lower():
        return f"t_{name}"
    out = ["u_"]
    for ch in name:
        if ch == "_":
            out.append("__")
        elif ch.isupper():
            out.append("_" + ch.lower())
        else:
            out.append(ch)
    return "".join(out)


def _store_table(sql_name: str) -> str | None:
    """Invert :func:`_sql_table`; None for tables that are not store tables."""
    if sql_name.startswith("t_") and len(sql_name) > 2:
        return sql_name[2:]
    if not sql_name.startswith("u_"):
        return None
    out: list[str] = []
    chars = iter(sql_name[2:])
    for ch in chars:
        if ch == "_":
            nxt = next(chars, "")
            out.append("_" if nxt == "_" else nxt.upper())
        else:
            out.append(ch)
    return "".join(out) or None


def _is_busy(exc: sqlite3.Error) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


@contextmanager
def writer_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """The file's writer lock, held for the block (``aggview.processes.paused`` stops a member
    while holding it, so that the member is not stopped inside a write)."""
    connection = sqlite3.connect(
        os.fspath(path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None
    )
    try:
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            connection.execute("ROLLBACK")
    finally:
        connection.close()


def _unknown(table: str) -> UnknownTable:
    return UnknownTable(f"store table {table!r} does not exist")


class SqliteStore(Store):
    """Store tables as SQLite tables ``(k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID``."""

    fast_point_reads = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._memory = self.path == ":memory:"
        self._pool_lock = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._shared_lock = threading.Lock()  # :memory: only: guards the one connection
        if not self._memory:
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"sqlite store {self.path}: cannot create directory: {exc}"
                ) from exc
        # Open one connection now, so a bad path fails here rather than at first use.
        self._idle.append(self._with_retry(self._connect))

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"

    # --- connections ----------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=BUSY_TIMEOUT_MS / 1000,
                isolation_level=None,  # autocommit; transactions are explicit
                check_same_thread=False,  # pooled connections move between threads
            )
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite store {self.path}: cannot open: {exc}") from exc
        try:
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            if not self._memory:
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
        except BaseException:
            conn.close()
            raise
        return conn

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        if self._memory:
            with self._shared_lock:
                self._check_open()
                yield self._idle[0]
            return
        with self._pool_lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._with_retry(self._connect)
        try:
            yield conn
        finally:
            if conn.in_transaction:  # only after an error escaped mid-transaction
                try:
                    conn.rollback()
                except sqlite3.Error:
                    pass
            with self._pool_lock:
                if self._closed:
                    conn.close()
                else:
                    self._idle.append(conn)

    def _with_retry(self, action: Callable[[], T]) -> T:
        """Run ``action``, retrying busy errors with jittered backoff; others become StoreError."""
        try:
            return BUSY_RETRY.run(action)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    def _error(self, exc: sqlite3.Error) -> StoreError:
        return StoreError(f"sqlite store {self.path}: {exc}")

    def _run(self, body: Callable[[sqlite3.Connection], T], *, write: bool) -> T:
        """Run ``body`` in one transaction on a borrowed connection, retried while busy."""

        def attempt() -> T:
            with self._connection() as conn:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    result = body(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.rollback()
                    raise
                return result

        return self._with_retry(attempt)

    # --- Store primitives -----------------------------------------------------------------

    def _create_table(self, name: str) -> None:
        sql = (
            f'CREATE TABLE IF NOT EXISTS "{_sql_table(name)}" '
            "(k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID"
        )
        self._run(lambda conn: conn.execute(sql), write=True)

    def _drop_table(self, name: str) -> None:
        sql = f'DROP TABLE IF EXISTS "{_sql_table(name)}"'
        self._run(lambda conn: conn.execute(sql), write=True)

    def _list_tables(self) -> list[str]:
        rows = self._run(
            lambda conn: conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'"
            ).fetchall(),
            write=False,
        )
        names = (_store_table(row[0]) for row in rows)
        return [n for n in names if n is not None]

    @staticmethod
    def _missing_tables(conn: sqlite3.Connection, tables: list[str]) -> list[str]:
        sql_names = [_sql_table(t) for t in tables]
        marks = ",".join("?" * len(sql_names))
        found = {
            row[0]
            for row in conn.execute(
                f"SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ({marks})",
                sql_names,
            )
        }
        return [t for t, s in zip(tables, sql_names, strict=True) if s not in found]

    def _get_many(self, table: str, keys: list[bytes]) -> dict[bytes, bytes]:
        sql_table = _sql_table(table)
        if not keys:
            return {}
        if len(keys) <= _IN_CHUNK:  # one statement reads one snapshot: no BEGIN, no COMMIT
            return self._with_retry(lambda: self._select_keys(table, sql_table, keys))

        def body(conn: sqlite3.Connection) -> dict[bytes, bytes]:
            if self._missing_tables(conn, [table]):
                raise _unknown(table)
            found: dict[bytes, bytes] = {}
            for i in range(0, len(keys), _IN_CHUNK):
                chunk = keys[i : i + _IN_CHUNK]
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(f'SELECT k, v FROM "{sql_table}" WHERE k IN ({marks})', chunk)
                found.update((bytes(k), bytes(v)) for k, v in rows)
            return found

        return self._run(body, write=False)

    def _select_keys(self, table: str, sql_table: str, keys: list[bytes]) -> dict[bytes, bytes]:
        """A point read on the hot path (every new row's first access): the statement itself
        says if the table is missing, instead of a look in sqlite_master first."""
        marks = ",".join("?" * len(keys))
        with self._connection() as conn:
            try:
                rows = conn.execute(f'SELECT k, v FROM "{sql_table}" WHERE k IN ({marks})', keys)
                return {bytes(k): bytes(v) for k, v in rows}
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    raise _unknown(table) from None
                raise

    def _count(self, table: str) -> int:
        sql_table = _sql_table(table)

        def body(conn: sqlite3.Connection) -> int:
            if self._missing_tables(conn, [table]):
                raise _unknown(table)
            return int(conn.execute(f'SELECT COUNT(*) FROM "{sql_table}"').fetchone()[0])

        return self._run(body, write=False)

    def _last_key(self, table: str) -> bytes | None:
        sql = f'SELECT k FROM "{_sql_table(table)}" ORDER BY k DESC LIMIT 1'

        def body(conn: sqlite3.Connection) -> bytes | None:
            if self._missing_tables(conn, [table]):
                raise _unknown(table)
            row = conn.execute(sql).fetchone()
            return None if row is None else bytes(row[0])

        return self._run(body, write=False)

    def _write(self, mutations: list[Mutation], tables: list[str]) -> None:
        self._run(lambda conn: self._apply(conn, mutations, tables), write=True)

    def _compare_and_set(
        self, table: str, key: bytes, expected: bytes | None, value: bytes
    ) -> None:
        self._write_guarded((table, key, expected), [(table, key, value)], [table])

    def _write_guarded(self, guard: Guard, mutations: list[Mutation], tables: list[str]) -> None:
        """The check and the write in one IMMEDIATE transaction: atomic across processes."""
        table, key, expected = guard

        def body(conn: sqlite3.Connection) -> None:
            current = None
            if not self._missing_tables(conn, [table]):
                sql = f'SELECT v FROM "{_sql_table(table)}" WHERE k = ?'
                found = conn.execute(sql, (key,)).fetchone()
                current = None if found is None else bytes(found[0])
            if current != expected:
                raise GuardFailed(f"{table}: the guard key holds another value")
            self._apply(conn, mutations, tables)

        self._run(body, write=True)

    def _apply(
        self, conn: sqlite3.Connection, mutations: list[Mutation], tables: list[str]
    ) -> None:
        missing = self._missing_tables(conn, tables)
        if missing:
            raise _unknown(missing[0])
        for table, key, value in mutations:
            sql_table = _sql_table(table)
            if value is None:
                conn.execute(f'DELETE FROM "{sql_table}" WHERE k = ?', (key,))
            else:
                conn.execute(
                    f'INSERT OR REPLACE INTO "{sql_table}" (k, v) VALUES (?, ?)', (key, value)
                )

    def _scan_page(
        self, table: str, start: bytes | None, stop: bytes | None, limit: int
    ) -> list[tuple[bytes, bytes]]:
        conditions: list[str] = []
        params: list[object] = []
        if start is not None:
            conditions.append("k >= ?")
            params.append(start)
        if stop is not None:
            conditions.append("k < ?")
            params.append(stop)
        where = f"WHERE {' AND '.join(conditions)} " if conditions else ""
        sql = f'SELECT k, v FROM "{_sql_table(table)}" {where}ORDER BY k LIMIT ?'
        params.append(limit)

        def body(conn: sqlite3.Connection) -> list[tuple[bytes, bytes]]:
            if self._missing_tables(conn, [table]):
                raise _unknown(table)
            return [(bytes(k), bytes(v)) for k, v in conn.execute(sql, params)]

        return self._run(body, write=False)

    def _close(self) -> None:
        with self._shared_lock if self._memory else self._pool_lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            try:
                conn.close()
            except sqlite3.Error:
                pass
