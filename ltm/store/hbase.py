"""The HBase store: happybase over HBase's Thrift (thrift1) server.

One HBase table per store table (named ``<table_prefix>_<name>``), one column family ``d`` with
one version, each store value in the single cell ``d:v`` of the row whose key is the store key
(the order-preserving key bytes, unchanged, so HBase's byte order is the store's order).

Atomicity: HBase only makes a *single row* atomic. :meth:`HBaseStore._write` therefore cannot
apply a batch all-or-none across rows; it checks first that every table exists (so a batch
naming an unknown table still applies nothing), then sends per-table batches. What makes a
transaction atomic on HBase is the LTM's write-ahead log: a checkpoint drops log segments only
after its store write succeeded, and recovery replays the log over the store idempotently (a
change is applied only if its LSN is above the stored row's), so a checkpoint cut short leaves
rows that the replay finishes. The coordinator's catalog writes are single rows.

A compare-and-set (a guarded write whose one mutation puts the guard key itself) is one
``checkAndPut`` call: atomic, like every single-row operation of HBase. Other guarded writes
check the guard, then write (the base class's two steps): ``checkAndPut`` puts one cell of the
row it checks, and Thrift1 has no call that checks one row and writes others.

Connections come from a :class:`happybase.ConnectionPool`. HBase's Thrift server drops idle
sockets (``hbase.thrift.server.socket.read.timeout``) and restarts lose every connection, so
each call is retried on a fresh connection after transport errors (``TSocket read 0 bytes``,
broken pipe, connection reset, ...) until ``retry_seconds`` have passed; then it fails with
:class:`aggview.errors.Unavailable` naming the address.
"""

from __future__ import annotations

import importlib
import logging
import re
import socket
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

import happybase
from thriftpy2.protocol.exc import TProtocolException
from thriftpy2.thrift import TException
from thriftpy2.transport import TTransportException

from aggview.errors import InvalidArgument, StoreError, Unavailable, UnknownTable
from aggview.retry import RetryPolicy, retry_on
from ltm.store.base import GuardFailed, Mutation, Store

# happybase loads HBase's Thrift IDL as the top-level module ``Hbase_thrift`` when imported;
# its exception types are what the server raises.
_hbase_thrift: Any = importlib.import_module("Hbase_thrift")
HBaseIOError: type[Exception] = _hbase_thrift.IOError
HBaseAlreadyExists: type[Exception] = _hbase_thrift.AlreadyExists
HBaseMutation: Any = _hbase_thrift.Mutation

T = TypeVar("T")
log = logging.getLogger(__name__)

FAMILY = "d"
COLUMN = b"d:v"
DEFAULT_PORT = 9090
DEFAULT_PREFIX = "aggview"
_GET_CHUNK = 1000  # rows per getRows call
MAX_BATCH_BYTES = 1 << 20  # keys and values per mutateRows call, at most (or one bigger row)
# What one row may hold, measured on a real HBase 2.6: the client side of its Thrift server
# refuses a cell over hbase.client.keyvalue.maxsize (10 MiB by default), and a framed Thrift
# server drops the connection on a call over hbase.thrift.framed.max_frame_size_in_mb (2 MiB).
# Both minus room for the rest of the call; the URL's max_row_bytes says otherwise.
DEFAULT_MAX_ROW_BYTES = {"buffered": (10 << 20) - (64 << 10), "framed": (2 << 20) - (64 << 10)}
_PREFIX_RE = re.compile(r"([A-Za-z0-9_]+:)?[A-Za-z0-9_][A-Za-z0-9_.-]*")
_STORE_NAME_RE = re.compile(r"[A-Za-z0-9_]{1,200}")

# Errors after which the connection is in an unknown state and a fresh one may succeed:
# HBase's Thrift server closing an idle socket shows as "TSocket read 0 bytes" (end of file),
# a broken pipe or a reset; a restart as a refused connection (all OSError or transport).
_TRANSIENT: tuple[type[BaseException], ...] = (
    TTransportException,
    TProtocolException,
    OSError,
    EOFError,
)


