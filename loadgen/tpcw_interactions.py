"""TPC-W's emulated browsers: the 14 web interactions as one-shot transactions and snapshot
reads on the shop (loadgen.tpcw), what they tally, and the loop that draws them from a mix.
"""

from __future__ import annotations

import asyncio
import datetime
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from aggclient import AsyncClient, Client, ConditionFailed
from aggclient.client import Transaction
from aggview import errors
from loadgen.tpcw import (
    BUY_ATTEMPTS,
    CENT,
    COUNTRIES,
    ID_BLOCK,
    INTERACTIONS,
    LOW_STOCK,
    MIXES,
    PAGE,
    RESTOCK,
    SEARCH_KINDS,
    SHIP_TYPES,
    SUBJECTS,
    TAX,
    Scale,
)
from loadgen.tpcw_population import (
    address_row,
    astring,
    author_name,
    cc_row,
    customer_row,
    index_terms,
    title_word,
)


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


@dataclass
class _Order:
    """A Buy Confirm's order as priced from what it read: the cart's lines, (item, quantity)
    wanted, the items and the customer read, and the amounts."""

    lines: list[dict[str, Any]]
    wanted: list[tuple[int, int]]
    items: dict[int, dict[str, Any]]
    customer: dict[str, Any]
    sub_total: Decimal
    tax: Decimal
    total: Decimal


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
            order = await self._price_order()
            tx = self.client.transaction()
            changes = self._write_order(tx, order)
            try:
                await self.shop.commit(self.client, tx)
            except ConditionFailed:
                tally.condition_failures += 1
                continue
            written = self.shop.written
            written.orders += 1
            written.order_lines += len(order.wanted)
            written.units += sum(q for _, q in order.wanted)
            written.restocks += sum(1 for i, q in order.wanted if changes[i] == RESTOCK - q)
            written.stock.update(changes)
            return True
        tally.gave_up += 1
        return False

    async def _price_order(self) -> _Order:
        """Reads the cart, its items and the customer (an empty cart: TPC-W adds a random item
        first), and prices the order."""
        lines = await self._cart_lines()
        wanted = [(line["scl_i_id"], line["scl_qty"]) for line in lines]
        if not wanted:
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
        return _Order(lines, wanted, items, customer, sub_total, tax, total)

    def _write_order(self, tx: Transaction, order: _Order) -> dict[int, int]:
        """The order's rows, conditional stock changes and emptied cart into ``tx``; the
        stock change of each item."""
        customer = order.customer
        o_id = self.shop.ids.new("order")
        tx.insert(
            "orders",
            {
                "o_c_id": self.c_id,
                "o_id": o_id,
                "o_date": self.shop.today,
                "o_sub_total": order.sub_total,
                "o_tax": order.tax,
                "o_total": order.total,
                "o_ship_type": self.rng.choice(SHIP_TYPES),
                "o_ship_date": self.shop.today + datetime.timedelta(days=self.rng.randint(0, 7)),
                "o_bill_addr_id": customer["c_addr_id"],
                "o_ship_addr_id": customer["c_addr_id"],
                "o_status": "PENDING",
            },
        )
        changes: dict[int, int] = {}
        for ol_id, (i_id, qty) in enumerate(order.wanted, start=1):
            tx.insert(
                "order_line",
                {
                    "ol_o_id": o_id,
                    "ol_id": ol_id,
                    "ol_i_id": i_id,
                    "ol_qty": qty,
                    "ol_discount": customer["c_discount"],
                    "ol_comments": astring(self.rng, 20, 100),
                },
            )
            changes[i_id] = self._change_stock(tx, i_id, qty, order.items[i_id]["i_stock"])
        name = f"{customer['c_fname']} {customer['c_lname']}"
        tx.insert(
            "cc_xacts",
            cc_row(self.rng, o_id, name, order.total, self.shop.today, len(COUNTRIES)),
        )
        for line in order.lines:
            tx.delete("shopping_cart_line", {"scl_sc_id": self.sc_id, "scl_i_id": line["scl_i_id"]})
        return changes

    @staticmethod
    def _change_stock(tx: Transaction, i_id: int, qty: int, stock: int) -> int:
        """Takes ``qty`` from an item's stock, restocking below LOW_STOCK, on the condition
        that the stock is still on the side of LOW_STOCK it was read on; the change."""
        if stock - qty >= LOW_STOCK:
            change = -qty
            require = {"i_stock": (">=", qty + LOW_STOCK)}
        else:
            change = RESTOCK - qty
            require = {"i_stock": ("<", qty + LOW_STOCK)}
        tx.add("item", {"i_id": i_id}, {"i_stock": change}, require=require)
        return change

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
        """The page that shows an item for the administrator to change: the same reads as a
        product detail."""
        return await self.product_detail()

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
