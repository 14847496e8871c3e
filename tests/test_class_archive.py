"""A local Spark session's class archive (``aggspark/class_archive.py``): written by one process
at a time, named only once the JVM that wrote it exited cleanly (a truncated archive kills a
JVM that maps it), used by every later session, swept when its writer died. A child Python
process stands in for the JVM's exit protocol (it writes the file once its stdin closes); the
suite's Spark session runs the real JVM with the archive (``test_spark.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aggspark import class_archive
from aggspark.class_archive import archive_for, finish, java_options

OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
JAVA = 'openjdk version "17.0.15" 2025-04-15'


def _jvm(
    writing: class_archive.Writing, code: int = 0, size: int = 1000
) -> subprocess.Popen[bytes]:
    """A process that, like the JVM, writes the archive when its stdin closes, then exits."""
    script = (
        "import sys, pathlib; sys.stdin.read(); "
        f"pathlib.Path(sys.argv[1]).write_bytes(b'x' * {size}); sys.exit({code})"
    )
    return subprocess.Popen(
        [sys.executable, "-c", script, str(writing.partial)], stdin=subprocess.PIPE
    )


def _writing(tmp_path: Path) -> class_archive.Writing:
    options, writing = java_options(tmp_path, JAVA, OPTIONS, record=True)
    assert writing is not None
    assert options == f"{OPTIONS} -XX:ArchiveClassesAtExit={writing.partial}"
    return writing


def test_the_first_writer_writes_then_every_session_maps_the_archive(tmp_path: Path) -> None:
    started: list[Path] = []  # writers started in the background, by their lock

    def options(record: bool = False) -> tuple[str, class_archive.Writing | None]:
        return java_options(tmp_path, JAVA, OPTIONS, record, later=started.append)

    assert options() == (OPTIONS, None)  # none yet: a session asks for a writer, goes on
    assert started == [archive_for(tmp_path, JAVA, OPTIONS).with_suffix(".jsa.lock")]
    writing = _writing(tmp_path)
    assert writing.lock.read_text() == str(os.getpid())
    # a session meanwhile neither maps the partial file nor starts a writer
    assert options() == (OPTIONS, None)
    assert len(started) == 1
    assert finish(writing, _jvm(writing))
    archive = archive_for(tmp_path, JAVA, OPTIONS)
    assert archive.read_bytes() == b"x" * 1000
    assert not writing.partial.exists() and not writing.lock.exists()
    for record in (False, True):
        assert options(record) == (f"{OPTIONS} -XX:SharedArchiveFile={archive}", None)
    assert len(started) == 1
    # another Java build or other options: another archive
    assert archive_for(tmp_path, JAVA.replace("17.0.15", "17.0.16"), OPTIONS) != archive
    assert archive_for(tmp_path, JAVA, "-XX:+UseParallelGC") != archive


@pytest.mark.parametrize("code, size", [(1, 1000), (0, 0)])
def test_an_archive_from_a_jvm_that_failed_is_never_named(
    tmp_path: Path, code: int, size: int
) -> None:
    writing = _writing(tmp_path)
    assert not finish(writing, _jvm(writing, code, size))
    assert not archive_for(tmp_path, JAVA, OPTIONS).exists()
    assert not writing.partial.exists() and not writing.lock.exists()
    assert java_options(tmp_path, JAVA, OPTIONS, record=True)[1] is not None  # tried again


def test_a_dead_writers_lock_and_partial_file_are_swept(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(dead.stdout)  # a process that has exited
    archive = archive_for(tmp_path, JAVA, OPTIONS)
    lock = archive.with_name(archive.name + ".lock")
    lock.write_text(str(pid))
    left = archive.with_name(f"{archive.name}.{pid}.partial")
    left.write_bytes(b"half an archive")
    options, writing = java_options(tmp_path, JAVA, OPTIONS, record=True)
    assert writing is not None and "ArchiveClassesAtExit" in options
    assert not left.exists()
    assert not archive.exists()  # a dead writer's file is never named


def test_off_by_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _writing(tmp_path)  # even with nothing in the way
    monkeypatch.setenv(class_archive.ENV, "0")
    assert java_options(tmp_path / "other", JAVA, OPTIONS, record=True) == (OPTIONS, None)
    assert java_options(tmp_path / "other", JAVA, OPTIONS, later=pytest.fail) == (OPTIONS, None)


def test_archives_of_homes_that_are_gone_and_the_oldest_are_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, live, gone = tmp_path / "cache", tmp_path / "live", tmp_path / "gone"
    (live / "jars").mkdir(parents=True)
    monkeypatch.setenv("SPARK_HOME", str(live))
    for age in range(class_archive.KEEP + 1):  # older archives of the live home
        old = cache / f"spark-classes-{age}.jsa"
        old.parent.mkdir(exist_ok=True)
        old.write_bytes(b"old")
        old.with_name(old.name + ".home").write_text(str(live))
        os.utime(old, (1000 + age, 1000 + age))
    stale = cache / "spark-classes-venv-deleted.jsa"
    stale.write_bytes(b"recent, but its Spark home is gone")
    stale.with_name(stale.name + ".home").write_text(str(gone))
    writing = _writing(cache)
    assert finish(writing, _jvm(writing))
    kept = sorted(p.name for p in cache.glob("*.jsa"))
    newest_old = [f"spark-classes-{age}.jsa" for age in range(2, class_archive.KEEP + 1)]
    assert kept == sorted([writing.archive.name, *newest_old])
    assert sorted(p.name for p in cache.glob("*.home")) == sorted(f"{n}.home" for n in kept)
    assert writing.archive.with_name(writing.archive.name + ".home").read_text() == str(live)


def test_a_lock_held_by_a_live_process_keeps_others_from_recording(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = archive_for(tmp_path, JAVA, OPTIONS).with_suffix(".jsa.lock")
        lock.write_text(str(holder.pid))
        assert java_options(tmp_path, JAVA, OPTIONS, record=True) == (OPTIONS, None)
        assert java_options(tmp_path, JAVA, OPTIONS, later=pytest.fail) == (OPTIONS, None)
    finally:
        holder.kill()
        holder.wait()
    # its holder gone, the lock is taken
    assert java_options(tmp_path, JAVA, OPTIONS, record=True)[1] is not None


def test_an_empty_or_unreadable_lock_names_no_process(tmp_path: Path) -> None:
    """A lock without a pid is nobody's: never ``waitpid(0)`` (any child of ours) or
    ``kill(0)`` (our process group)."""
    lock = archive_for(tmp_path, JAVA, OPTIONS).with_suffix(".jsa.lock")
    lock.write_text("")
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    time.sleep(1.0)  # exited, not reaped yet
    assert java_options(tmp_path, JAVA, OPTIONS, record=True)[1] is not None  # taken
    # still ours to reap (reaped elsewhere, Popen would find no child and say 0)
    assert child.wait(timeout=10) == 3
