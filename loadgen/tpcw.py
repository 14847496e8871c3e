"""TPC-W on aggview (the thesis's §6.4): an online book shop's ten tables, its views, its sizes
and its three mixes. Its population rules are in ``loadgen.tpcw_population``, its 14 web
interactions (one-shot transactions and snapshot reads) in ``loadgen.tpcw_interactions``.

The shop keeps its aggregate answers in views: the cart total per cart and the order total per
customer (sync: a page must show the exact amount), units sold per subject and per item (async:
TPC-W itself lets Best Sellers be up to 30 s stale). Every read an interaction makes is a get
by key, a scan of a primary-key prefix or a view read; where TPC-W queries with LIKE or ORDER BY
over a whole table, the shop keeps an index table the application maintains (``item_index``)
and sorts the few rows it read. ``docs/DECISIONS.md`` ("TPC-W") lists where this differs from
the specification and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from aggclient import Client
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


def table_columns(table: str) -> list[str]:
    return [
        part.split()[0]
        for part in TABLES[table].split(", ")
        if not part.startswith("PRIMARY KEY") and not part[0].isdigit() and " " in part
    ]
