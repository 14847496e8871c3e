"""TPC-W on aggview (the thesis's §6.4): an online book shop's ten tables, its population rules,
its 14 web interactions as one-shot transactions and snapshot reads, and its three mixes.

The shop keeps its aggregate answers in views: the cart total per cart and the order total per
customer (sync: a page must show the exact amount), units sold per subject and per item (async:
TPC-W itself lets Best Sellers be up to 30 s stale). Every read an interaction makes is a get
by key, a scan of a primary-key prefix or a view read; where TPC-W queries with LIKE or ORDER BY
over a whole table, the shop keeps an index table the application maintains (``item_index``)
and sorts the few rows it read. ``docs/DECISIONS.md`` ("TPC-W") lists where this differs from
the specification and why.
"""

from __future__ import annotations

import asyncio
import csv
import datetime
import random
import string
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from aggclient import AsyncClient, Client, ConditionFailed
from aggclient.client import Transaction
from aggview import errors

ID_BLOCK = 1_000_000_000  # ids below it are the population's; run r allocates in block r
MIN_ITEMS, MAX_ITEMS = 1_000, 100_000
CUSTOMERS_PER_BROWSER = 2_880
MAX_BROWSERS = 10_000
PAGE = 50  # rows a list page shows (New Products, Best Sellers, Search Results)
TAX = Decimal("0.0825")
CENT = Decimal("0.01")
LOW_STOCK, RESTOCK = 10, 21  # TPC-W 2.7.3: stock below 10 after an order gets 21 more
BUY_ATTEMPTS = 3  # Buy Confirm re-reads the stock after a failed condition, this many times

SUBJECTS = (
    "ARTS BIOGRAPHIES BUSINESS CHILDREN COMPUTERS COOKING HEALTH HISTORY HOME HUMOR LITERATURE "
    "MYSTERY NON-FICTION PARENTING POLITICS REFERENCE RELIGION ROMANCE SELF-HELP SCIENCE-NATURE "
    "SCIENCE-FICTION SPORTS YOUTH TRAVEL"
).split()
COUNTRIES = (
    "United States,United Kingdom,Canada,Germany,France,Japan,Netherlands,Italy,Switzerland,"
    "Australia,Algeria,Argentina,Armenia,Austria,Azerbaijan,Bahamas,Bahrain,Bangla Desh,"
    "Barbados,Belarus,Belgium,Bermuda,Bolivia,Botswana,Brazil,Bulgaria,Cayman Islands,Chad,"
    "Chile,China,Christmas Island,Colombia,Croatia,Cuba,Cyprus,Czech Republic,Denmark,"
    "Dominican Republic,Eastern Caribbean,Ecuador,Egypt,El Salvador,Estonia,Ethiopia,"
    "Falkland Island,Faroe Island,Fiji,Finland,Gabon,Gibraltar,Greece,Guam,Hong Kong,Hungary,"
    "Iceland,India,Indonesia,Iran,Iraq,Ireland,Israel,Jamaica,Jordan,Kazakhstan,Kuwait,"
    "Lebanon,Luxembourg,Malaysia,Mexico,Mauritius,New Zealand,Norway,Pakistan,Philippines,"
    "Poland,Portugal,Romania,Russia,Saudi Arabia,Singapore,Slovakia,South Africa,South Korea,"
    "Spain,Sudan,Sweden,Taiwan,Thailand,Trinidad,Turkey,Venezuela,Zambia"
).split(",")
CURRENCIES = ("Dollars", "Pounds", "Euro", "Yen", "Francs", "Pesos", "Rupees", "Krona")
BACKINGS = ("HARDBACK", "PAPERBACK", "USED", "AUDIO", "LIMITED-EDITION")
SHIP_TYPES = ("AIR", "UPS", "FEDEX", "SHIP", "COURIER", "MAIL")
STATUSES = ("PROCESSING", "SHIPPED", "PENDING", "DENIED")
CC_TYPES = ("VISA", "MASTERCARD", "DISCOVER", "AMEX", "DINERS")
SYLLABLES = ("BA", "OG", "AL", "RI", "RE", "SE", "AT", "UL", "IN", "NG")
SEARCH_KINDS = ("author", "title", "subject")

