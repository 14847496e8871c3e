"""The Spark layer over the HBase adapter (on the Thrift test fixture): key ranges come from
the HBase table's keys, one Spark partition each, and a bulk load stages its rows in HBase."""

from __future__ import annotations

import csv
import uuid
from pathlib import Path
from typing import Any

from hbase_thrift_fixture import HBaseThriftFixture

from aggclient import Client
from aggclient.bulk_client import BulkClient
from agglauncher.cluster import LocalCluster
from aggspark import jobs
from aggspark.source import AggviewReader


def test_data_source_and_bulk_load_over_hbase(spark: Any, tmp_path: Path) -> None:
    with HBaseThriftFixture() as hbase:
        url = hbase.url(table_prefix=f"s{uuid.uuid4().hex[:8]}", retry_seconds=5)
        cluster = LocalCluster(tmp_path / "data", ltms=2, checkpoint_interval=0.3, store=url)
        try:
            cluster.start()
            with Client(cluster.address) as client:
                client.sql("CREATE TABLE items (id INT PRIMARY KEY, label TEXT NOT NULL)")
            path = tmp_path / "items.csv"
            with path.open("w", newline="") as f:
                out = csv.writer(f)
                out.writerow(["id", "label"])
                out.writerows([i, f"item {i}"] for i in range(400))
            loaded = jobs.load_files(spark, cluster.address, "items", [str(path)])
            assert loaded.rows == 400
            cluster.stop()  # a clean stop checkpoints every row into HBase
            cluster.servers.clear()
            cluster.start()
            with Client(cluster.address) as client:
                described = BulkClient(client).describe("items")
            from pyspark.sql.types import StructType

            reader = AggviewReader(
                {"address": cluster.address, "partitions": "4"}, described, StructType()
            )
            assert len(reader.partitions()) == 4  # split points from the HBase table's keys
            frame = (
                spark.read.format("aggview")
                .option("address", cluster.address)
                .option("table", "items")
                .option("partitions", "4")
                .load()
            )
            assert frame.rdd.getNumPartitions() == 4
            assert sorted((r["id"], r["label"]) for r in frame.collect()) == [
                (i, f"item {i}") for i in range(400)
            ]
        finally:
            cluster.stop()
            cluster.kill()
