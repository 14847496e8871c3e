"""TPC-W's initial database (clause 4.7): its rows, generated from a seed so that every run of
one scale is the same shop, and written as CSV files for the Spark bulk load.
"""

from __future__ import annotations

import csv
import datetime
import random
import string
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

from loadgen.tpcw import (
    BACKINGS,
    CC_TYPES,
    CENT,
    COUNTRIES,
    CURRENCIES,
    SHIP_TYPES,
    STATUSES,
    SUBJECTS,
    SYLLABLES,
    TAX,
    Scale,
    table_columns,
)


def digsyl(number: int) -> str:
    """TPC-W's DigSyl: each decimal digit as a syllable (names that searches can guess)."""
    return "".join(SYLLABLES[int(d)] for d in str(number))


def astring(rng: random.Random, low: int, high: int) -> str:
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
    Python values; shopping carts start empty. One random sequence runs through the tables in
    this order, so a seed gives the same rows every time."""
    rng = random.Random(seed)
    yield from _countries(rng)
    authors: dict[int, tuple[str, str]] = {}  # a_id -> (first, last name)
    yield from _authors(rng, scale, authors)
    for i_id in range(1, scale.items + 1):
        yield from _item_rows(rng, scale, today, i_id, authors)
    names: dict[int, tuple[str, str]] = {}  # c_id -> the name its orders' cards carry
    for c_id in range(1, scale.customers + 1):
        yield "customer", customer_row(rng, c_id, rng.randint(1, scale.addresses), today)
        names[c_id] = (astring(rng, 8, 15), astring(rng, 8, 15))
    for addr_id in range(1, scale.addresses + 1):
        yield "address", address_row(rng, addr_id)
    for o_id in range(1, scale.orders + 1):
        yield from _order_rows(rng, scale, today, o_id, names)


def _countries(rng: random.Random) -> Iterator[tuple[str, dict[str, Any]]]:
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


def _authors(
    rng: random.Random, scale: Scale, authors: dict[int, tuple[str, str]]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The authors' rows; each one's names go into ``authors`` for its items' index rows."""
    for a_id in range(1, scale.authors + 1):
        first, last = astring(rng, 3, 20), author_name(rng, scale)
        authors[a_id] = (first, last)
        yield (
            "author",
            {
                "a_id": a_id,
                "a_fname": first,
                "a_lname": last,
                "a_mname": astring(rng, 1, 20),
                "a_dob": _day(rng, datetime.date(1800, 1, 1), datetime.date(1990, 1, 1)),
                "a_bio": astring(rng, 125, 500),
            },
        )


def _item_rows(
    rng: random.Random,
    scale: Scale,
    today: datetime.date,
    i_id: int,
    authors: dict[int, tuple[str, str]],
) -> Iterator[tuple[str, dict[str, Any]]]:
    """One item's row and its item_index rows."""
    # the first items/4 items have one author each, the rest a random one (clause 4.7.1)
    a_id = i_id if i_id <= scale.authors else rng.randint(1, scale.authors)
    title = f"{title_word(rng, scale)} {astring(rng, 10, 50)}"
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
            "i_publisher": astring(rng, 14, 60),
            "i_subject": subject,
            "i_desc": astring(rng, 100, 500),
            **{f"i_related{n}": related[n - 1] for n in range(1, 6)},
            "i_thumbnail": f"img{i_id % 100}/thumb_{i_id}.gif",
            "i_image": f"img{i_id % 100}/image_{i_id}.gif",
            "i_srp": srp,
            "i_cost": (srp * (1 - Decimal(rng.randint(0, 50)) / 100)).quantize(CENT),
            "i_avail": pub_date + datetime.timedelta(days=rng.randint(1, 30)),
            "i_stock": rng.randint(10, 30),
            "i_isbn": astring(rng, 13, 13),
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


def _order_rows(
    rng: random.Random,
    scale: Scale,
    today: datetime.date,
    o_id: int,
    names: dict[int, tuple[str, str]],
) -> Iterator[tuple[str, dict[str, Any]]]:
    """One past order: its row, its lines and its card payment."""
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
                "ol_comments": astring(rng, 20, 100),
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
        "c_fname": astring(rng, 8, 15),
        "c_lname": astring(rng, 8, 15),
        "c_addr_id": addr_id,
        "c_phone": _nstring(rng, rng.randint(9, 16)),
        "c_email": f"{uname}@{astring(rng, 2, 9)}.com",
        "c_since": since,
        "c_last_login": since + datetime.timedelta(days=rng.randint(0, 60)),
        "c_login": f"{today.isoformat()}T00:00:00",
        "c_expiration": f"{today.isoformat()}T02:00:00",
        "c_discount": Decimal(rng.randint(0, 50)) / 100,
        "c_balance": Decimal("0.00"),
        "c_ytd_pmt": _money(rng, "0.00", "999.99"),
        "c_birthdate": _day(rng, datetime.date(1880, 1, 1), datetime.date(2000, 1, 1)),
        "c_data": astring(rng, 100, 500),
    }


def address_row(rng: random.Random, addr_id: int) -> dict[str, Any]:
    return {
        "addr_id": addr_id,
        "addr_street1": astring(rng, 15, 40),
        "addr_street2": astring(rng, 15, 40),
        "addr_city": astring(rng, 4, 30),
        "addr_state": astring(rng, 2, 20),
        "addr_zip": astring(rng, 5, 10),
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
        "cx_auth_id": astring(rng, 15, 15),
        "cx_xact_amt": amount,
        "cx_xact_date": day,
        "cx_co_id": rng.randint(1, countries),
    }


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
