"""TEST FIXTURE, not a product backend: a stand-in for HBase's Thrift (thrift1) server.

It speaks the real wire protocol (thriftpy2 over the ``Hbase.thrift`` IDL that happybase ships)
on a real TCP socket, so the real happybase client and the real ``hbase://`` store adapter talk
to it unchanged, from this process or from server processes the tests start. It keeps tables in
memory (a dict per table plus a sorted key list: bytewise order, as HBase) and implements only
the subset of the Thrift1 API the adapter and happybase use; anything else answers
``TApplicationException``. One version per cell, no regions, no durability.

For failure tests it can drop every client connection (what HBase's Thrift server does to idle
sockets), drop the connection on a chosen call (before or after applying it), and be stopped and
started again on the same port (HBase going away and coming back, data kept).

Run standalone (benchmarks use this, so client and server do not share one GIL)::

    python tests/hbase_thrift_fixture.py [--port N]   # prints "... listening on HOST:PORT"
"""

from __future__ import annotations

import argparse
import bisect
import collections
import importlib
import itertools
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import happybase  # noqa: F401  (loads the Hbase_thrift module from happybase's IDL)
from thriftpy2.protocol import TBinaryProtocolFactory, TCompactProtocolFactory
from thriftpy2.thrift import TApplicationException, TProcessor
from thriftpy2.transport import (
    TBufferedTransportFactory,
    TFramedTransportFactory,
    TSocket,
    TTransportException,
)

H: Any = importlib.import_module("Hbase_thrift")

_TABLE_NAME_RE = re.compile(rb"([A-Za-z0-9_]+:)?[A-Za-z0-9_][A-Za-z0-9_.-]*")


class _DropConnection(Exception):
    """Raised inside a call to make the server close the client's socket without a reply."""


@dataclass
class _Table:
    families: dict[bytes, Any]  # b"d:" -> ColumnDescriptor
    enabled: bool = True
    rows: dict[bytes, dict[bytes, tuple[bytes, int]]] = field(default_factory=dict)
    keys: list[bytes] = field(default_factory=list)  # sorted row keys

    def delete_row(self, key: bytes) -> None:
        if self.rows.pop(key, None) is not None:
            del self.keys[bisect.bisect_left(self.keys, key)]


@dataclass
class _Scanner:
    table: bytes
    next_key: bytes
    stop: bytes | None
    columns: list[bytes] | None
    # reversed (HBase's semantics): from ``next_key`` (inclusive; b"": the last row) down to
    # ``stop`` (exclusive); ``below``: rows still to come are below it
    reversed: bool = False
    below: bytes | None = None


@dataclass
class _Fault:
    method: str
    after_apply: bool
    remaining: int
    skip: int  # calls let through before the first failure


def _io_error(message: str) -> Exception:
    exc: Exception = H.IOError(message=message)
    return exc


