"""A local Spark session's class-data archive (the JDK's dynamic AppCDS archive).

A local session's JVM spends about half of its start loading and verifying Spark's and
Scala's classes: 10-11 CPU-s from the start to a first small job, 6 with the classes mapped
from an archive (measured on 2 cores). Writing one costs once about 35 CPU-s, and a JVM that
records its classes runs slower, so no user's session records: the first local session that
finds no archive starts a writer in the background (``python -m aggspark.class_archive``, at a
low priority), which records a small job's classes (``-XX:ArchiveClassesAtExit``); every local
session started after it finished maps the archive (``-XX:SharedArchiveFile``).

A JVM given a truncated archive dies of SIGBUS, so an archive is only ever used under its final
name, and a file gets that name only after the JVM that wrote it exited cleanly: the writing
session's ``stop_session`` closes the JVM's stdin (its signal to exit, as when Python exits),
waits for it, and renames the file. One process at a time writes (a lock file holding its pid;
a dead writer's lock and file are swept). The archive's name covers what it is valid for (the
Spark home, the Java build, the JVM options); it is removed once its Spark home is gone (a
deleted venv), or when four newer ones are kept.
``AGGVIEW_SPARK_CDS=0`` turns it off."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aggview.processes import alive

ENV = "AGGVIEW_SPARK_CDS"
LOCK_ENV = "AGGVIEW_SPARK_CDS_LOCK"  # the writer's lock, taken for it by the process starting it
KEEP = 4  # archives kept at most (a new one removes the oldest beyond these)
STALE_LOCK_SECONDS = 1800.0  # a writer this old (its pid reused, say) no longer holds the lock
EXIT_WAIT_SECONDS = 120.0  # writing takes a few seconds


@dataclass(frozen=True)
class Writing:
    """An archive this process's JVM writes at its exit."""

    partial: Path  # where the JVM writes
    archive: Path  # the name it gets once the JVM exited cleanly
    lock: Path


def archive_for(directory: Path, java_version: str, options: str) -> Path:
    """The archive valid for this Spark home, Java build and JVM options."""
    import pyspark

    key = "\0".join(
        (os.environ.get("SPARK_HOME", ""), pyspark.__version__, java_version.strip(), options)
    )
    return directory / f"spark-classes-{hashlib.sha1(key.encode()).hexdigest()[:16]}.jsa"


