"""The store contract on the embedded SQLite adapter, plus what only a file store can show."""

from __future__ import annotations

import multiprocessing
import sqlite3
from multiprocessing.synchronize import Barrier as BarrierType
from pathlib import Path

import pytest
from store_contract import MEMORY, StoreContract

from aggview.errors import InvalidArgument, StoreError
from ltm.store import SqliteStore, open_store
from ltm.store.sqlite import _sql_table, _store_table


class TestSqliteFileStore(StoreContract):
    @pytest.fixture
    def url(self, tmp_path: Path) -> str:
        return f"sqlite://{tmp_path}/sub/dir/store.db"


class TestSqliteMemoryStore(StoreContract):
    @pytest.fixture
    def url(self) -> str:
        return MEMORY


def test_file_store_uses_wal_and_named_tables(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with SqliteStore(path) as store:
        store.create_table("orders")
        store.create_table("Orders_X")
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        conn.close()
    assert names == {"t_orders", "u__orders___x"}


@pytest.mark.parametrize("name", ["a", "orders", "Orders", "A_b", "a__B_", "_", "X" * 200, "9_Z"])
def test_sql_table_names_round_trip(name: str) -> None:
    sql = _sql_table(name)
    assert sql == sql.lower()
    assert _store_table(sql) == name


def test_foreign_sqlite_tables_are_not_listed(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE other (x)")
    conn.commit()
    conn.close()
    with SqliteStore(path) as store:
        store.create_table("mine")
        assert store.list_tables() == ["mine"]


def test_reopen_after_close_keeps_data(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/durable.db"
    store = open_store(url)
    store.create_table("t")
    store.write([("t", b"k1", b"v1"), ("t", b"k2", b"v2")])
    store.write([("t", b"k1", None)])
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError):
        store.get("t", b"k2")
    with open_store(url) as again:
        assert again.list_tables() == ["t"]
        assert list(again.scan("t")) == [(b"k2", b"v2")]


def test_closed_memory_store_refuses_calls() -> None:
    store = open_store("sqlite:///:memory:")
    store.close()
    with pytest.raises(StoreError):
        store.list_tables()


def test_memory_stores_are_separate() -> None:
    with open_store("sqlite:///:memory:") as one, open_store("sqlite:///:memory:") as two:
        one.create_table("t")
        assert two.list_tables() == []


def test_unusable_path_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError, match=str(blocker)):
        SqliteStore(blocker / "store.db")


def test_corrupt_file_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.db"
    path.write_bytes(b"this is not an sqlite database" * 100)
    with pytest.raises(StoreError, match=str(path)):
        SqliteStore(path).list_tables()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("hbase://localhost:9090?bogus=1", "unknown option 'bogus'"),
        ("redis://localhost", "supported schemes: sqlite://, hbase://"),
        ("/tmp/x.db", "unsupported store URL '/tmp/x.db'"),
        ("sqlite://relative.db", "sqlite:///absolute/path.db"),
        ("sqlite://", "sqlite:///absolute/path.db"),
    ],
)
def test_open_store_refuses_bad_urls(url: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        open_store(url)


def _writer(path: str, worker: int, count: int, start_together: BarrierType) -> None:
    """Runs in a child process: many small transactions, each also touching a shared key."""
    with SqliteStore(path) as store:
        store.create_table("shared")
        store.create_table(f"own{worker}")
        start_together.wait(30)  # so the two processes really contend
        for i in range(count):
            key = f"p{worker}-{i:04d}".encode()
            store.write(
                [("shared", key, key), (f"own{worker}", key, b"x"), ("shared", b"hot", key)]
            )


def test_two_processes_write_one_file(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    with SqliteStore(path) as store:
        store.create_table("shared")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(path, w, 300, barrier)) for w in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    with SqliteStore(path) as store:
        keys = [k for k, _ in store.scan("shared") if k != b"hot"]
        assert keys == sorted(f"p{w}-{i:04d}".encode() for w in range(2) for i in range(300))
        assert store.get("shared", b"hot") in {b"p0-0299", b"p1-0299"}
        assert store.list_tables() == ["own0", "own1", "shared"]
        assert len(list(store.scan("own1"))) == 300
