"""The thesis's dashboard application (seed 004, §2.1 and §6.3): shops advertise products in
categories; every click or view is an event that costs the shop money. Its aggregate views are
the cost a shop accumulated per category (SQL-1, as a view: a lookup instead of a 312,176-row
query plan) and the cost per category (Figure 4.1)."""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from aggclient import Client
from aggview import errors
from loadgen.consistency import Ledger

TABLES = [
    "CREATE TABLE categories (id INT PRIMARY KEY, name TEXT NOT NULL, parent INT)",
    "CREATE TABLE shops (id INT PRIMARY KEY, name TEXT NOT NULL)",
    "CREATE TABLE address (shop_id INT PRIMARY KEY, street TEXT, city TEXT, province TEXT, "
    "code TEXT, country TEXT)",
    "CREATE TABLE products (id INT PRIMARY KEY, shop_id INT NOT NULL, cat_id INT NOT NULL, "
    "name TEXT)",
    "CREATE TABLE events (id INT PRIMARY KEY, day DATE NOT NULL, prod_id INT NOT NULL, "
    "shop_id INT NOT NULL, type TEXT NOT NULL, cost DECIMAL(10,2) NOT NULL)",
]

# SQL-1 of the thesis, kept for every (shop, category): one lookup answers it.
SHOP_CATEGORY_COST = (
    "SELECT s.name AS shop, c.name AS category, SUM(e.cost) AS cost, COUNT(*) AS events "
    "FROM events e JOIN products p ON e.prod_id = p.id JOIN categories c ON p.cat_id = c.id "
    "JOIN shops s ON e.shop_id = s.id GROUP BY s.name, c.name"
)
# Figure 4.1: the total cost per category.
CATEGORY_COST = (
    "SELECT p.cat_id, SUM(e.cost) AS cost, COUNT(*) AS events, MAX(e.cost) AS top "
    "FROM events e JOIN products p ON e.prod_id = p.id GROUP BY p.cat_id"
)


def view_ddl(
    name: str,
    select: str,
    mode: str = "sync",
    interval_ms: int = 500,
    nodes: int = 2,
    speculation: str = "speculative",
    host: str = "local",
    feed_ms: int = 0,
    depth: int = 0,
) -> str:
    """``mode``: sync, async (refreshed every ``interval_ms``) or cumulus (an epoch every
    ``interval_ms`` on ``nodes`` DW nodes hosted by ``host``, ``speculation`` speculative or
    conservative, its M3 program at ``depth``: 0 for every level)."""
    options = {
        "sync": "",
        "async": f" WITH (refresh = 'async', interval_ms = {interval_ms})",
        "cumulus": f" WITH (refresh = 'cumulus', epoch_ms = {interval_ms}, nodes = {nodes}, "
        f"mode = '{speculation}', host = '{host}'"
        + (f", feed_ms = {feed_ms}" if feed_ms else "")
        + (f", depth = {depth}" if depth else "")
        + ")",
    }[mode]
    return f"CREATE MATERIALIZED VIEW {name}{options} AS {select}"


@dataclass
class Scale:
    shops: int = 50
    products: int = 5000
    categories: int = 20


def create_schema(client: Client) -> None:
    for ddl in TABLES:
        client.sql(ddl)


def populate(client: Client, scale: Scale, *, batch: int = 500) -> None:
    """The static tables: categories, shops with addresses, products."""
    rows: list[tuple[str, dict[str, Any]]] = []
    for i in range(scale.categories):
        rows.append(("categories", {"id": i, "name": f"category {i}", "parent": None}))
    for i in range(scale.shops):
        rows.append(("shops", {"id": i, "name": f"shop {i}"}))
        rows.append(("address", {"shop_id": i, "city": f"city {i % 7}", "country": "NL"}))
    for i in range(scale.products):
        rows.append(
            (
                "products",
                {
                    "id": i,
                    "shop_id": i % scale.shops,
                    "cat_id": i % scale.categories,
                    "name": f"product {i}",
                },
            )
        )
    for start in range(0, len(rows), batch):
        with client.transaction() as tx:
            for table, row in rows[start : start + batch]:
                tx.insert(table, row)


def event(rng: random.Random, event_id: int, scale: Scale, hot: bool = False) -> dict[str, Any]:
    """A click or view of a random product; ``hot``: always product 0, so every event of the
    load lands in one group of every view (the hot-group case)."""
    product = 0 if hot else rng.randrange(scale.products)
    return {
        "id": event_id,
        "day": "2011-06-01",
        "prod_id": product,
        "shop_id": product % scale.shops,
        "type": rng.choice(["click", "view"]),
        "cost": Decimal(rng.randrange(1, 500)) / 100,
    }