class _Handler:
    """The Thrift1 methods, called with arguments in IDL order (one thread per connection)."""

    def __init__(self, server: HBaseThriftFixture) -> None:
        self._server = server
        self._lock = server.lock
        self._tables = server.tables
        self._scanners: dict[int, _Scanner] = {}
        self._scanner_ids = itertools.count(1)
        self._clock = itertools.count(int(time.time() * 1000))

    def __getattr__(self, name: str) -> Callable[..., Any]:
        """Methods of the IDL this fixture does not implement: a clear application error."""

        def unsupported(*args: object) -> None:
            raise TApplicationException(
                TApplicationException.UNKNOWN_METHOD,
                f"{name} is not implemented by the HBase Thrift test fixture",
            )

        return unsupported

    # --- helpers --------------------------------------------------------------------------

    def _table(self, name: bytes, *, enabled: bool = True) -> _Table:
        table = self._tables.get(name)
        if table is None:
            raise _io_error(f"org.apache.hadoop.hbase.TableNotFoundException: {name!r}")
        if enabled and not table.enabled:
            raise _io_error(f"org.apache.hadoop.hbase.TableNotEnabledException: {name!r}")
        return table

    @staticmethod
    def _wanted(columns: list[bytes] | None) -> Callable[[bytes], bool]:
        if not columns:
            return lambda column: True
        exact = {c for c in columns if b":" in c and not c.endswith(b":")}
        families = {c.split(b":")[0] + b":" for c in columns if c not in exact}
        return lambda column: column in exact or column.split(b":")[0] + b":" in families

    def _result(self, table: _Table, key: bytes, columns: list[bytes] | None) -> Any | None:
        cells = table.rows.get(key)
        if not cells:
            return None
        wanted = self._wanted(columns)
        picked = {c: H.TCell(value=v, timestamp=ts) for c, (v, ts) in cells.items() if wanted(c)}
        if not picked:
            return None
        return H.TRowResult(row=key, columns=picked)

    def _apply(self, table: _Table, row: bytes, mutations: list[Any], ts: int) -> None:
        if not row:
            raise H.IllegalArgument(message="row key must not be empty")
        for mutation in mutations:
            column = mutation.column or b""
            family = column.split(b":")[0] + b":"
            if family not in table.families:
                raise _io_error(
                    f"org.apache.hadoop.hbase.regionserver.NoSuchColumnFamilyException: {family!r}"
                )
        cells = table.rows.get(row)
        if cells is None:
            cells = {}
        for mutation in mutations:
            column = mutation.column if b":" in mutation.column else mutation.column + b":"
            if mutation.isDelete:
                if column.endswith(b":"):  # a whole family
                    for c in [c for c in cells if c.startswith(column)]:
                        del cells[c]
                else:
                    cells.pop(column, None)
            else:
                cells[column] = (mutation.value or b"", ts)
        if cells and row not in table.rows:
            bisect.insort(table.keys, row)
            table.rows[row] = cells
        elif not cells:
            table.delete_row(row)
        self._server.rows_mutated += 1

    def _mutate(self, method: str, name: bytes, batches: list[tuple[bytes, list[Any]]]) -> None:
        fault = self._server.take_fault(method)
        if fault is not None and not fault.after_apply:
            raise _DropConnection
        with self._lock:
            table = self._table(name)
            ts = next(self._clock)
            for row, mutations in batches:
                self._apply(table, row, mutations, ts)
        if fault is not None:
            raise _DropConnection

    # --- tables ---------------------------------------------------------------------------

    def getTableNames(self) -> list[bytes]:
        with self._lock:
            return sorted(self._tables)

    def createTable(self, tableName: bytes, columnFamilies: list[Any]) -> None:
        if not _TABLE_NAME_RE.fullmatch(tableName or b""):
            raise H.IllegalArgument(message=f"illegal table name {tableName!r}")
        if not columnFamilies:
            raise H.IllegalArgument(message="a table needs at least one column family")
        families = {}
        for descriptor in columnFamilies:
            name = descriptor.name if descriptor.name.endswith(b":") else descriptor.name + b":"
            families[name] = descriptor
        with self._lock:
            if tableName in self._tables:
                raise H.AlreadyExists(message=f"table {tableName!r} already exists")
            self._tables[tableName] = _Table(families)

    def deleteTable(self, tableName: bytes) -> None:
        with self._lock:
            table = self._table(tableName, enabled=False)
            if table.enabled:
                raise _io_error(f"org.apache.hadoop.hbase.TableNotDisabledException: {tableName!r}")
            del self._tables[tableName]

    def disableTable(self, tableName: bytes) -> None:
        with self._lock:
            table = self._table(tableName)
            table.enabled = False

    def enableTable(self, tableName: bytes) -> None:
        with self._lock:
            table = self._table(tableName, enabled=False)
            if table.enabled:
                raise _io_error(f"org.apache.hadoop.hbase.TableNotDisabledException: {tableName!r}")
            table.enabled = True

    def isTableEnabled(self, tableName: bytes) -> bool:
        with self._lock:
            return self._table(tableName, enabled=False).enabled

    def getColumnDescriptors(self, tableName: bytes) -> dict[bytes, Any]:
        with self._lock:
            return dict(self._table(tableName, enabled=False).families)

    # --- rows -----------------------------------------------------------------------------

    def mutateRow(
        self, tableName: bytes, row: bytes, mutations: list[Any], attributes: object
    ) -> None:
        self._mutate("mutateRow", tableName, [(row, mutations)])

    def mutateRows(self, tableName: bytes, rowBatches: list[Any], attributes: object) -> None:
        self._mutate("mutateRows", tableName, [(b.row, b.mutations) for b in rowBatches])

    def checkAndPut(
        self,
        tableName: bytes,
        row: bytes,
        column: bytes,
        value: bytes | None,
        mput: Any,
        attributes: object,
    ) -> bool:
        """As HBase 2.6 does it: an empty cell and a missing one compare alike (``value``
        None or empty matches both), and ``mput`` is always a put (``isDelete`` ignored)."""
        fault = self._server.take_fault("checkAndPut")
        if fault is not None and not fault.after_apply:
            raise _DropConnection
        with self._lock:
            table = self._table(tableName)
            held = table.rows.get(row, {}).get(column)
            matches = (held[0] if held else b"") == (value or b"")
            if matches:
                put = H.Mutation(isDelete=False, column=mput.column, value=mput.value or b"")
                self._apply(table, row, [put], next(self._clock))
        if fault is not None:
            raise _DropConnection
        return matches

    def deleteAllRow(self, tableName: bytes, row: bytes, attributes: object) -> None:
        with self._lock:
            self._table(tableName).delete_row(row)

    def getRowsWithColumns(
        self, tableName: bytes, rows: list[bytes], columns: list[bytes] | None, attributes: object
    ) -> list[Any]:
        fault = self._server.take_fault("getRowsWithColumns")
        if fault is not None:
            raise _DropConnection
        with self._lock:
            table = self._table(tableName)
            results = (self._result(table, row, columns) for row in rows)
            return [r for r in results if r is not None]

    def getRows(self, tableName: bytes, rows: list[bytes], attributes: object) -> list[Any]:
        return self.getRowsWithColumns(tableName, rows, None, attributes)

    def getRowWithColumns(
        self, tableName: bytes, row: bytes, columns: list[bytes] | None, attributes: object
    ) -> list[Any]:
        return self.getRowsWithColumns(tableName, [row], columns, attributes)

    def getRow(self, tableName: bytes, row: bytes, attributes: object) -> list[Any]:
        return self.getRowsWithColumns(tableName, [row], None, attributes)

    # --- scanners -------------------------------------------------------------------------

    def _open_scanner(
        self,
        name: bytes,
        start: bytes | None,
        stop: bytes | None,
        columns: list[bytes] | None,
        reverse: bool = False,
    ) -> int:
        with self._lock:
            self._table(name)
            scanner_id = next(self._scanner_ids)
            self._scanners[scanner_id] = _Scanner(
                name, start or b"", stop or None, columns, reversed=reverse
            )
            return scanner_id

    def scannerOpenWithScan(self, tableName: bytes, scan: Any, attributes: object) -> int:
        if scan.filterString or scan.timestamp is not None:
            raise H.IllegalArgument(message="the test fixture scans without filters or timestamps")
        return self._open_scanner(
            tableName, scan.startRow, scan.stopRow, scan.columns, bool(scan.reversed)
        )

    def scannerOpen(
        self, tableName: bytes, startRow: bytes, columns: list[bytes], attributes: object
    ) -> int:
        return self._open_scanner(tableName, startRow, None, columns)

    def scannerOpenWithStop(
        self,
        tableName: bytes,
        startRow: bytes,
        stopRow: bytes,
        columns: list[bytes],
        attributes: object,
    ) -> int:
        return self._open_scanner(tableName, startRow, stopRow, columns)

    def scannerOpenWithPrefix(
        self, tableName: bytes, startAndPrefix: bytes, columns: list[bytes], attributes: object
    ) -> int:
        stop = startAndPrefix.rstrip(b"\xff")
        stop = stop[:-1] + bytes([stop[-1] + 1]) if stop else b""
        return self._open_scanner(tableName, startAndPrefix, stop or None, columns)

    def scannerGetList(self, id: int, nbRows: int) -> list[Any]:
        if self._server.take_fault("scannerGetList") is not None:
            raise _DropConnection
        with self._lock:
            scanner = self._scanners.get(id)
            if scanner is None:
                raise H.IllegalArgument(message=f"scanner ID {id} is invalid")
            table = self._table(scanner.table)
            if scanner.reversed:
                return self._reversed_rows(table, scanner, max(nbRows, 1))
            results: list[Any] = []
            i = bisect.bisect_left(table.keys, scanner.next_key)
            while i < len(table.keys) and len(results) < max(nbRows, 1):
                key = table.keys[i]
                if scanner.stop is not None and key >= scanner.stop:
                    break
                result = self._result(table, key, scanner.columns)
                if result is not None:
                    results.append(result)
                scanner.next_key = key + b"\x00"
                i += 1
            return results

    def _reversed_rows(self, table: Any, scanner: _Scanner, count: int) -> list[Any]:
        if scanner.below is not None:
            i = bisect.bisect_left(table.keys, scanner.below) - 1
        elif scanner.next_key:
            i = bisect.bisect_right(table.keys, scanner.next_key) - 1
        else:
            i = len(table.keys) - 1
        results: list[Any] = []
        while i >= 0 and len(results) < count:
            key = table.keys[i]
            if scanner.stop is not None and key <= scanner.stop:
                break
            result = self._result(table, key, scanner.columns)
            if result is not None:
                results.append(result)
            scanner.below = key
            i -= 1
        return results

    def scannerGet(self, id: int) -> list[Any]:
        return self.scannerGetList(id, 1)

    def scannerClose(self, id: int) -> None:
        with self._lock:
            if self._scanners.pop(id, None) is None:
                raise H.IllegalArgument(message=f"scanner ID {id} is invalid")


