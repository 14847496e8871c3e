"""Spark job progress in the project's own status line (Spark's console bars are turned off).

A thread polls Spark's status tracker while a job runs and shows the active stages' tasks next to
the job's own messages, in one rich status line.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console

POLL_SECONDS = 0.25


def stage_progress(spark: Any) -> str:
    """``stage 3: 2/4 tasks`` for every active stage, or '' when none runs."""
    tracker = spark.sparkContext.statusTracker()
    parts = []
    for stage_id in sorted(tracker.getActiveStageIds()):
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            parts.append(f"stage {stage_id}: {info.numCompletedTasks}/{info.numTasks} tasks")
    return ", ".join(parts)


@contextmanager
def spark_status(console: Console, spark: Any, what: str) -> Iterator[Callable[[str], None]]:
    """A status line ``what: <the job's last message> [<Spark stages>]`` while the block runs;
    yields the callback a job reports its own steps to."""
    message = [""]
    stages = [""]
    stop = threading.Event()

    with console.status(what) as status:

        def show() -> None:
            text = what + (f": {message[0]}" if message[0] else "")
            status.update(text + (f" [dim]\\[{stages[0]}][/]" if stages[0] else ""))

        def poll() -> None:
            while not stop.wait(POLL_SECONDS):
                try:
                    stages[0] = stage_progress(spark)
                except Exception:  # noqa: BLE001 - a session stopping under us: show nothing
                    stages[0] = ""
                show()

        def report(text: str) -> None:
            message[0] = text
            show()

        poller = threading.Thread(target=poll, name="spark-progress", daemon=True)
        poller.start()
        try:
            yield report
        finally:
            stop.set()
            poller.join()
