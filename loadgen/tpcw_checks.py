"""What ``aggview bench tpcw`` checks after the load: that the committed interactions' rows are
in the tables and nothing else, and every view against a Spark recomputation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aggclient import Client
from loadgen import tpcw, tpcw_interactions


@dataclass
class Snapshot:
    """Row counts and stock before or after the load, for the consistency checks."""

    rows: dict[str, int]
    stock: dict[int, int]


def snapshot(client: Client) -> Snapshot:
    counted = ("orders", "order_line", "cc_xacts", "customer", "address", "shopping_cart")
    return Snapshot(
        rows={table: len(client.scan(table)) for table in counted},
        stock={row["i_id"]: row["i_stock"] for row in client.scan("item")},
    )


def consistency(
    before: Snapshot, after: Snapshot, written: tpcw_interactions.Written
) -> dict[str, Any]:
    """Whether every committed write interaction's rows are there, and nothing else: new rows
    per table against the commits the browsers saw, and each item's stock change against the
    orders and restocks that touched it. Assumes no other writer ran meanwhile."""
    expected = {
        "orders": written.orders,
        "order_line": written.order_lines,
        "cc_xacts": written.orders,
        "customer": written.customers,
        "address": written.addresses,
        "shopping_cart": written.carts,
    }
    checks: dict[str, Any] = {}
    for table, want in expected.items():
        new = after.rows[table] - before.rows[table]
        checks[table] = {"new_rows": new, "committed": want, "ok": new == want}
    changed = {
        i_id: after.stock.get(i_id, 0) - stock
        for i_id, stock in before.stock.items()
        if after.stock.get(i_id, 0) != stock
    }
    wanted = {i_id: delta for i_id, delta in written.stock.items() if delta}
    wrong = sorted(set(changed) | set(wanted), key=str)
    wrong = [i for i in wrong if changed.get(i, 0) != wanted.get(i, 0)]
    checks["stock"] = {
        "items_changed": len(changed),
        "net_change": sum(changed.values()),
        "ordered_units": written.units,
        "restocks": written.restocks,
        "expected_net_change": tpcw.RESTOCK * written.restocks - written.units,
        "items_wrong": wrong[:20],
        "ok": not wrong,
    }
    checks["unknown_outcomes"] = written.unknown
    checks["ok"] = all(c["ok"] for c in checks.values() if isinstance(c, dict)) and not (
        written.unknown
    )
    return checks


def verify(
    spark: Any, address: str, views: list[str], client_options: dict[str, Any]
) -> list[dict[str, Any]]:
    """Each view against a Spark recomputation at a timestamp it is exact at."""
    from aggspark import jobs

    out = []
    for result in jobs.verify_views(spark, address, views, client_options=client_options):
        out.append(
            {
                "view": result.view,
                "ok": result.ok,
                "groups": result.groups,
                "timestamp": result.timestamp,
                "differences": len(result.differences),
                "examples": [
                    {"group": d.group, "expected": d.expected, "actual": d.actual}
                    for d in result.differences[:3]
                ],
            }
        )
    return out