class HBaseThriftFixture:
    """TEST FIXTURE: an in-memory HBase Thrift1 server on a real socket, in threads.

    ``start()`` listens (``port=0`` picks a free port, kept across restarts); ``stop()`` closes
    the listener and every client connection but keeps the tables, so a later ``start()`` is
    HBase coming back.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        transport: str = "buffered",
        protocol: str = "binary",
    ) -> None:
        self.host = host
        self.port = port
        self.transport_factory = {
            "buffered": TBufferedTransportFactory,
            "framed": TFramedTransportFactory,
        }[transport]()
        self.protocol_factory = {
            "binary": TBinaryProtocolFactory,
            "compact": TCompactProtocolFactory,
        }[protocol]()
        self.lock = threading.RLock()
        self.tables: dict[bytes, _Table] = {}
        self.calls: collections.Counter[str] = collections.Counter()
        self.rows_mutated = 0  # row mutations applied, retries included
        self.connections_accepted = 0
        self._faults: list[_Fault] = []
        self._handler = _Handler(self)
        self._listener: socket.socket | None = None
        self._clients: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._accepting: threading.Thread | None = None
        self._stopping = threading.Event()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def url(self, **options: object) -> str:
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return f"hbase://{self.address}" + (f"?{query}" if query else "")

    # --- life cycle -----------------------------------------------------------------------

    def start(self) -> HBaseThriftFixture:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(64)
        listener.settimeout(0.05)
        self.port = listener.getsockname()[1]
        self._listener = listener
        self._stopping.clear()
        self._accepting = threading.Thread(
            target=self._accept_loop, name=f"hbase-fixture-{self.port}", daemon=True
        )
        self._accepting.start()
        return self

    def stop(self) -> None:
        """HBase goes away: no listener, every connection closed (tables kept)."""
        self._stopping.set()
        if self._accepting is not None:
            self._accepting.join(5)
            self._accepting = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self.drop_connections()
        for thread in list(self._threads):
            thread.join(5)

    def drop_connections(self) -> int:
        """Close every client connection now, as HBase's Thrift server does to idle sockets."""
        with self.lock:
            clients = list(self._clients)
        for client in clients:
            try:
                client.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return len(clients)

    def fail_next(
        self, method: str, *, after_apply: bool = False, times: int = 1, skip: int = 0
    ) -> None:
        """After ``skip`` calls of ``method``, the next ``times`` ones close their connection
        without a reply, before applying the call or (``after_apply``) after: a lost request
        or a lost reply."""
        with self.lock:
            self._faults.append(_Fault(method, after_apply, times, skip))

    def take_fault(self, method: str) -> _Fault | None:
        with self.lock:
            for fault in self._faults:
                if fault.method != method:
                    continue
                if fault.skip > 0:
                    fault.skip -= 1
                    return None
                fault.remaining -= 1
                if fault.remaining == 0:
                    self._faults.remove(fault)
                return fault
            return None

    def __enter__(self) -> HBaseThriftFixture:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- serving --------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                self._clients.add(client)
                self.connections_accepted += 1
            thread = threading.Thread(target=self._serve, args=(client,), daemon=True)
            self._threads.add(thread)
            thread.start()

    def _serve(self, client: socket.socket) -> None:
        tsocket = TSocket(sock=client)
        transport = self.transport_factory.get_transport(tsocket)
        proto = self.protocol_factory.get_protocol(transport)
        processor = _Processor(H.Hbase, self._handler, self)
        try:
            while not self._stopping.is_set():
                processor.process(proto, proto)
        except (TTransportException, _DropConnection, OSError, EOFError):
            pass
        finally:
            with self.lock:
                self._clients.discard(client)
            try:
                client.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            client.close()
            self._threads.discard(threading.current_thread())