def write_later(lock: Path) -> subprocess.Popen[bytes] | None:
    """Starts ``python -m aggspark.class_archive``, on its own and at a low priority, holding
    ``lock`` for it: a local session that records the classes of a small job and names the
    archive in the cache directory. Nobody waits for it; a session started after it finished
    maps the archive. None if another process took the lock first."""
    from aggspark.session import cache_directory

    if not _lock(lock):
        return None
    directory = cache_directory()
    with (directory / "spark-classes-writer.log").open("ab") as log:
        writer = subprocess.Popen(
            [sys.executable, "-m", "aggspark.class_archive"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # not in the caller's process group: a Ctrl-C spares it
            env={
                **os.environ,
                "AGGVIEW_SPARK_LOG": str(directory / "spark-classes-writer.log"),
                LOCK_ENV: str(lock),
            },
        )
    lock.write_text(str(writer.pid))  # the writer's now (it also says so itself)
    return writer


def java_options(
    directory: Path,
    java_version: str,
    options: str,
    record: bool = False,
    later: Callable[[Path], object] = write_later,
) -> tuple[str, Writing | None]:
    """``options`` with the archive's where one is complete. Where none is: ``record``, this
    JVM writes it at its exit (the ``Writing`` to finish then) unless another process is
    writing it; otherwise ``later`` starts a writer in the background (``write_later``)."""
    if os.environ.get(ENV, "1") == "0":
        return options, None
    try:
        archive = archive_for(directory, java_version, options)
        if archive.is_file():
            return f"{options} -XX:SharedArchiveFile={archive}", None
        lock = archive.with_name(archive.name + ".lock")
        if not record:
            if not _held(lock):
                later(lock)
            return options, None
        if not _lock(lock):
            return options, None
        partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
        return f"{options} -XX:ArchiveClassesAtExit={partial}", Writing(partial, archive, lock)
    except OSError:  # no cache directory to write: no archive
        return options, None


def wait_for_writer(directory: Path, timeout: float) -> None:
    """Waits while a live process writes an archive in ``directory`` (up to ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(
        _held(lock) for lock in directory.glob("spark-classes-*.lock")
    ):
        time.sleep(0.2)


def main() -> None:
    """The background writer: a local session with ``record``, one small job of the kinds
    aggview runs (a Python UDF, a grouped aggregation, Parquet written and read), stopped."""
    import tempfile

    from aggspark.session import spark_session, stop_session, writing_classes

    with contextlib.suppress(OSError):
        os.nice(10)
    if os.environ.get(LOCK_ENV):  # taken for this process by the one that started it
        Path(os.environ[LOCK_ENV]).write_text(str(os.getpid()))
    spark = spark_session(write_classes=True)
    if not writing_classes():
        return  # an archive appeared, or another process writes it
    from pyspark.sql import functions as f

    with tempfile.TemporaryDirectory() as work:
        rows = spark.range(1000).select(
            (f.col("id") % 7).alias("k"), f.udf(lambda v: v * 2, "long")("id").alias("v")
        )
        rows.write.parquet(f"{work}/rows")
        spark.read.parquet(f"{work}/rows").groupBy("k").agg(f.sum("v")).collect()
    stop_session()


def finish(writing: Writing, jvm: Any) -> bool:
    """After the session stopped: ends its JVM (``jvm``, the gateway's process) by closing its
    stdin, waits while it writes the archive, and names the archive if the JVM exited
    cleanly. True if the archive is in place."""
    try:
        if jvm is not None and jvm.stdin is not None:
            jvm.stdin.close()
            if jvm.wait(timeout=EXIT_WAIT_SECONDS) == 0 and writing.partial.stat().st_size > 0:
                _home_of(writing.archive).write_text(os.environ.get("SPARK_HOME", ""))
                os.replace(writing.partial, writing.archive)
                _prune(writing.archive.parent)
                return True
        return False
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        with contextlib.suppress(OSError):
            writing.partial.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            writing.lock.unlink(missing_ok=True)


def _lock(lock: Path) -> bool:
    """Takes the writer's lock: False while a live process holds it."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if _holder(lock) == os.getpid():
                return True  # taken for this process when it was started (write_later)
            if _held(lock):
                return False
            with contextlib.suppress(OSError):
                lock.unlink()
            _sweep(lock.parent)
            continue
        with os.fdopen(fd, "w") as out:
            out.write(str(os.getpid()))
        return True
    return False


def _held(lock: Path) -> bool:
    pid = _holder(lock)
    try:
        if time.time() - lock.stat().st_mtime > STALE_LOCK_SECONDS:
            return False
    except OSError:
        return False
    return alive(pid)


def _holder(lock: Path) -> int:
    try:
        return int(lock.read_text() or 0)
    except (OSError, ValueError):
        return 0


def _sweep(directory: Path) -> None:
    """Files a writer that died left: ``<archive>.<pid>.partial`` of pids no longer alive."""
    for partial in directory.glob("spark-classes-*.partial"):
        pid = partial.suffixes[-2].lstrip(".") if len(partial.suffixes) >= 2 else ""
        if pid.isdigit() and not alive(int(pid)):
            with contextlib.suppress(OSError):
                partial.unlink()


def _home_of(archive: Path) -> Path:
    """Where an archive notes the Spark home it was written for."""
    return archive.with_name(archive.name + ".home")


def _prune(directory: Path) -> None:
    """Removes the archives of Spark homes that are gone (a venv deleted), and the oldest
    beyond ``KEEP``."""
    dated = []
    for archive in directory.glob("spark-classes-*.jsa"):
        with contextlib.suppress(OSError):  # another process's prune may take it first
            home = _home_of(archive).read_text() if _home_of(archive).exists() else ""
            if home and not (Path(home) / "jars").is_dir():
                _remove(archive)
                continue
            dated.append((archive.stat().st_mtime, archive))
    for _, old in sorted(dated, reverse=True)[KEEP:]:
        _remove(old)


def _remove(archive: Path) -> None:
    for path in (archive, _home_of(archive)):
        with contextlib.suppress(OSError):
            path.unlink()


if __name__ == "__main__":
    main()