def group_of(event: dict[str, Any], scale: Scale) -> tuple[str, str]:
    """The (shop, category) group of SQL-1 an event of ``event()`` lands in, by the names and
    the product -> category placement of ``populate``."""
    return f"shop {event['shop_id']}", f"category {event['prod_id'] % scale.categories}"


def move(rng: random.Random, scale: Scale, hot: bool = False) -> tuple[int, int]:
    """A product (product 0 when ``hot``) and another category for it: a write of the
    dimension every event joins, moving the product's whole cost between groups of SQL-1."""
    product = 0 if hot else rng.randrange(scale.products)
    return product, rng.randrange(scale.categories)


def rename(rng: random.Random, scale: Scale, tag: str) -> tuple[int, str]:
    """A category and a new name for it, made unique by ``tag`` (SQL-1 groups by name): a
    write of the dimension every event joins, a few rows that many events read."""
    category = rng.randrange(scale.categories)
    return category, f"category {category} ({tag})"


def ledger_at(snapshot: Any) -> Ledger:
    """SQL-1's groups at ``snapshot`` (a client snapshot), each product's shop and category and
    its totals there, and the categories' names: what the benchmark's events add to and its
    product moves and category renames change."""
    categories = {r["id"]: r["name"] for r in snapshot.scan("categories")}
    shops = {r["id"]: r["name"] for r in snapshot.scan("shops")}
    placement = {
        r["id"]: (shops[r["shop_id"]], r["cat_id"])
        for r in snapshot.scan("products")
        if r["shop_id"] in shops and r["cat_id"] in categories
    }
    totals: dict[tuple[str, str], tuple[Decimal, int]] = {}
    items: dict[int, tuple[Decimal, int]] = {}
    for row in snapshot.scan("events"):
        place = placement.get(row["prod_id"])
        if place is None or row["shop_id"] not in shops:
            continue
        if place[0] != shops[row["shop_id"]]:
            raise errors.FailedPrecondition(
                f"event {row['id']} is not of its product's shop: not the dashboard's data"
            )
        group = (place[0], categories[place[1]])
        cost, count = totals.get(group, (Decimal(0), 0))
        totals[group] = (cost + row["cost"], count + 1)
        cost, count = items.get(row["prod_id"], (Decimal(0), 0))
        items[row["prod_id"]] = (cost + row["cost"], count + 1)
    return Ledger(
        totals, snapshot.timestamp, placement=placement, names=categories, item_baseline=items
    )


def correction(rng: random.Random, scale: Scale) -> dict[str, Any]:
    """An update of an event: another product (so another group of every view) and cost."""
    product = rng.randrange(scale.products)
    return {
        "prod_id": product,
        "shop_id": product % scale.shops,
        "cost": Decimal(rng.randrange(1, 500)) / 100,
    }


EVENT_COLUMNS = ("id", "day", "prod_id", "shop_id", "type", "cost")


def write_events_csv(path: Path, count: int, scale: Scale, seed: int = 42) -> None:
    """``count`` events (ids 0..count-1) as a CSV file with a header, for bulk loads."""
    rng = random.Random(seed)
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(EVENT_COLUMNS)
        for i in range(count):
            row = event(rng, i, scale)
            out.writerow([row[c] for c in EVENT_COLUMNS])


def recompute_shop_category_cost(client: Client) -> dict[tuple[str, str], tuple[Decimal, int]]:
    """SQL-1 for every (shop, category), computed from plain scans: what the view must equal."""
    categories = {r["id"]: r["name"] for r in client.scan("categories")}
    shops = {r["id"]: r["name"] for r in client.scan("shops")}
    products = {r["id"]: r for r in client.scan("products")}
    totals: dict[tuple[str, str], tuple[Decimal, int]] = {}
    for row in client.scan("events"):
        product = products.get(row["prod_id"])
        if product is None or product["cat_id"] not in categories or row["shop_id"] not in shops:
            continue
        group = (shops[row["shop_id"]], categories[product["cat_id"]])
        cost, count = totals.get(group, (Decimal(0), 0))
        totals[group] = (cost + row["cost"], count + 1)
    return totals


def view_totals(rows: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[Decimal, int]]:
    return {(r["shop"], r["category"]): (r["cost"], r["events"]) for r in rows}