class _Processor(TProcessor):
    """Counts calls and turns handler bugs into application errors instead of a dropped socket
    (which a client would take for a network failure and retry)."""

    def __init__(self, service: Any, handler: _Handler, fixture: HBaseThriftFixture) -> None:
        super().__init__(service, handler)
        self._fixture = fixture

    def process_in(self, iprot: Any) -> Any:
        api, seqid, result, call = super().process_in(iprot)
        with self._fixture.lock:
            self._fixture.calls[api] += 1
        if call is None:
            return api, seqid, result, call

        def guarded() -> Any:
            try:
                return call()
            except (_DropConnection, TApplicationException):
                raise
            except Exception as exc:
                if self.handle_exception(exc, result):
                    raise
                raise TApplicationException(
                    TApplicationException.INTERNAL_ERROR, f"test fixture: {exc!r}"
                ) from exc

        return api, seqid, result, guarded


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM/SIGINT; print the listening line a parent process waits for."""
    parser = argparse.ArgumentParser(description="HBase Thrift1 TEST FIXTURE (in memory)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--transport", choices=["buffered", "framed"], default="buffered")
    parser.add_argument("--protocol", choices=["binary", "compact"], default="binary")
    args = parser.parse_args(argv)
    signalled: list[int] = []  # not an Event: its set() may deadlock in a signal handler
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _: signalled.append(signum))
    fixture = HBaseThriftFixture(
        args.host, args.port, transport=args.transport, protocol=args.protocol
    )
    with fixture:
        print(f"hbase thrift fixture listening on {fixture.address}", flush=True)
        while not signalled:
            time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
