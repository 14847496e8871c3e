"""The event loop a server runs on: uvloop (libuv's loop, written in Cython) where it is
installed, the standard library's otherwise; ``AGGVIEW_LOOP=asyncio`` chooses the standard one
(to compare, or where uvloop misbehaves). gRPC's asyncio stack runs on either."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def chosen() -> str:
    """``uvloop`` or ``asyncio``: what ``run`` will use here."""
    if os.environ.get("AGGVIEW_LOOP", "uvloop") == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    if chosen() == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


async def stop(task: asyncio.Task[Any]) -> None:
    """Cancels ``task`` and returns once it has ended, cancelling it again while it runs on: a
    cancellation can be lost (Python 3.11's ``asyncio.wait_for`` returns a result that came at
    the moment it was cancelled, and the task goes on). A refresher that lived on so kept an
    ALTER waiting for it until the client's deadline."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=0.1)