# The ten TPC-W tables (lower case: unquoted SQL names fold to it), then the shop's own two.
TABLES: dict[str, str] = {
    "country": "co_id INT, co_name TEXT NOT NULL, co_exchange DECIMAL(12,6) NOT NULL, "
    "co_currency TEXT NOT NULL, PRIMARY KEY (co_id)",
    "author": "a_id INT, a_fname TEXT, a_lname TEXT NOT NULL, a_mname TEXT, a_dob DATE, "
    "a_bio TEXT, PRIMARY KEY (a_id)",
    "item": "i_id INT, i_title TEXT NOT NULL, i_a_id INT NOT NULL, i_pub_date DATE NOT NULL, "
    "i_publisher TEXT, i_subject TEXT NOT NULL, i_desc TEXT, i_related1 INT, i_related2 INT, "
    "i_related3 INT, i_related4 INT, i_related5 INT, i_thumbnail TEXT, i_image TEXT, "
    "i_srp DECIMAL(10,2), i_cost DECIMAL(10,2) NOT NULL, i_avail DATE, i_stock INT NOT NULL, "
    "i_isbn TEXT, i_page INT, i_backing TEXT, i_dimensions TEXT, PRIMARY KEY (i_id)",
    "customer": "c_id INT, c_uname TEXT NOT NULL, c_passwd TEXT NOT NULL, c_fname TEXT, "
    "c_lname TEXT, c_addr_id INT NOT NULL, c_phone TEXT, c_email TEXT, c_since DATE, "
    "c_last_login DATE, c_login TEXT, c_expiration TEXT, c_discount DECIMAL(4,2) NOT NULL, "
    "c_balance DECIMAL(15,2), c_ytd_pmt DECIMAL(15,2), c_birthdate DATE, c_data TEXT, "
    "PRIMARY KEY (c_id)",
    "address": "addr_id INT, addr_street1 TEXT, addr_street2 TEXT, addr_city TEXT, "
    "addr_state TEXT, addr_zip TEXT, addr_co_id INT NOT NULL, PRIMARY KEY (addr_id)",
    # keyed by customer first: a customer's orders are one prefix scan (Order Display)
    "orders": "o_c_id INT, o_id INT, o_date DATE NOT NULL, o_sub_total DECIMAL(15,2) NOT NULL, "
    "o_tax DECIMAL(15,2) NOT NULL, o_total DECIMAL(15,2) NOT NULL, o_ship_type TEXT, "
    "o_ship_date DATE, o_bill_addr_id INT, o_ship_addr_id INT, o_status TEXT, "
    "PRIMARY KEY (o_c_id, o_id)",
    "order_line": "ol_o_id INT, ol_id INT, ol_i_id INT NOT NULL, ol_qty INT NOT NULL, "
    "ol_discount DECIMAL(4,2), ol_comments TEXT, PRIMARY KEY (ol_o_id, ol_id)",
    "cc_xacts": "cx_o_id INT, cx_type TEXT, cx_num TEXT, cx_name TEXT, cx_expire DATE, "
    "cx_auth_id TEXT, cx_xact_amt DECIMAL(15,2) NOT NULL, cx_xact_date DATE, cx_co_id INT, "
    "PRIMARY KEY (cx_o_id)",
    "shopping_cart": "sc_id INT, sc_time TEXT, PRIMARY KEY (sc_id)",
    "shopping_cart_line": "scl_sc_id INT, scl_i_id INT, scl_qty INT NOT NULL, "
    "PRIMARY KEY (scl_sc_id, scl_i_id)",
    # the searches and New Products: (kind, term) prefix scans instead of LIKE over ITEM
    "item_index": "kind TEXT, term TEXT, i_id INT, i_title TEXT NOT NULL, "
    "i_pub_date DATE NOT NULL, a_fname TEXT, a_lname TEXT, PRIMARY KEY (kind, term, i_id)",
    # the population's sizes (written last: a table set without it was never fully loaded)
    # and the run counter that hands each run its block of new ids
    "tpcw_meta": "name TEXT, value INT NOT NULL, PRIMARY KEY (name)",
}
TPCW_TABLES = tuple(TABLES)[:10]

VIEWS: dict[str, str] = {
    "cart_total": "SELECT scl.scl_sc_id AS sc_id, COUNT(*) AS lines, SUM(scl.scl_qty) AS items, "
    "SUM(scl.scl_qty * i.i_cost) AS subtotal FROM shopping_cart_line scl "
    "JOIN item i ON scl.scl_i_id = i.i_id GROUP BY scl.scl_sc_id",
    "order_total": "SELECT o.o_c_id AS c_id, COUNT(*) AS orders, SUM(o.o_total) AS spent, "
    "MAX(o.o_id) AS last_order FROM orders o GROUP BY o.o_c_id",
    "sales_by_subject": "SELECT i.i_subject AS subject, COUNT(*) AS lines, "
    "SUM(ol.ol_qty) AS units FROM order_line ol JOIN item i ON ol.ol_i_id = i.i_id "
    "GROUP BY i.i_subject",
    "best_sellers": "SELECT i.i_subject AS subject, ol.ol_i_id AS i_id, SUM(ol.ol_qty) AS units "
    "FROM order_line ol JOIN item i ON ol.ol_i_id = i.i_id GROUP BY i.i_subject, ol.ol_i_id",
}
# The assignment: exact where a page shows money, refreshed where TPC-W allows staleness.
MIXED_MODES = {
    "cart_total": "sync",
    "order_total": "sync",
    "sales_by_subject": "async",
    "best_sellers": "async",
}
VIEW_MODES = ("mixed", "sync", "async", "cumulus", "none")

INTERACTIONS = (
    "Home",
    "New Products",
    "Best Sellers",
    "Product Detail",
    "Search Request",
    "Search Results",
    "Shopping Cart",
    "Customer Registration",
    "Buy Request",
    "Buy Confirm",
    "Order Inquiry",
    "Order Display",
    "Admin Request",
    "Admin Confirm",
)
WRITING = ("Shopping Cart", "Customer Registration", "Buy Request", "Buy Confirm", "Admin Confirm")
# TPC-W clause 5.2.2: each mix's share of every interaction (percent).
MIXES: dict[str, tuple[float, ...]] = {
    "browsing": (29.00, 11.00, 11.00, 21.00, 12.00, 11.00, 2.00, 0.82, 0.75, 0.69, 0.30, 0.25)
    + (0.10, 0.09),
    "shopping": (16.00, 5.00, 5.00, 17.00, 20.00, 17.00, 11.60, 3.00, 2.60, 1.20, 0.75, 0.66)
    + (0.10, 0.09),
    "ordering": (9.12, 0.46, 0.46, 12.35, 14.53, 13.08, 13.53, 12.86, 12.73, 10.18, 0.25, 0.22)
    + (0.12, 0.11),
}


