"""The contract every store adapter must pass, written once and run against each adapter.

Subclass :class:`StoreContract` as ``Test<Adapter>`` and override the ``url`` fixture (the
store's URL: each test opens its own connection, and races open more). Tests name their tables
with a per-test random prefix and drop them afterwards, so an adapter's URL may name the same
long-lived store for every test (e.g. one HBase Thrift server).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from aggview.errors import InvalidArgument, UnknownTable
from aggview.keycodec import encode_key
from aggview.schema import ColumnType
from ltm.store import open_store
from ltm.store.base import GuardFailed, Store

MEMORY = "sqlite:///:memory:"
TEXT = ColumnType("TEXT")
INT = ColumnType("INT")


def run_in_threads(
    count: int, work: Callable[[int], None], barrier: threading.Barrier | None = None
) -> None:
    """``work(0)`` .. ``work(count - 1)`` in threads at once; raises what the first failure
    raised, and breaks ``barrier`` so that the others do not wait for it."""

    def run(n: int) -> None:
        try:
            work(n)
        except BaseException:
            if barrier is not None:
                barrier.abort()
            raise

    with ThreadPoolExecutor(count) as pool:
        list(pool.map(run, range(count)))


class StoreContract:
    """Behaviour shared by every Store; adapters provide the ``store`` fixture."""

    @pytest.fixture
    def url(self) -> str:
        raise NotImplementedError("a concrete test class provides the store's URL")

    @pytest.fixture
    def store(self, url: str) -> Iterator[Store]:
        with open_store(url) as store:
            yield store

    @pytest.fixture
    def connect(self, store: Store, url: str) -> Iterator[Callable[[], Store]]:
        """Opens another connection to the store under test (its own pool), closed after the
        test; an in-memory SQLite database exists per connection, so there it is ``store``."""
        opened: list[Store] = []

        def another() -> Store:
            if url == MEMORY:
                return store
            opened.append(open_store(url))
            return opened[-1]

        yield another
        for each in opened:
            each.close()

    @pytest.fixture
    def name(self, store: Store) -> Iterator[Callable[[str], str]]:
        """Make a table name unique to this test; drop every such table afterwards."""
        prefix = f"c{uuid.uuid4().hex[:10]}_"
        yield lambda suffix: prefix + suffix
        for table in store.list_tables():
            if table.startswith(prefix):
                store.drop_table(table)

    @pytest.fixture
    def table(self, store: Store, name: Callable[[str], str]) -> str:
        table = name("t")
        store.create_table(table)
        return table

    @staticmethod
    def fill(store: Store, table: str, keys: list[bytes]) -> None:
        store.write([(table, k, b"v" + k) for k in keys])

    # --- tables ---------------------------------------------------------------------------

    def test_create_list_drop_are_idempotent(
        self, store: Store, name: Callable[[str], str]
    ) -> None:
        a, b = name("a"), name("b")
        store.create_table(a)
        store.create_table(a)
        store.create_table(b)
        assert {a, b} <= set(store.list_tables())
        store.write([(a, b"k", b"v")])
        store.create_table(a)  # must not wipe the rows
        assert store.get(a, b"k") == b"v"
        store.drop_table(a)
        store.drop_table(a)
        assert a not in store.list_tables()
        assert b in store.list_tables()
        store.create_table(a)
        assert list(store.scan(a)) == []

    def test_creators_racing_on_one_table_all_succeed(
        self, name: Callable[[str], str], connect: Callable[[], Store]
    ) -> None:
        stores = [connect() for _ in range(4)]
        run_in_threads(4, lambda n: stores[n].create_table(name("t")))
        assert name("t") in stores[0].list_tables()

    def test_list_tables_is_sorted(self, store: Store, name: Callable[[str], str]) -> None:
        for suffix in ("b", "a", "c"):
            store.create_table(name(suffix))
        mine = [t for t in store.list_tables() if t.startswith(name(""))]
        assert mine == sorted(mine) == [name("a"), name("b"), name("c")]

    def test_table_names_are_case_sensitive(self, store: Store, name: Callable[[str], str]) -> None:
        lower, upper = name("orders_x"), name("Orders_X")
        store.create_table(lower)
        store.create_table(upper)
        store.write([(lower, b"k", b"lower"), (upper, b"k", b"upper")])
        assert store.get(lower, b"k") == b"lower"
        assert store.get(upper, b"k") == b"upper"
        assert {lower, upper} <= set(store.list_tables())

    @pytest.mark.parametrize("bad", ["", "a-b", "a b", "x" * 201, "é", "a.b", None, 7])
    def test_invalid_table_names(self, store: Store, bad: object) -> None:
        with pytest.raises(InvalidArgument):
            store.create_table(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            store.get(bad, b"k")  # type: ignore[arg-type]

    def test_longest_table_name(self, store: Store, name: Callable[[str], str]) -> None:
        long_name = name("")
        long_name += "x" * (200 - len(long_name))
        store.create_table(long_name)
        store.write([(long_name, b"k", b"v")])
        assert store.get(long_name, b"k") == b"v"
        assert long_name in store.list_tables()

    def test_unknown_table(self, store: Store, name: Callable[[str], str]) -> None:
        missing = name("missing")
        with pytest.raises(UnknownTable, match=missing):
            store.get(missing, b"k")
        with pytest.raises(UnknownTable):
            store.get_many(missing, [b"k"])
        with pytest.raises(UnknownTable):
            store.write([(missing, b"k", b"v")])
        with pytest.raises(UnknownTable):
            list(store.scan(missing))
        with pytest.raises(UnknownTable):
            list(store.scan_prefix(missing, b"k"))
        store.drop_table(missing)  # idempotent, no error

    def test_write_naming_an_unknown_table_applies_nothing(
        self, store: Store, table: str, name: Callable[[str], str]
    ) -> None:
        with pytest.raises(UnknownTable):
            store.write([(table, b"k", b"v"), (name("missing"), b"k", b"v")])
        assert store.get(table, b"k") is None

    # --- point operations -----------------------------------------------------------------

    def test_put_get_overwrite_delete(self, store: Store, table: str) -> None:
        assert store.get(table, b"k") is None
        store.write([(table, b"k", b"one")])
        assert store.get(table, b"k") == b"one"
        store.write([(table, b"k", b"two")])
        assert store.get(table, b"k") == b"two"
        store.write([(table, b"k", None)])
        assert store.get(table, b"k") is None
        store.write([(table, b"k", None)])  # deleting a missing key is fine
        store.write([])

    def test_empty_value(self, store: Store, table: str) -> None:
        store.write([(table, b"k", b"")])
        assert store.get(table, b"k") == b""
        assert list(store.scan(table)) == [(b"k", b"")]

    def test_last_mutation_of_a_key_wins(self, store: Store, table: str) -> None:
        store.write(
            [(table, b"a", b"1"), (table, b"a", b"2"), (table, b"b", b"x"), (table, b"b", None)]
        )
        assert store.get(table, b"a") == b"2"
        assert store.get(table, b"b") is None

    def test_get_many(self, store: Store, table: str) -> None:
        self.fill(store, table, [b"a", b"b", b"c"])
        assert store.get_many(table, [b"a", b"c", b"zz", b"a"]) == {b"a": b"va", b"c": b"vc"}
        assert store.get_many(table, []) == {}

    def test_get_many_large(self, store: Store, table: str) -> None:
        keys = [i.to_bytes(4, "big") for i in range(2500)]
        self.fill(store, table, keys[::2])
        found = store.get_many(table, keys)
        assert found == {k: b"v" + k for k in keys[::2]}

    def test_write_across_tables(self, store: Store, name: Callable[[str], str]) -> None:
        a, b = name("a"), name("b")
        store.create_table(a)
        store.create_table(b)
        store.write([(a, b"k", b"in a"), (b, b"k", b"in b"), (a, b"k2", b"x")])
        assert store.get(a, b"k") == b"in a"
        assert store.get(b, b"k") == b"in b"
        assert store.get(b, b"k2") is None
        store.write([(a, b"k", None), (b, b"k", b"new")])
        assert store.get(a, b"k") is None
        assert store.get(b, b"k") == b"new"

    def test_guarded_write_applies_only_under_its_guard(
        self, store: Store, name: Callable[[str], str]
    ) -> None:
        fence, rows = name("fence"), name("rows")
        store.create_table(rows)
        store.write_guarded((fence, b"p1", None), [(rows, b"k", b"1")])  # no table: absent
        store.create_table(fence)
        store.write([(fence, b"p1", b"epoch 1")])
        store.write_guarded((fence, b"p1", b"epoch 1"), [(rows, b"k", b"2"), (rows, b"j", b"x")])
        assert store.get(rows, b"k") == b"2"
        for stale in (b"epoch 0", None):
            with pytest.raises(GuardFailed):
                store.write_guarded((fence, b"p1", stale), [(rows, b"k", b"3"), (rows, b"j", None)])
        assert (store.get(rows, b"k"), store.get(rows, b"j")) == (b"2", b"x")
        with pytest.raises(InvalidArgument):
            store.write_guarded((fence, b"", None), [(rows, b"k", b"4")])

    def test_compare_and_set_tells_empty_from_absent(
        self, store: Store, table: str, name: Callable[[str], str]
    ) -> None:
        """A guarded put of the guard key itself (HBase compares an empty cell and a missing
        one alike; the store does not)."""
        store.write_guarded((table, b"k", None), [(table, b"k", b"")])
        with pytest.raises(GuardFailed):
            store.write_guarded((table, b"k", None), [(table, b"k", b"x")])
        with pytest.raises(GuardFailed):
            store.write_guarded((table, b"j", b""), [(table, b"j", b"x")])
        store.write_guarded((table, b"k", b""), [(table, b"k", b"v")])
        with pytest.raises(GuardFailed):
            store.write_guarded((table, b"k", b"w"), [(table, b"k", b"x")])
        assert (store.get(table, b"k"), store.get(table, b"j")) == (b"v", None)
        with pytest.raises(GuardFailed):  # a missing table holds no value
            store.write_guarded((name("absent"), b"k", b"v"), [(name("absent"), b"k", b"x")])
        with pytest.raises(UnknownTable):
            store.write_guarded((name("absent"), b"k", None), [(name("absent"), b"k", b"x")])

    def test_invalid_keys_and_values(self, store: Store, table: str) -> None:
        with pytest.raises(InvalidArgument):
            store.get(table, b"")
        with pytest.raises(InvalidArgument):
            store.get(table, "k")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            store.get_many(table, [b"a", b""])
        with pytest.raises(InvalidArgument):
            store.write([(table, b"", b"v")])
        with pytest.raises(InvalidArgument):
            store.write([(table, b"k", "text")])  # type: ignore[list-item]
        with pytest.raises(InvalidArgument):
            store.write([(table, b"k")])  # type: ignore[list-item]
        with pytest.raises(InvalidArgument):
            list(store.scan(table, limit=-1))
        with pytest.raises(InvalidArgument):
            list(store.scan(table, batch_size=0))

    def test_binary_keys(self, store: Store, table: str) -> None:
        keys = [
            b"\x00",
            b"\x00\x00",
            b"\x00\xff",
            b"\xff",
            b"\xff\x00",
            b"\xff\xff\xff",
            b"a\x00b",
            b"a",
            b"a\xff",
            b"\x01",
        ]
        store.write([(table, k, k[::-1] + b"\x00\xff") for k in keys])
        for k in keys:
            assert store.get(table, k) == k[::-1] + b"\x00\xff"
        assert [k for k, _ in store.scan(table)] == sorted(keys)
        assert [k for k, _ in store.scan(table, b"\x00\x00", b"\xff\x00")] == sorted(
            k for k in keys if b"\x00\x00" <= k < b"\xff\x00"
        )

    def test_large_value(self, store: Store, table: str) -> None:
        big = bytes(range(256)) * 4096  # 1 MiB
        store.write([(table, b"big", big), (table, b"small", b"s")])
        assert store.get(table, b"big") == big
        assert dict(store.scan(table)) == {b"big": big, b"small": b"s"}

    # --- scans ----------------------------------------------------------------------------

    def test_scan_order_and_bounds(self, store: Store, table: str) -> None:
        keys = [bytes([c]) for c in b"hdbfjaceig"]
        self.fill(store, table, keys)
        everything = sorted(keys)
        assert [k for k, _ in store.scan(table)] == everything
        assert dict(store.scan(table)) == {k: b"v" + k for k in keys}
        assert [k for k, _ in store.scan(table, b"c")] == everything[2:]
        assert [k for k, _ in store.scan(table, None, b"c")] == everything[:2]
        assert [k for k, _ in store.scan(table, b"c", b"f")] == [b"c", b"d", b"e"]
        assert [k for k, _ in store.scan(table, b"c\x00", b"f\x00")] == [b"d", b"e", b"f"]
        assert list(store.scan(table, b"f", b"c")) == []
        assert list(store.scan(table, b"c", b"c")) == []
        assert list(store.scan(table, b"z")) == []

    def test_scan_pages_and_limit(self, store: Store, table: str) -> None:
        """Every page size against every limit, over one table: a table per combination cost
        a real HBase 32 creates and drops (about a minute) for ten rows."""
        keys = [bytes([c]) for c in range(ord("a"), ord("k"))]  # 10 keys
        self.fill(store, table, keys)
        for batch_size in (1, 3, 4, 1000):
            for limit in (None, 0, 1, 3, 4, 7, 10, 11):
                case = f"batch_size={batch_size}, limit={limit}"
                got = [k for k, _ in store.scan(table, limit=limit, batch_size=batch_size)]
                assert got == keys[:limit], case
                got = [
                    k for k, _ in store.scan(table, b"c", b"i", limit=limit, batch_size=batch_size)
                ]
                assert got == keys[2:8][:limit], case

    def test_scan_sees_writes_between_pages_without_repeats(self, store: Store, table: str) -> None:
        self.fill(store, table, [b"b", b"d", b"f", b"h"])
        seen: list[bytes] = []
        for key, _ in store.scan(table, batch_size=2):
            seen.append(key)
            if key == b"b":
                # b, d are in hand; later pages must reflect these writes.
                store.write(
                    [
                        (table, b"a", b"x"),
                        (table, b"c", b"x"),
                        (table, b"g", b"x"),
                        (table, b"h", None),
                    ]
                )
        assert seen == [b"b", b"d", b"f", b"g"]

    def test_slow_consumer_does_not_block_writers(self, store: Store, table: str) -> None:
        self.fill(store, table, [bytes([c]) for c in range(1, 50)])
        scan = store.scan(table, batch_size=5)
        next(scan)
        done = threading.Event()

        def writer() -> None:
            store.write([(table, b"\x7f", b"late")])
            done.set()

        thread = threading.Thread(target=writer)
        thread.start()
        thread.join(timeout=10)
        assert done.is_set(), "a write waited for an idle scan"
        assert len(list(scan)) == 49  # 48 remaining + the key written meanwhile

    def test_scan_prefix_is_exact(self, store: Store, table: str) -> None:
        keys = [
            b"a",
            b"aa\xff",
            b"ab",
            b"ab\x00",
            b"abc",
            b"ab\xff\xff",
            b"ac",
            b"b",
            b"\xff",
            b"\xff\xff\x01",
        ]
        self.fill(store, table, keys)
        for prefix in [b"ab", b"a", b"aa", b"\xff", b"\xff\xff", b"zz", b""]:
            expected = sorted(k for k in keys if k.startswith(prefix))
            assert [k for k, _ in store.scan_prefix(table, prefix)] == expected, prefix
            paged = store.scan_prefix(table, prefix, batch_size=1, limit=2)
            assert [k for k, _ in paged] == expected[:2]

    def test_scan_prefix_of_encoded_keys_respects_components(
        self, store: Store, table: str
    ) -> None:
        types = [TEXT, INT]
        rows = [("ab", 1), ("ab", -5), ("abc", 1), ("a", 2), ("ab\x00", 0), ("b", 0)]
        store.write([(table, encode_key(types, r), repr(r).encode()) for r in rows])
        prefix = encode_key(types[:1], ["ab"])
        got = [v for _, v in store.scan_prefix(table, prefix)]
        assert got == [repr(("ab", -5)).encode(), repr(("ab", 1)).encode()]

    # --- concurrency ----------------------------------------------------------------------

    def test_concurrent_writes_from_threads(self, store: Store, table: str) -> None:
        def worker(n: int) -> None:
            for i in range(50):
                key = f"w{n}-{i:03d}".encode()
                store.write([(table, key, key)])
                assert store.get(table, key) == key
            store.write([(table, f"w{n}-{i:03d}".encode(), None) for i in range(0, 50, 2)])

        run_in_threads(4, worker)
        expected = sorted(f"w{n}-{i:03d}".encode() for n in range(4) for i in range(1, 50, 2))
        assert [k for k, _ in store.scan(table, batch_size=7)] == expected

    def test_racing_compare_and_sets_have_one_winner_per_value(
        self, table: str, connect: Callable[[], Store]
    ) -> None:
        """Writers on their own connections read one value, then all put the key guarded on
        it at once: exactly one wins each round (a check, then a write lets several win)."""
        writers, rounds = 8, 12
        stores = [connect() for _ in range(writers)]
        barrier = threading.Barrier(writers, timeout=60)
        wins: list[tuple[int, bytes | None, int]] = []  # round, value replaced, writer

        def writer(n: int) -> None:
            mine = stores[n]
            for r in range(rounds):
                seen = mine.get(table, b"key")
                barrier.wait()
                try:
                    value = b"%d:%d" % (r, n)  # never one a writer expects again
                    mine.write_guarded((table, b"key", seen), [(table, b"key", value)])
                    wins.append((r, seen, n))
                except GuardFailed:
                    pass
                barrier.wait()  # every writer's attempt is over before the next read

        run_in_threads(writers, writer, barrier)
        assert sorted(r for r, _, _ in wins) == list(range(rounds)), sorted(wins)
        chain = [seen for _, seen, _ in sorted(wins)] + [stores[0].get(table, b"key")]
        assert chain == [None] + [b"%d:%d" % (r, n) for r, _, n in sorted(wins)]

    def test_last_key_is_the_greatest_and_refuses_unknown_tables(
        self, store: Store, table: str, name: Callable[[str], str]
    ) -> None:
        assert store.last_key(table) is None
        keys = [encode_key([INT], [i]) for i in (5, -3, 40, 7)]
        self.fill(store, table, keys)
        assert store.last_key(table) == encode_key([INT], [40])
        store.write([(table, encode_key([INT], [40]), None)])
        assert store.last_key(table) == encode_key([INT], [7])
        store.write([(table, b"\xff\xff", b"v")])  # bytes order, whatever the key encodes
        assert store.last_key(table) == b"\xff\xff"
        with pytest.raises(UnknownTable):
            store.last_key(name("absent"))

    def test_count_counts_rows_and_refuses_unknown_tables(
        self, store: Store, table: str, name: Callable[[str], str]
    ) -> None:
        assert store.count(table) == 0
        self.fill(store, table, [encode_key([INT], [i]) for i in range(25)])
        store.write([(table, encode_key([INT], [3]), None)])
        assert store.count(table) == 24
        with pytest.raises(UnknownTable):
            store.count(name("absent"))
