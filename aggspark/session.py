"""One local Spark session per process, configured for exact, small-machine jobs.

Spark's Python workers run on the interpreter that runs aggview (``sys.executable``), not on
whatever ``python3`` comes first on PATH, unless the user set ``PYSPARK_PYTHON``. The JVM's own
output (its warnings, log4j, the Python workers' stderr) goes to a log file (:func:`spark_log`),
not into the user's terminal; the project shows job progress itself (``aggspark.progress``).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aggspark import class_archive
from aggview import errors
from aggview.processes import log_tail

_session: Any = None
_writing: class_archive.Writing | None = None  # the class archive this session's JVM writes


def check_java() -> str:
    """PySpark 4 needs Java 17+; say so plainly instead of a JVM launch stack trace. Returns
    what ``java -version`` said."""
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
    return out


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


def spark_log() -> Path:
    """Where this process's Spark writes its own output: ``$AGGVIEW_SPARK_LOG``, or
    ``aggview/spark-<pid>.log`` under the user's cache directory."""
    if os.environ.get("AGGVIEW_SPARK_LOG"):
        return Path(os.environ["AGGVIEW_SPARK_LOG"])
    return cache_directory() / f"spark-{os.getpid()}.log"


def cache_directory() -> Path:
    """aggview's directory under the user's cache directory."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "aggview"


def _use_this_interpreter() -> None:
    """Workers (and driver-side Python) run on this interpreter, which has aggview installed."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def _home_without_zips() -> None:
    """SPARK_HOME for a local session whose Python workers import PySpark as installed.

    Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on every Python worker's path, and
    Python compiles a module imported from a zip each time (no bytecode cache): 1.8 CPU-s a
    worker process against 0.6 from site-packages, and a job starts several. Where the user
    set no SPARK_HOME and the workers run this interpreter (which has PySpark installed), the
    session's SPARK_HOME is a directory of links to the package's own (``bin``, ``jars``, ...)
    without ``python/``, so the workers import the installed PySpark and its cached bytecode."""
    if os.environ.get("SPARK_HOME") or os.environ.get("PYSPARK_PYTHON") != sys.executable:
        return
    import pyspark

    package = Path(pyspark.__file__).parent
    if not (package / "jars").is_dir():
        return  # not pip's layout: leave Spark to find its home
    digest = hashlib.sha1(str(package).encode()).hexdigest()[:12]
    home = cache_directory() / f"spark-home-{pyspark.__version__}-{digest}"
    try:
        if not home.is_dir():
            staging = home.with_name(f"{home.name}.{os.getpid()}")
            staging.mkdir(parents=True, exist_ok=True)
            for entry in package.iterdir():
                if entry.is_dir() and entry.name not in ("python", "__pycache__"):
                    (staging / entry.name).symlink_to(entry, target_is_directory=True)
            try:
                staging.rename(home)  # another process's, made meanwhile, is as good
            except OSError:
                shutil.rmtree(staging, ignore_errors=True)
    except OSError:
        return  # no cache directory to write: the package's own home, zips and all
    os.environ["SPARK_HOME"] = str(home)


_launch_lock = threading.Lock()


@contextlib.contextmanager
def _output_to(log: Path) -> Iterator[None]:
    """The JVM inherits this process's stdout and stderr when it starts: point both at the log
    for the moment of the launch, so everything it ever prints lands there."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with _launch_lock, log.open("ab") as target:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(target.fileno(), 1)
            os.dup2(target.fileno(), 2)
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


# A local session's JVM lives for a command or a test run and its jobs last seconds: the C1
# compiler alone and the serial collector halve its CPU (two Spark test files: 68 -> 33 CPU-s),
# C2's compilations never paying back. AGGVIEW_SPARK_JAVA_OPTIONS replaces them.
LOCAL_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def extra_settings() -> dict[str, str]:
    """``AGGVIEW_SPARK_CONF='key=value,...'``: Spark settings added to every session aggview
    starts (after its own, so they win), for what the defaults do not fit."""
    out = {}
    for item in filter(
        None, (i.strip() for i in os.environ.get("AGGVIEW_SPARK_CONF", "").split(","))
    ):
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise errors.FailedPrecondition(
                f"AGGVIEW_SPARK_CONF: {item!r} is not key=value (settings are separated by commas)"
            )
        out[key.strip()] = value.strip()
    return out


def spark_session(master: str | None = None, write_classes: bool = False) -> Any:
    """The process's Spark session (created once), with the aggview Data Source registered.
    ``write_classes``: where no class archive is kept yet, this session's JVM records it
    (``aggspark.class_archive``'s writer; ``stop_session`` waits for it)."""
    global _session, _writing
    if _session is not None:
        return _session
    java_version = check_java()
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise errors.FailedPrecondition(
            "the Spark layer needs PySpark 4: pip install 'pyspark>=4.0' pyarrow"
        ) from None
    from aggspark.source import AggviewDataSource

    master = master or os.environ.get("AGGVIEW_SPARK_MASTER", "local[2]")
    _use_this_interpreter()
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no "resolves to a loopback" warning
        _home_without_zips()
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
        .config("spark.ui.showConsoleProgress", "false")  # progress is shown by the project
    )
    writing = None
    if master.startswith("local"):
        java_options = os.environ.get("AGGVIEW_SPARK_JAVA_OPTIONS")
        if java_options is None:  # ours: with the class archive where one is kept
            java_options, writing = class_archive.java_options(
                cache_directory(), java_version, LOCAL_JAVA_OPTIONS, record=write_classes
            )
        builder = (
            builder.config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.extraJavaOptions", java_options)
        )
    for key, value in extra_settings().items():
        builder = builder.config(key, value)
    log = spark_log()
    try:
        with _output_to(log):
            _session = builder.getOrCreate()
    except Exception as exc:  # noqa: BLE001 - whatever stopped the JVM, with its own words
        raise errors.FailedPrecondition(
            f"Spark did not start ({exc}); the end of its log {log}:\n{log_tail(log, 20)}"
        ) from None
    if writing is not None:  # the archive is named once the JVM exits: at stop, or at exit
        _writing = writing
        atexit.register(stop_session)
    _session.sparkContext.setLogLevel("ERROR")
    _session.dataSource.register(AggviewDataSource)
    return _session


def writing_classes() -> bool:
    """Whether stopping the session waits for its JVM to write the class archive."""
    return _writing is not None


def stop_session() -> None:
    """Stops the process's session; where its JVM writes the class archive, also the JVM,
    waiting for the archive (a few seconds, once per machine)."""
    global _session, _writing
    if _session is not None:
        _session.stop()
        _session = None
        if _writing is not None:
            from pyspark import SparkContext

            writing, _writing = _writing, None
            gateway = SparkContext._gateway
            SparkContext._gateway = SparkContext._jvm = None  # a next session starts a JVM
            with contextlib.suppress(Exception):  # py4j's own shutdown, best effort
                gateway.shutdown()
            class_archive.finish(writing, getattr(gateway, "proc", None))