def view_modes(view_mode: str) -> dict[str, str]:
    """View name -> 'sync', 'async' or 'cumulus' for a ``--view-mode``; 'none' registers no
    view."""
    if view_mode not in VIEW_MODES:
        raise errors.InvalidArgument(
            f"unknown view mode {view_mode!r}: use one of {', '.join(VIEW_MODES)}"
        )
    if view_mode == "none":
        return {}
    if view_mode == "mixed":
        return dict(MIXED_MODES)
    return {name: view_mode for name in VIEWS}


def view_options(mode: str, interval_ms: int) -> str:
    """The options of a view in ``mode`` (``interval_ms``: an async view's refresh interval, a
    cumulus view's epoch), as CREATE ... WITH and ALTER ... SET take them."""
    if mode == "async":
        return f"refresh = 'async', interval_ms = {interval_ms}"
    if mode == "cumulus":
        return f"refresh = 'cumulus', epoch_ms = {interval_ms}"
    return "refresh = 'sync'"


def view_ddl(name: str, mode: str, interval_ms: int) -> str:
    return (
        f"CREATE MATERIALIZED VIEW {name} WITH ({view_options(mode, interval_ms)}) AS {VIEWS[name]}"
    )


def create_schema(client: Client) -> None:
    for name, columns in TABLES.items():
        client.sql(f"CREATE TABLE IF NOT EXISTS {name} ({columns})")


# ----------------------------------------------------------------------------- population


