"""Waiting for a condition in tests: poll it, never sleep in its place."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(what: str, condition: Callable[[], object], timeout: float = 30.0) -> None:
    """Returns once ``condition()`` is true; fails naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
