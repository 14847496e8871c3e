"""The Spark layer: a Data Source over the cluster, bulk loads, views computed and verified by
Spark SQL at a held snapshot. Imports PySpark lazily, so the rest of aggview runs without it."""
