"""Preparing the shop for ``aggview bench tpcw``: the population (loaded once through the Spark
bulk path, and reused by a later run of the same size) and the views in the modes a run asks
for.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from aggclient import Client
from aggclient.bulk_client import BulkClient
from aggview import errors
from loadgen import tpcw, tpcw_population


def population_meta(client: Client, tables: list[str]) -> dict[str, int] | None:
    """The sizes of the population the cluster holds, None if it holds none; a partial one
    (an interrupted load) is refused."""
    present = [t for t in tpcw.TABLES if t in tables]
    if not present:
        return None
    meta = (
        {row["name"]: row["value"] for row in client.scan("tpcw_meta")}
        if "tpcw_meta" in tables
        else {}
    )
    if "items" not in meta or len(present) != len(tpcw.TABLES):
        raise errors.FailedPrecondition(
            "the cluster holds TPC-W tables without a complete population (an interrupted "
            f"load?): {', '.join(present)}; drop them or use a fresh cluster"
        )
    return meta


def check_population(meta: dict[str, int], scale: tpcw.Scale) -> None:
    if meta["items"] != scale.items or meta["customers"] != scale.customers:
        raise errors.InvalidArgument(
            f"the cluster holds a TPC-W population of {meta['items']:,} items and "
            f"{meta['customers']:,} customers; this run asks for {scale.items:,} items and "
            f"{scale.customers:,} ({scale.browsers} browsers x {scale.customers_per_browser}): "
            "run with matching sizes, or against a fresh cluster"
        )


def load_population(
    spark: Any,
    address: str,
    scale: tpcw.Scale,
    seed: int,
    workdir: Path,
    today: datetime.date,
    client_options: dict[str, Any],
    say: Any,
) -> dict[str, int]:
    """The population as CSV files, each loaded by one Spark bulk load (one transaction per
    table); the meta rows are written last, so a cluster without them is known unfinished."""
    say(f"writing the population of {scale.customers:,} customers and {scale.items:,} items")
    files = tpcw_population.write_population(scale, workdir / "population", seed, today)
    from aggspark import jobs

    loaded = {}
    for table, (path, rows) in files.items():
        say(f"loading {rows:,} rows into {table}")
        result = jobs.load_files(spark, address, table, [str(path)], client_options=client_options)
        loaded[table] = result.rows
    with Client(address, **client_options) as client, client.transaction() as tx:
        for name, value in scale.meta().items():
            tx.insert("tpcw_meta", {"name": name, "value": value})
    return loaded


def prepare_views(
    client: Client,
    spark: Any,
    address: str,
    wanted: dict[str, str],
    interval_ms: int,
    populated: bool,
    client_options: dict[str, Any],
    say: Any,
) -> None:
    """Makes the cluster's TPC-W views what the run asks for. On empty tables a view is just
    declared (the bulk load then maintains it); over a population it is initialized by Spark
    from a snapshot (a cumulus view's runtime loads its snapshot itself); an existing view in
    another mode or interval is switched live (ALTER ... SET)."""
    views = set(BulkClient(client).list()[1])
    for name in tpcw.VIEWS:
        mode = wanted.get(name)
        if name in views:
            plan = BulkClient(client).describe(name).plan or {}
            if mode is None:
                say(f"dropping view {name} ({plan.get('mode')})")
                client.sql(f"DROP MATERIALIZED VIEW {name}")
            elif plan.get("mode") != mode or (
                mode != "sync" and plan.get("interval_ms") != interval_ms
            ):
                say(f"switching view {name} from {plan.get('mode')} to {mode}")
                options = tpcw.view_options(mode, interval_ms)
                client.sql(f"ALTER MATERIALIZED VIEW {name} SET ({options})")
            continue
        if mode is None:
            continue
        ddl = tpcw.view_ddl(name, mode, interval_ms)
        if populated and mode != "cumulus":
            from aggspark import jobs

            say(f"initializing view {name} ({mode}) with Spark")
            jobs.init_view(spark, address, sql=ddl, client_options=client_options)
        else:
            client.sql(ddl)