def _check_options(
    table_prefix: str | None,
    transport: str,
    protocol: str,
    *,
    pool_size: int,
    timeout_ms: int,
    scan_batch_size: int,
    max_row_bytes: int | None,
    batch_size: int,
    retry_seconds: float,
    connect_timeout: float,
) -> None:
    """Refuses, naming it, an option of the store's URL that cannot work, before any connect."""
    if table_prefix is not None and not _PREFIX_RE.fullmatch(table_prefix):
        raise InvalidArgument(
            f"hbase table_prefix must be letters, digits, '_', '.' or '-' (optionally "
            f"after 'namespace:'); got {table_prefix!r}"
        )
    if transport not in ("buffered", "framed"):
        raise InvalidArgument(f"hbase transport must be buffered or framed; got {transport!r}")
    if protocol not in ("binary", "compact"):
        raise InvalidArgument(f"hbase protocol must be binary or compact; got {protocol!r}")
    for what, value in (
        ("pool_size", pool_size),
        ("timeout_ms", timeout_ms),
        ("scan_batch_size", scan_batch_size),
        *((("max_row_bytes", max_row_bytes),) if max_row_bytes is not None else ()),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgument(f"hbase {what} must be a positive int; got {value!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
        raise InvalidArgument(f"hbase batch_size must be an int >= 0; got {batch_size!r}")
    if retry_seconds < 0 or connect_timeout <= 0:
        raise InvalidArgument("hbase retry_seconds must be >= 0 and connect_timeout > 0")


class HBaseStore(Store):
    """Store tables as HBase tables, reached through HBase's Thrift server.

    ``batch_size`` is the number of rows per ``mutateRows`` call (``table.batch``); 0 sends one
    call per row (no batching, for measurements). ``scan_batch_size`` bounds the rows one
    ``scannerGetList`` fetches. Opening fails fast with :class:`Unavailable` if no Thrift call
    succeeds, so a server never starts half-way on a store it cannot reach.
    """

    fast_point_reads = False  # every read is a network round trip

    def __init__(
        self,
        host: str,
        port: int = DEFAULT_PORT,
        *,
        table_prefix: str | None = DEFAULT_PREFIX,
        transport: str = "buffered",
        protocol: str = "binary",
        pool_size: int = 8,
        timeout_ms: int = 30_000,
        connect_timeout: float = 5.0,
        batch_size: int = 1000,
        scan_batch_size: int = 1000,
        retry_seconds: float = 10.0,
        max_row_bytes: int | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        _check_options(
            table_prefix,
            transport,
            protocol,
            pool_size=pool_size,
            timeout_ms=timeout_ms,
            scan_batch_size=scan_batch_size,
            max_row_bytes=max_row_bytes,
            batch_size=batch_size,
            retry_seconds=retry_seconds,
            connect_timeout=connect_timeout,
        )
        self.max_row_bytes = max_row_bytes or DEFAULT_MAX_ROW_BYTES[transport]
        self.table_prefix = table_prefix or None
        self.transport = transport
        self.protocol = protocol
        self.pool_size = pool_size
        self.batch_size = batch_size
        self.scan_batch_size = scan_batch_size
        self.retry_seconds = retry_seconds
        # Every pooled connection may be stale (an idle close hits them all): those retries go
        # at once; after that, back off (20 ms doubling to 1 s) until the deadline.
        self._retry = RetryPolicy(
            attempts=None,
            first_delay=0.02,
            max_delay=1.0,
            spread=(1.0, 1.0),
            deadline=retry_seconds,
            immediate=pool_size,
            retryable=retry_on(*_TRANSIENT),
        )
        self._acquire_timeout = max(timeout_ms / 1000, retry_seconds, 1.0)
        self._name_prefix = (self.table_prefix + "_").encode() if self.table_prefix else b""
        self._pool = self._open_pool(pool_size, timeout_ms, connect_timeout)

    def _open_pool(
        self, pool_size: int, timeout_ms: int, connect_timeout: float
    ) -> happybase.ConnectionPool:
        """The connection pool, once a Thrift call through it succeeded: a store that cannot
        be reached fails here, with its address, not at first use."""
        host, port = self.host, self.port
        transport, protocol = self.transport, self.protocol

        # A plain TCP connect first: a host that drops packets fails within connect_timeout
        # (happybase would wait for the whole socket timeout), with the address in the error.
        try:
            socket.create_connection((host, port), timeout=connect_timeout).close()
        except OSError as exc:
            raise self._unreachable(exc) from exc
        try:
            pool = happybase.ConnectionPool(
                pool_size,
                host=host,
                port=port,
                timeout=timeout_ms,
                table_prefix=self.table_prefix,
                transport=transport,
                protocol=protocol,
            )
            # A real Thrift call, not just a socket: a wrong transport or protocol, or a
            # Thrift server without HBase behind it, fails here rather than at first use.
            with pool.connection(timeout=self._acquire_timeout) as conn:
                conn.client.getTableNames()
        except (TException, OSError, EOFError) as exc:
            raise self._unreachable(exc) from exc
        return pool

    @classmethod
    def from_url(cls, url: str) -> HBaseStore:
        """``hbase://host[:port][?table_prefix=P&transport=buffered|framed&protocol=binary|
        compact&batch_size=N&scan_batch_size=N&pool_size=N&timeout_ms=N&retry_seconds=S&
        max_row_bytes=N]``.

        An empty ``table_prefix=`` uses table names unprefixed."""
        parts = urlsplit(url)
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError:
            raise InvalidArgument(f"hbase store URL {url!r}: bad port") from None
        if parts.scheme.lower() != "hbase" or not parts.hostname or parts.path not in ("", "/"):
            raise InvalidArgument(
                f"hbase store URL must be hbase://host[:port][?options]; got {url!r}"
            )
        options: dict[str, Any] = {}
        converters: dict[str, Callable[[str], Any]] = {
            "table_prefix": str,
            "transport": str,
            "protocol": str,
            "batch_size": int,
            "scan_batch_size": int,
            "pool_size": int,
            "timeout_ms": int,
            "retry_seconds": float,
            "connect_timeout": float,
            "max_row_bytes": int,
        }
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            convert = converters.get(key)
            if convert is None:
                raise InvalidArgument(
                    f"hbase store URL {url!r}: unknown option {key!r}; "
                    f"known: {', '.join(converters)}"
                )
            try:
                options[key] = convert(value)
            except ValueError:
                raise InvalidArgument(f"hbase store URL {url!r}: bad {key}={value!r}") from None
        return cls(parts.hostname, port, **options)

    def __repr__(self) -> str:
        return f"HBaseStore('hbase://{self.address}', table_prefix={self.table_prefix!r})"

    # --- calls and retries ----------------------------------------------------------------

    def _unreachable(self, exc: BaseException) -> Unavailable:
        return Unavailable(
            f"hbase store {self.address}: HBase Thrift server unreachable ({exc!r}); check "
            f"that it runs (hbase thrift start) and serves transport={self.transport}, "
            f"protocol={self.protocol}"
        )

    def _call(
        self, what: str, action: Callable[[happybase.Connection], T], *, write: bool = False
    ) -> T:
        """Run ``action`` on a pooled connection, retrying transport failures on a fresh one.

        Reads are retried freely. Writes are retried too: they are puts and deletes of whole
        values, so sending a batch again (even one the server applied before the connection
        broke) leaves the same rows. A socket *timeout* is not retried for a write: the server
        may still be applying the first attempt, which could land after the retry.
        """
        attempts = 0

        def once() -> T:
            nonlocal attempts
            self._check_open()
            attempts += 1
            try:
                # The pool replaces a connection that raised a Thrift or socket error.
                with self._pool.connection(timeout=self._acquire_timeout) as conn:
                    return action(conn)
            except happybase.NoConnectionsAvailable as exc:
                raise Unavailable(
                    f"hbase store {self.address}: {what}: no pooled connection free "
                    f"within {self._acquire_timeout:g}s"
                ) from exc
            except TimeoutError as exc:
                if write:
                    raise Unavailable(
                        f"hbase store {self.address}: {what} timed out ({exc}); not retried"
                    ) from exc
                raise
            except _TRANSIENT:
                raise
            except TException as exc:  # an application error the action did not translate
                raise StoreError(f"hbase store {self.address}: {what}: {exc!r}") from exc

        def retrying(failure: BaseException, failed: int, wait: float) -> None:
            log.info("hbase store %s: %s: %r; retrying", self.address, what, failure)

        try:
            return self._retry.run(once, retrying)
        except _TRANSIENT as failure:
            raise Unavailable(
                f"hbase store {self.address}: {what} failed after {attempts} attempts "
                f"in {self.retry_seconds:g}s: {failure!r}"
            ) from failure

    def _hbase_name(self, table: str) -> bytes:
        return self._name_prefix + table.encode()

    def _existing(self, conn: happybase.Connection) -> set[bytes]:
        """Full HBase names of all tables (one getTableNames call)."""
        return set(conn.client.getTableNames())

    def _server_error(
        self, conn: happybase.Connection, table: str, what: str, exc: Exception
    ) -> Exception:
        """HBase reports a missing table as an IOError; tell that apart from other failures."""
        if self._hbase_name(table) not in self._existing(conn):
            return UnknownTable(f"store table {table!r} does not exist")
        message = getattr(exc, "message", exc)
        if isinstance(message, bytes):
            message = message.decode(errors="replace")
        return StoreError(f"hbase store {self.address}: {what} on {table!r}: {message}")

    # --- Store primitives -----------------------------------------------------------------

    def _create_table(self, name: str) -> None:
        def action(conn: happybase.Connection) -> None:
            try:
                conn.create_table(name, {FAMILY: {"max_versions": 1}})
            except HBaseAlreadyExists:
                pass  # created meanwhile, or by an attempt whose reply was lost
            except HBaseIOError as exc:
                # Two creators at once: the Thrift server's own check passed for both, and
                # HBase's master refuses the second with a TableExistsException (an IOError).
                if self._hbase_name(name) not in self._existing(conn):
                    raise self._server_error(conn, name, "create", exc) from exc

        self._call(f"create table {name!r}", action)

    def _drop_table(self, name: str) -> None:
        full = self._hbase_name(name)

        def action(conn: happybase.Connection) -> None:
            if full not in self._existing(conn):
                return
            try:
                if conn.client.isTableEnabled(full):
                    conn.client.disableTable(full)
                conn.client.deleteTable(full)
            except HBaseIOError as exc:
                if full in self._existing(conn):  # not a concurrent drop: a real failure
                    raise self._server_error(conn, name, "drop", exc) from exc

        self._call(f"drop table {name!r}", action)

    def _list_tables(self) -> list[str]:
        def action(conn: happybase.Connection) -> list[str]:
            names = (n.decode(errors="replace") for n in conn.tables())
            # Tables of other applications in an unprefixed HBase are not store tables.
            return [n for n in names if _STORE_NAME_RE.fullmatch(n)]

        return self._call("list tables", action)

    def _get_many(self, table: str, keys: list[bytes]) -> dict[bytes, bytes]:
        def action(conn: happybase.Connection) -> dict[bytes, bytes]:
            found: dict[bytes, bytes] = {}
            hbase_table = conn.table(table)
            try:
                if not keys and self._hbase_name(table) not in self._existing(conn):
                    raise UnknownTable(f"store table {table!r} does not exist")
                for i in range(0, len(keys), _GET_CHUNK):
                    rows = hbase_table.rows(keys[i : i + _GET_CHUNK], columns=[COLUMN])
                    for key, cells in rows:
                        value = cells.get(COLUMN)
                        if value is not None:
                            found[key] = value
            except HBaseIOError as exc:
                raise self._server_error(conn, table, "get", exc) from exc
            return found

        return self._call(f"get from {table!r}", action)

    def _write(self, mutations: list[Mutation], tables: list[str]) -> None:
        """Apply the mutations table by table in ``mutateRows`` batches.

        Not atomic across rows (HBase is atomic per row only): the LTM's write-ahead log,
        replayed idempotently on recovery, is what makes a transaction all-or-none. What this
        does guarantee: a batch naming a table that does not exist applies nothing.
        """
        by_table: dict[str, list[tuple[bytes, bytes | None]]] = defaultdict(list)
        for table, key, value in mutations:
            self._check_row_size(table, key, value)  # before anything is sent
            by_table[table].append((key, value))

        # Retrying the whole call after a broken connection is safe: every mutation puts or
        # deletes a whole value, so rows a first attempt already wrote are written to the same
        # value again (idempotent), never incremented or appended twice.
        def action(conn: happybase.Connection) -> None:
            existing = self._existing(conn)
            missing = [t for t in tables if self._hbase_name(t) not in existing]
            if missing:
                raise UnknownTable(f"store table {missing[0]!r} does not exist")
            for table, rows in by_table.items():
                hbase_table = conn.table(table)
                try:
                    if self.batch_size:
                        # happybase sends every batch_size rows; big values also end a batch,
                        # under the frame limit of a framed Thrift server (2 MiB by default).
                        batch = hbase_table.batch(batch_size=self.batch_size)
                        pending = 0
                        for count, (key, value) in enumerate(rows, 1):
                            size = len(key) + len(value or b"")
                            if pending and pending + size > MAX_BATCH_BYTES:
                                batch.send()
                                pending = 0
                            if value is None:
                                batch.delete(key, columns=[COLUMN])
                            else:
                                batch.put(key, {COLUMN: value})
                            pending += size
                            if count % self.batch_size == 0:
                                pending = 0  # happybase just sent the batch
                        batch.send()  # not `with batch`: it would send again after an error
                    else:
                        for key, value in rows:
                            if value is None:
                                hbase_table.delete(key, columns=[COLUMN])
                            else:
                                hbase_table.put(key, {COLUMN: value})
                except HBaseIOError as exc:
                    raise self._server_error(conn, table, "write", exc) from exc

        self._call(f"write of {len(mutations)} rows", action, write=True)

    def _check_row_size(self, table: str, key: bytes, value: bytes | None) -> None:
        size = len(key) + len(value or b"")
        if size > self.max_row_bytes:
            raise InvalidArgument(
                f"hbase store {self.address}: row {key[:32]!r} of {table!r} is {size} bytes, "
                f"over the {self.max_row_bytes} one call to HBase's {self.transport} Thrift "
                "server takes (max_row_bytes in the store URL, after raising HBase's limit)"
            )

    def _compare_and_set(
        self, table: str, key: bytes, expected: bytes | None, value: bytes
    ) -> None:
        """One ``checkAndPut`` of cell ``d:v``: HBase checks and puts under the row's lock.

        HBase compares an empty cell and a missing one alike, so a guard that expects either
        reads the key first and fails on the other: exact, unless a writer puts or deletes
        an empty value under the key between that read and the call (nothing here stores an
        empty value under a key it guards). A retry after a lost reply finds the first
        attempt's value in place and fails the check: the key holding ``value`` then counts
        as applied, as it would if another writer had just put the same value.
        """
        self._check_row_size(table, key, value)
        full = self._hbase_name(table)
        put = HBaseMutation(isDelete=False, column=COLUMN, value=value, writeToWAL=True)
        sent = retried = False  # a call was sent; an attempt followed one that sent it

        def action(conn: happybase.Connection) -> bool:
            nonlocal sent, retried
            retried = retried or sent
            try:
                if not expected:
                    held = conn.table(table).row(key, columns=[COLUMN]).get(COLUMN)
                    if held != expected:
                        return False
                sent = True
                return bool(conn.client.checkAndPut(full, key, COLUMN, expected, put, {}))
            except HBaseIOError as exc:
                raise self._server_error(conn, table, "compare-and-set", exc) from exc

        try:
            applied = self._call(f"compare-and-set in {table!r}", action, write=True)
        except UnknownTable:
            if expected is None:
                raise
            applied = False  # a missing table holds no value
        if not applied and retried:
            applied = self._get_many(table, [key]).get(key) == value
        if not applied:
            raise GuardFailed(f"{table}: the guard key holds another value")

    def _scan_page(
        self, table: str, start: bytes | None, stop: bytes | None, limit: int
    ) -> list[tuple[bytes, bytes]]:
        def action(conn: happybase.Connection) -> list[tuple[bytes, bytes]]:
            page: list[tuple[bytes, bytes]] = []
            try:
                # batch_size is the scanner caching and the rows per scannerGetList call;
                # the scanner is closed before returning (a page holds nothing open).
                for key, cells in conn.table(table).scan(
                    row_start=start,
                    row_stop=stop,
                    columns=[COLUMN],
                    batch_size=min(limit, self.scan_batch_size),
                    limit=limit,
                ):
                    value = cells.get(COLUMN)
                    if value is not None:
                        page.append((key, value))
            except HBaseIOError as exc:
                raise self._server_error(conn, table, "scan", exc) from exc
            return page

        return self._call(f"scan of {table!r}", action)

    def _last_key(self, table: str) -> bytes | None:
        def action(conn: happybase.Connection) -> bytes | None:
            try:  # a reversed scan of one row (read to its end: the scanner is closed)
                rows = list(conn.table(table).scan(columns=[COLUMN], reverse=True, limit=1))
            except HBaseIOError as exc:
                raise self._server_error(conn, table, "scan", exc) from exc
            return rows[0][0] if rows else None

        return self._call(f"last key of {table!r}", action)

    def _close(self) -> None:
        # happybase's pool has no close(): drain its idle connections (in-use ones are closed
        # when garbage-collected).
        queue = getattr(self._pool, "_queue", None)
        while queue is not None and not queue.empty():
            try:
                conn = queue.get_nowait()
            except Exception:
                break
            try:
                conn.close()
            except (TException, OSError):
                pass
