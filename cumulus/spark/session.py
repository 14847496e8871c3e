"""One local Spark session per process, configured for exact, small-machine jobs."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from aggview import errors

_session: Any = None


def check_java() -> None:
    """PySpark 4 needs Java 17+; say so plainly instead of a JVM launch stack trace."""
    java = (
        shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin"))
        if os.environ.get("JAVA_HOME")
        else shutil.which("java")
    )
    if java is None:
        raise errors.FailedPrecondition(
            "the Spark layer needs Java 17 or newer: install a JDK (e.g. openjdk-17-jre) or set "
            "JAVA_HOME"
        )
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        ).stderr
    except OSError as exc:
        raise errors.FailedPrecondition(f"cannot run {java}: {exc}") from None
    version = _java_major(out)
    if version is not None and version < 17:
        raise errors.FailedPrecondition(
            f"the Spark layer needs Java 17 or newer; {java} is Java {version}"
        )


def _java_major(version_output: str) -> int | None:
    """17 from 'openjdk version "17.0.15"', 8 from '"1.8.0_392"'."""
    for token in version_output.split('"')[1:2]:
        parts = token.split(".")
        try:
            major = int(parts[0])
            return int(parts[1]) if major == 1 and len(parts) > 1 else major
        except ValueError:
            return None
    return None


def spark_session(master: str | None = None) -> Any:
    """The process's Spark session (created once), with the aggview Data Source registered."""
    global _session
    if _session is not None:
        return _session
    check_java()
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise errors.FailedPrecondition(
            "the Spark layer needs PySpark 4: pip install 'pyspark>=4.0' pyarrow"
        ) from None
    from cumulus.spark.source import AggviewDataSource

    master = master or os.environ.get("AGGVIEW_SPARK_MASTER", "local[2]")
    builder = (
        SparkSession.builder.master(master)
        .appName("aggview")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "4")
        # exact arithmetic: errors instead of silent overflow, no rounding of decimal products
        .config("spark.sql.ansi.enabled", "true")
        .config("spark.sql.decimalOperations.allowPrecisionLoss", "false")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", os.environ.get("AGGVIEW_SPARK_MEMORY", "2g"))
        .config("spark.python.worker.reuse", "true")
    )
    _session = builder.getOrCreate()
    _session.sparkContext.setLogLevel("ERROR")
    _session.dataSource.register(AggviewDataSource)
    return _session


def stop_session() -> None:
    global _session
    if _session is not None:
        _session.stop()
        _session = None