@dataclass(frozen=True)
class Scale:
    """TPC-W clause 4.7: the sizes follow from the emulated browsers and the item count;
    ``customers_per_browser`` is 2,880 in TPC-W and smaller only for quick runs."""

    browsers: int
    items: int
    customers_per_browser: int = CUSTOMERS_PER_BROWSER

    def check(self) -> None:
        if not 1 <= self.browsers <= MAX_BROWSERS:
            raise errors.InvalidArgument(
                f"browsers must be between 1 and {MAX_BROWSERS}; got {self.browsers}"
            )
        if not MIN_ITEMS <= self.items <= MAX_ITEMS:
            raise errors.InvalidArgument(
                f"items must be between {MIN_ITEMS:,} and {MAX_ITEMS:,} (TPC-W's 1k-100k); "
                f"got {self.items:,}"
            )
        if not 1 <= self.customers_per_browser <= CUSTOMERS_PER_BROWSER:
            raise errors.InvalidArgument(
                f"customers per browser must be between 1 and {CUSTOMERS_PER_BROWSER}; got "
                f"{self.customers_per_browser}"
            )

    @property
    def customers(self) -> int:
        return self.customers_per_browser * self.browsers

    @property
    def authors(self) -> int:
        return self.items // 4

    @property
    def addresses(self) -> int:
        return 2 * self.customers

    @property
    def orders(self) -> int:
        return max(1, self.customers * 9 // 10)

    @property
    def countries(self) -> int:
        return len(COUNTRIES)

    @property
    def title_words(self) -> int:
        """Distinct first words of titles: a title search finds about five items."""
        return max(1, self.items // 5)

    @property
    def author_names(self) -> int:
        """Distinct author last names: an author search finds about eight items."""
        return max(1, self.authors // 2)

    def meta(self) -> dict[str, int]:
        return {
            "items": self.items,
            "authors": self.authors,
            "customers": self.customers,
            "addresses": self.addresses,
            "orders": self.orders,
            "countries": self.countries,
            "browsers": self.browsers,
            "customers_per_browser": self.customers_per_browser,
        }


def digsyl(number: int) -> str:
    """TPC-W's DigSyl: each decimal digit as a syllable (names that searches can guess)."""
    return "".join(SYLLABLES[int(d)] for d in str(number))


def _astring(rng: random.Random, low: int, high: int) -> str:
    return "".join(rng.choices(string.ascii_letters + string.digits, k=rng.randint(low, high)))


def _nstring(rng: random.Random, length: int) -> str:
    return "".join(rng.choices(string.digits, k=length))


def _day(rng: random.Random, first: datetime.date, last: datetime.date) -> datetime.date:
    return first + datetime.timedelta(days=rng.randrange((last - first).days + 1))


def _money(rng: random.Random, low: str, high: str) -> Decimal:
    cents = rng.randint(int(Decimal(low) * 100), int(Decimal(high) * 100))
    return (Decimal(cents) / 100).quantize(CENT)


def title_word(rng: random.Random, scale: Scale) -> str:
    return digsyl(rng.randint(1, scale.title_words))


def author_name(rng: random.Random, scale: Scale) -> str:
    return digsyl(rng.randint(1, scale.author_names))


def population(
    scale: Scale, seed: int, today: datetime.date
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(table, row) for every row of TPC-W's initial database (clause 4.7), in storage-ready
    Python values; shopping carts start empty."""
    rng = random.Random(seed)
    for co_id, name in enumerate(COUNTRIES, start=1):
        yield (
            "country",
            {
                "co_id": co_id,
                "co_name": name,
                "co_exchange": Decimal(rng.randint(10_000, 10_000_000)) / 1_000_000,
                "co_currency": CURRENCIES[co_id % len(CURRENCIES)],
            },
        )
    authors: dict[int, tuple[str, str]] = {}
    for a_id in range(1, scale.authors + 1):
        first, last = _astring(rng, 3, 20), author_name(rng, scale)
        authors[a_id] = (first, last)
        yield (
            "author",
            {
                "a_id": a_id,
                "a_fname": first,
                "a_lname": last,
                "a_mname": _astring(rng, 1, 20),
                "a_dob": _day(rng, datetime.date(1800, 1, 1), datetime.date(1990, 1, 1)),
                "a_bio": _astring(rng, 125, 500),
            },
        )
    for i_id in range(1, scale.items + 1):
        # the first items/4 items have one author each, the rest a random one (clause 4.7.1)
        a_id = i_id if i_id <= scale.authors else rng.randint(1, scale.authors)
        title = f"{title_word(rng, scale)} {_astring(rng, 10, 50)}"
        subject = rng.choice(SUBJECTS)
        pub_date = _day(rng, datetime.date(1930, 1, 1), today)
        srp = _money(rng, "1.00", "9999.99")
        related = rng.sample(range(1, scale.items + 1), 5)
        yield (
            "item",
            {
                "i_id": i_id,
                "i_title": title,
                "i_a_id": a_id,
                "i_pub_date": pub_date,
                "i_publisher": _astring(rng, 14, 60),
                "i_subject": subject,
                "i_desc": _astring(rng, 100, 500),
                **{f"i_related{n}": related[n - 1] for n in range(1, 6)},
                "i_thumbnail": f"img{i_id % 100}/thumb_{i_id}.gif",
                "i_image": f"img{i_id % 100}/image_{i_id}.gif",
                "i_srp": srp,
                "i_cost": (srp * (1 - Decimal(rng.randint(0, 50)) / 100)).quantize(CENT),
                "i_avail": pub_date + datetime.timedelta(days=rng.randint(1, 30)),
                "i_stock": rng.randint(10, 30),
                "i_isbn": _astring(rng, 13, 13),
                "i_page": rng.randint(20, 9999),
                "i_backing": rng.choice(BACKINGS),
                "i_dimensions": f"{rng.randint(1, 99)}x{rng.randint(1, 99)}x{rng.randint(1, 99)}",
            },
        )
        first, last = authors[a_id]
        entry = {"i_id": i_id, "i_title": title, "i_pub_date": pub_date}
        entry |= {"a_fname": first, "a_lname": last}
        for kind, term in index_terms(title, subject, last):
            yield "item_index", {"kind": kind, "term": term, **entry}
    names: dict[int, tuple[str, str]] = {}
    for c_id in range(1, scale.customers + 1):
        yield "customer", customer_row(rng, c_id, rng.randint(1, scale.addresses), today)
        names[c_id] = (_astring(rng, 8, 15), _astring(rng, 8, 15))
    for addr_id in range(1, scale.addresses + 1):
        yield "address", address_row(rng, addr_id)
    for o_id in range(1, scale.orders + 1):
        c_id = rng.randint(1, scale.customers)
        lines = rng.randint(1, 5)
        o_date = today - datetime.timedelta(days=rng.randint(1, 60))
        sub_total = _money(rng, "10.00", "9999.99")
        tax = (sub_total * TAX).quantize(CENT)
        total = sub_total + tax + Decimal("3.00") + lines
        yield (
            "orders",
            {
                "o_c_id": c_id,
                "o_id": o_id,
                "o_date": o_date,
                "o_sub_total": sub_total,
                "o_tax": tax,
                "o_total": total,
                "o_ship_type": rng.choice(SHIP_TYPES),
                "o_ship_date": o_date + datetime.timedelta(days=rng.randint(0, 7)),
                "o_bill_addr_id": rng.randint(1, scale.addresses),
                "o_ship_addr_id": rng.randint(1, scale.addresses),
                "o_status": rng.choice(STATUSES),
            },
        )
        for ol_id in range(1, lines + 1):
            yield (
                "order_line",
                {
                    "ol_o_id": o_id,
                    "ol_id": ol_id,
                    "ol_i_id": rng.randint(1, scale.items),
                    "ol_qty": rng.randint(1, 300),
                    "ol_discount": Decimal(rng.randint(0, 3)) / 100,
                    "ol_comments": _astring(rng, 20, 100),
                },
            )
        first, last = names.get(c_id, ("", ""))
        yield "cc_xacts", cc_row(rng, o_id, f"{first} {last}", total, o_date, scale.countries)


def index_terms(title: str, subject: str, a_lname: str) -> list[tuple[str, str]]:
    """The item_index rows of one item: by subject (New Products too), title word, author."""
    return [("subject", subject), ("title", title.split()[0]), ("author", a_lname)]


def customer_row(
    rng: random.Random, c_id: int, addr_id: int, today: datetime.date
) -> dict[str, Any]:
    uname = digsyl(c_id)
    since = today - datetime.timedelta(days=rng.randint(1, 730))
    return {
        "c_id": c_id,
        "c_uname": uname,
        "c_passwd": uname.lower(),
        "c_fname": _astring(rng, 8, 15),
        "c_lname": _astring(rng, 8, 15),
        "c_addr_id": addr_id,
        "c_phone": _nstring(rng, rng.randint(9, 16)),
        "c_email": f"{uname}@{_astring(rng, 2, 9)}.com",
        "c_since": since,
        "c_last_login": since + datetime.timedelta(days=rng.randint(0, 60)),
        "c_login": f"{today.isoformat()}T00:00:00",
        "c_expiration": f"{today.isoformat()}T02:00:00",
        "c_discount": Decimal(rng.randint(0, 50)) / 100,
        "c_balance": Decimal("0.00"),
        "c_ytd_pmt": _money(rng, "0.00", "999.99"),
        "c_birthdate": _day(rng, datetime.date(1880, 1, 1), datetime.date(2000, 1, 1)),
        "c_data": _astring(rng, 100, 500),
    }


def address_row(rng: random.Random, addr_id: int) -> dict[str, Any]:
    return {
        "addr_id": addr_id,
        "addr_street1": _astring(rng, 15, 40),
        "addr_street2": _astring(rng, 15, 40),
        "addr_city": _astring(rng, 4, 30),
        "addr_state": _astring(rng, 2, 20),
        "addr_zip": _astring(rng, 5, 10),
        "addr_co_id": rng.randint(1, len(COUNTRIES)),
    }


def cc_row(
    rng: random.Random, o_id: int, name: str, amount: Decimal, day: datetime.date, countries: int
) -> dict[str, Any]:
    return {
        "cx_o_id": o_id,
        "cx_type": rng.choice(CC_TYPES),
        "cx_num": _nstring(rng, 16),
        "cx_name": name,
        "cx_expire": day + datetime.timedelta(days=rng.randint(10, 730)),
        "cx_auth_id": _astring(rng, 15, 15),
        "cx_xact_amt": amount,
        "cx_xact_date": day,
        "cx_co_id": rng.randint(1, countries),
    }


def table_columns(table: str) -> list[str]:
    return [
        part.split()[0]
        for part in TABLES[table].split(", ")
        if not part.startswith("PRIMARY KEY") and not part[0].isdigit() and " " in part
    ]


def write_population(
    scale: Scale, directory: Path, seed: int, today: datetime.date | None = None
) -> dict[str, tuple[Path, int]]:
    """The population as one CSV file per table (header row; empty field = NULL), for the
    Spark bulk load: table -> (file, rows)."""
    directory.mkdir(parents=True, exist_ok=True)
    files: dict[str, Any] = {}
    writers: dict[str, Any] = {}
    columns: dict[str, list[str]] = {}
    counts: Counter[str] = Counter()
    try:
        for table, row in population(scale, seed, today or datetime.date.today()):
            writer = writers.get(table)
            if writer is None:
                files[table] = (directory / f"{table}.csv").open("w", newline="")
                writer = writers[table] = csv.writer(files[table])
                columns[table] = table_columns(table)
                writer.writerow(columns[table])
            writer.writerow([_csv_text(row[c]) for c in columns[table]])
            counts[table] += 1
    finally:
        for handle in files.values():
            handle.close()
    return {table: (directory / f"{table}.csv", counts[table]) for table in writers}


def _csv_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime.date):
        return value.isoformat()
    return str(value)


# ----------------------------------------------------------------------------- the run


@dataclass
class Tally:
    """What one interaction type did: completions, latencies, commits, refused conditions."""

    done: int = 0
    committed: int = 0
    condition_failures: int = 0  # each refused Buy Confirm attempt (an abort)
    gave_up: int = 0  # Buy Confirms that failed every attempt
    errors: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)  # seconds


@dataclass
class Written:
    """Rows the committed write interactions added, for the consistency checks."""

    orders: int = 0
    order_lines: int = 0
    units: int = 0  # sum of ol_qty of the new order lines
    customers: int = 0
    addresses: int = 0
    carts: int = 0
    restocks: int = 0
    stock: Counter[int] = field(default_factory=Counter)  # i_id -> net change of i_stock
    unknown: int = 0  # commits that failed in flight: applied or not, nobody knows


class Ids:
    """New ids for one run: block r of ``ID_BLOCK`` ids per kind, r from the run counter."""

    def __init__(self, block: int) -> None:
        self.block = block
        self._next: Counter[str] = Counter()

    def new(self, kind: str) -> int:
        self._next[kind] += 1
        return self.block * ID_BLOCK + self._next[kind]


def claim_run_block(client: Client) -> int:
    """Increments the run counter with a compare-and-set, so concurrent runs against one
    cluster never hand out the same ids."""
    while True:
        current = client.get("tpcw_meta", {"name": "runs"})
        runs = 0 if current is None else int(current["value"])
        try:
            with client.transaction() as tx:
                if current is None:
                    tx.insert("tpcw_meta", {"name": "runs", "value": 1})
                else:
                    tx.update(
                        "tpcw_meta",
                        {"name": "runs"},
                        {"value": runs + 1},
                        require={"value": ("==", runs)},
                    )
            return runs + 1
        except (ConditionFailed, errors.AlreadyExists):
            continue


class Shop:
    """What the emulated browsers share: clients, sizes, the views in use, ids, tallies."""

    def __init__(
        self, clients: list[AsyncClient], scale: Scale, views: dict[str, str], block: int
    ) -> None:
        self.clients = clients
        self.scale = scale
        self.views = views
        self.ids = Ids(block)
        self.tallies = {name: Tally() for name in INTERACTIONS}
        self.written = Written()
        self.today = datetime.date.today()

    @property
    def retries(self) -> int:
        return sum(c.retries for c in self.clients)

    async def commit(self, client: AsyncClient, tx: Transaction) -> None:
        """Sends a transaction; an error in flight leaves its outcome unknown and is counted."""
        try:
            tx.timestamp = await client.commit(tx.operations)
        except asyncio.CancelledError:
            self.written.unknown += 1
            raise
        except errors.AggviewError as exc:
            # refusals are definite; a lost server or call leaves the outcome open
            if isinstance(exc, (errors.Unavailable, errors.StoreError)) or (
                type(exc) is errors.AggviewError
            ):
                self.written.unknown += 1
            raise


class Browser:
    """One emulated browser: a session (customer, cart) and TPC-W's interactions on it."""

    def __init__(self, shop: Shop, number: int, seed: int) -> None:
        self.shop = shop
        self.client = shop.clients[number % len(shop.clients)]
        self.rng = random.Random(seed * 7919 + number)
        self.c_id = self.rng.randint(1, shop.scale.customers)  # a returning customer
        self.sc_id: int | None = None
        self.last_item: int | None = None

    # -- helpers

    def _item_id(self) -> int:
        return self.rng.randint(1, self.shop.scale.items)

    def _now(self) -> str:
        return datetime.datetime.now().isoformat(timespec="seconds")

    async def _items(self, ids: list[int]) -> dict[int, dict[str, Any]]:
        rows = await asyncio.gather(*(self.client.get("item", {"i_id": i}) for i in ids))
        return {i: row for i, row in zip(ids, rows, strict=True) if row is not None}

    async def _promotion(self) -> None:
        """TPC-W's promotional items: a random item's five related items."""
        item = await self.client.get("item", {"i_id": self._item_id()})
        if item is not None:
            await self._items([item[f"i_related{n}"] for n in range(1, 6)])

    async def _cart_lines(self) -> list[dict[str, Any]]:
        if self.sc_id is None:
            return []
        return list(await self.client.scan("shopping_cart_line", {"scl_sc_id": self.sc_id}))

    async def _cart_subtotal(self, lines: list[dict[str, Any]]) -> Decimal:
        """The cart total: a view lookup, or (no view) the lines times the items' costs."""
        if "cart_total" in self.shop.views and self.sc_id is not None:
            rows = await self.client.view("cart_total", {"sc_id": self.sc_id})
            return rows[0]["subtotal"] if rows else Decimal(0)
        items = await self._items([line["scl_i_id"] for line in lines])
        return sum(
            (line["scl_qty"] * items[line["scl_i_id"]]["i_cost"] for line in lines),
            Decimal(0),
        )

    async def _show_cart(self) -> Decimal:
        lines = await self._cart_lines()
        subtotal, _ = await asyncio.gather(
            self._cart_subtotal(lines), self._items([line["scl_i_id"] for line in lines])
        )
        return subtotal

    def _new_cart(self, tx: Transaction) -> None:
        self.sc_id = self.shop.ids.new("cart")
        tx.insert("shopping_cart", {"sc_id": self.sc_id, "sc_time": self._now()})

    async def _commit_cart(self, tx: Transaction, created: bool) -> None:
        """Commits a transaction that may create the session's cart; if it does not commit,
        the session has no cart yet."""
        try:
            await self.shop.commit(self.client, tx)
        except BaseException:
            if created:
                self.sc_id = None
            raise
        self.shop.written.carts += int(created)

    # -- the 14 interactions; each returns whether it committed a write

    async def home(self) -> bool:
        await asyncio.gather(self.client.get("customer", {"c_id": self.c_id}), self._promotion())
        return False

    async def new_products(self) -> bool:
        subject = self.rng.choice(SUBJECTS)
        rows = await self.client.scan("item_index", {"kind": "subject", "term": subject})
        rows.sort(key=lambda r: (r["i_pub_date"], r["i_title"]), reverse=True)
        return False

    async def best_sellers(self) -> bool:
        subject = self.rng.choice(SUBJECTS)
        if "best_sellers" in self.shop.views:
            sold, titles = await asyncio.gather(
                self.client.view("best_sellers", {"subject": subject}),
                self.client.scan("item_index", {"kind": "subject", "term": subject}),
            )
            units = {row["i_id"]: row["units"] for row in sold}
        else:  # no view: every order line, then the subject's items
            lines, titles = await asyncio.gather(
                self.client.scan("order_line"),
                self.client.scan("item_index", {"kind": "subject", "term": subject}),
            )
            wanted = {row["i_id"] for row in titles}
            units = Counter()
            for line in lines:
                if line["ol_i_id"] in wanted:
                    units[line["ol_i_id"]] += line["ol_qty"]
        top = sorted(units.items(), key=lambda kv: (-kv[1], kv[0]))[:PAGE]
        by_id = {row["i_id"]: row for row in titles}
        _ = [(by_id.get(i_id), n) for i_id, n in top]
        if "sales_by_subject" in self.shop.views:
            await self.client.view("sales_by_subject", {"subject": subject})
        return False

    async def product_detail(self) -> bool:
        self.last_item = self._item_id()
        item = await self.client.get("item", {"i_id": self.last_item})
        if item is not None:
            await self.client.get("author", {"a_id": item["i_a_id"]})
        return False

    async def search_request(self) -> bool:
        await self._promotion()
        return False

    async def search_results(self) -> bool:
        kind = self.rng.choice(SEARCH_KINDS)
        if kind == "subject":
            term = self.rng.choice(SUBJECTS)
        elif kind == "title":
            term = title_word(self.rng, self.shop.scale)
        else:
            term = author_name(self.rng, self.shop.scale)
        rows = await self.client.scan("item_index", {"kind": kind, "term": term})
        rows.sort(key=lambda r: r["i_title"])
        return False

    async def shopping_cart(self) -> bool:
        """Adds the item last looked at (or a random one) to the cart, or now and then sets a
        line's quantity (0 removes it), then shows the cart with its total."""
        lines = {line["scl_i_id"]: line for line in await self._cart_lines()}
        tx = self.client.transaction()
        created = self.sc_id is None
        if created:
            self._new_cart(tx)
        else:
            tx.update("shopping_cart", {"sc_id": self.sc_id}, {"sc_time": self._now()})
        key = {"scl_sc_id": self.sc_id}
        if lines and self.rng.random() < 0.1:
            i_id = self.rng.choice(sorted(lines))
            qty = self.rng.randint(0, 10)
            if qty:
                tx.update("shopping_cart_line", {**key, "scl_i_id": i_id}, {"scl_qty": qty})
            else:
                tx.delete("shopping_cart_line", {**key, "scl_i_id": i_id})
        else:
            i_id = self.last_item or self._item_id()
            self.last_item = None
            if i_id in lines:
                tx.add("shopping_cart_line", {**key, "scl_i_id": i_id}, {"scl_qty": 1})
            else:
                tx.insert("shopping_cart_line", {**key, "scl_i_id": i_id, "scl_qty": 1})
        await self._commit_cart(tx, created)
        await self._show_cart()
        return True

    async def customer_registration(self) -> bool:
        """A new customer with a new address; the session continues as that customer."""
        c_id, addr_id = self.shop.ids.new("customer"), self.shop.ids.new("address")
        tx = self.client.transaction()
        tx.insert("address", address_row(self.rng, addr_id))
        tx.insert("customer", customer_row(self.rng, c_id, addr_id, self.shop.today))
        await self.shop.commit(self.client, tx)
        self.c_id = c_id
        self.shop.written.customers += 1
        self.shop.written.addresses += 1
        return True

    async def buy_request(self) -> bool:
        """Refreshes the customer's session (TPC-W's login update), puts a random item into an
        empty cart (TPC-W's addRandomItemToCartIfNecessary), and shows the order to confirm."""
        lines = await self._cart_lines()
        now = datetime.datetime.now()
        tx = self.client.transaction()
        tx.update(
            "customer",
            {"c_id": self.c_id},
            {
                "c_login": now.isoformat(timespec="seconds"),
                "c_expiration": (now + datetime.timedelta(hours=2)).isoformat(timespec="seconds"),
            },
        )
        created = False
        if not lines:
            if self.sc_id is None:
                self._new_cart(tx)
                created = True
            tx.insert(
                "shopping_cart_line",
                {"scl_sc_id": self.sc_id, "scl_i_id": self._item_id(), "scl_qty": 1},
            )
        await self._commit_cart(tx, created)
        customer = await self.client.get("customer", {"c_id": self.c_id})
        if customer is not None:
            address = await self.client.get("address", {"addr_id": customer["c_addr_id"]})
            if address is not None:
                await self.client.get("country", {"co_id": address["addr_co_id"]})
        await self._show_cart()
        return True

    async def buy_confirm(self) -> bool:
        """Turns the cart into an order: ORDERS, ORDER_LINE and CC_XACTS rows, the stock of each
        item, and an empty cart, in one transaction. Each stock change is conditional on the
        stock the order saw, so TPC-W's restocking rule (below 10 after the order: 21 more)
        holds under concurrent orders; a refused condition re-reads the stock and retries."""
        tally = self.shop.tallies["Buy Confirm"]
        for _ in range(BUY_ATTEMPTS):
            lines = await self._cart_lines()
            wanted = [(line["scl_i_id"], line["scl_qty"]) for line in lines]
            if not wanted:  # an empty cart: TPC-W adds a random item first
                wanted = [(self._item_id(), 1)]
            items, customer = await asyncio.gather(
                self._items([i for i, _ in wanted]),
                self.client.get("customer", {"c_id": self.c_id}),
            )
            if customer is None:
                raise errors.RowNotFound(f"customer {self.c_id} is missing")
            if lines:
                subtotal = await self._cart_subtotal(lines)
            else:
                subtotal = sum((q * items[i]["i_cost"] for i, q in wanted), Decimal(0))
            sub_total = (subtotal * (1 - customer["c_discount"])).quantize(CENT)
            tax = (sub_total * TAX).quantize(CENT)
            total = sub_total + tax + Decimal("3.00") + len(wanted)
            o_id = self.shop.ids.new("order")
            tx = self.client.transaction()
            tx.insert(
                "orders",
                {
                    "o_c_id": self.c_id,
                    "o_id": o_id,
                    "o_date": self.shop.today,
                    "o_sub_total": sub_total,
                    "o_tax": tax,
                    "o_total": total,
                    "o_ship_type": self.rng.choice(SHIP_TYPES),
                    "o_ship_date": self.shop.today
                    + datetime.timedelta(days=self.rng.randint(0, 7)),
                    "o_bill_addr_id": customer["c_addr_id"],
                    "o_ship_addr_id": customer["c_addr_id"],
                    "o_status": "PENDING",
                },
            )
            changes: dict[int, int] = {}
            for ol_id, (i_id, qty) in enumerate(wanted, start=1):
                tx.insert(
                    "order_line",
                    {
                        "ol_o_id": o_id,
                        "ol_id": ol_id,
                        "ol_i_id": i_id,
                        "ol_qty": qty,
                        "ol_discount": customer["c_discount"],
                        "ol_comments": _astring(self.rng, 20, 100),
                    },
                )
                if items[i_id]["i_stock"] - qty >= LOW_STOCK:
                    changes[i_id] = -qty
                    require = {"i_stock": (">=", qty + LOW_STOCK)}
                else:
                    changes[i_id] = RESTOCK - qty
                    require = {"i_stock": ("<", qty + LOW_STOCK)}
                tx.add("item", {"i_id": i_id}, {"i_stock": changes[i_id]}, require=require)
            name = f"{customer['c_fname']} {customer['c_lname']}"
            tx.insert(
                "cc_xacts", cc_row(self.rng, o_id, name, total, self.shop.today, len(COUNTRIES))
            )
            for line in lines:
                tx.delete(
                    "shopping_cart_line", {"scl_sc_id": self.sc_id, "scl_i_id": line["scl_i_id"]}
                )
            try:
                await self.shop.commit(self.client, tx)
            except ConditionFailed:
                tally.condition_failures += 1
                continue
            written = self.shop.written
            written.orders += 1
            written.order_lines += len(wanted)
            written.units += sum(q for _, q in wanted)
            written.restocks += sum(1 for i, q in wanted if changes[i] == RESTOCK - q)
            written.stock.update(changes)
            return True
        tally.gave_up += 1
        return False

    async def order_inquiry(self) -> bool:
        await self.client.get("customer", {"c_id": self.c_id})
        return False

    async def order_display(self) -> bool:
        """The customer's last order with its lines, payment and addresses."""
        customer = await self.client.get("customer", {"c_id": self.c_id})
        if customer is None:
            return False
        if "order_total" in self.shop.views:
            totals = await self.client.view("order_total", {"c_id": self.c_id})
            o_id = totals[0]["last_order"] if totals else None
            order = (
                await self.client.get("orders", {"o_c_id": self.c_id, "o_id": o_id})
                if o_id is not None
                else None
            )
        else:
            orders = await self.client.scan("orders", {"o_c_id": self.c_id})
            order = max(orders, key=lambda r: r["o_id"]) if orders else None
        if order is None:
            return False
        lines, _, _, _ = await asyncio.gather(
            self.client.scan("order_line", {"ol_o_id": order["o_id"]}),
            self.client.get("cc_xacts", {"cx_o_id": order["o_id"]}),
            self.client.get("address", {"addr_id": order["o_bill_addr_id"]}),
            self.client.get("address", {"addr_id": order["o_ship_addr_id"]}),
        )
        await self._items([line["ol_i_id"] for line in lines])
        return False

    async def admin_request(self) -> bool:
        self.last_item = self._item_id()
        item = await self.client.get("item", {"i_id": self.last_item})
        if item is not None:
            await self.client.get("author", {"a_id": item["i_a_id"]})
        return False

    async def admin_confirm(self) -> bool:
        """New cost, images and publication date for an item, and its item_index rows."""
        i_id = self.last_item or self._item_id()
        item = await self.client.get("item", {"i_id": i_id})
        if item is None:
            return False
        author = await self.client.get("author", {"a_id": item["i_a_id"]})
        a_lname = author["a_lname"] if author else ""
        cost = (item["i_srp"] * (1 - Decimal(self.rng.randint(0, 50)) / 100)).quantize(CENT)
        tx = self.client.transaction()
        tx.update(
            "item",
            {"i_id": i_id},
            {
                "i_cost": cost,
                "i_image": f"img{i_id % 100}/image_{i_id}_{self.rng.randint(1, 99)}.gif",
                "i_thumbnail": f"img{i_id % 100}/thumb_{i_id}_{self.rng.randint(1, 99)}.gif",
                "i_pub_date": self.shop.today,
            },
        )
        for kind, term in index_terms(item["i_title"], item["i_subject"], a_lname):
            key = {"kind": kind, "term": term, "i_id": i_id}
            tx.update("item_index", key, {"i_pub_date": self.shop.today})
        await self.shop.commit(self.client, tx)
        return True


STEPS: dict[str, Callable[[Browser], Awaitable[bool]]] = {
    name: getattr(Browser, name.lower().replace(" ", "_")) for name in INTERACTIONS
}


async def browse(
    browser: Browser,
    mix: str,
    stop: asyncio.Event,
    deadline: float,
    think_ms: float,
) -> None:
    """One emulated browser's loop: an interaction drawn from the mix, then think time
    (negative exponential with mean ``think_ms``, capped at ten times it, as TPC-W)."""
    weights = MIXES[mix]
    shop = browser.shop
    while not stop.is_set() and time.monotonic() < deadline:
        name = browser.rng.choices(INTERACTIONS, weights)[0]
        tally = shop.tallies[name]
        started = time.perf_counter()
        try:
            committed = await STEPS[name](browser)
        except errors.AggviewError as exc:
            tally.errors[type(exc).__name__] += 1
            await asyncio.sleep(0.05)  # a failing cluster is not hammered
            continue
        tally.latencies.append(time.perf_counter() - started)
        tally.done += 1
        tally.committed += int(committed)
        if think_ms > 0:
            pause = min(browser.rng.expovariate(1000 / think_ms), think_ms * 10 / 1000)
            try:
                await asyncio.wait_for(stop.wait(), timeout=pause)
            except asyncio.TimeoutError:
                pass
        else:
            await asyncio.sleep(0)
