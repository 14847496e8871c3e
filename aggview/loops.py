"""The event loop a server runs on: uvloop (libuv's loop, written in Cython) where it is
installed, the standard library's otherwise; ``AGGVIEW_LOOP=asyncio`` chooses the standard one
(to compare, or where uvloop misbehaves). gRPC's asyncio stack runs on either. Also the waits
servers and clients share on any loop (``stop``, ``done_within``, ``in_thread_to_the_end``,
``pass_on``)."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Callable, Coroutine
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


YOUNG_GENERATION = 20_000  # allocations between collections of the youngest (CPython: 700)


def collect_less() -> None:
    """The cyclic garbage collector looks at new objects every ``YOUNG_GENERATION``
    allocations. A server keeps big, long-lived heaps (a cumulus runtime's maps and their
    logs), and a young collection every 700 allocations spent two fifths of the runtime's
    CPU promoting and rescanning them; transactions showed no difference."""
    gc.set_threshold(YOUNG_GENERATION, 10, 10)


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the chosen loop, collecting less (``collect_less``)."""
    collect_less()
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


async def done_within(future: asyncio.Future[Any], seconds: float) -> bool:
    """Whether ``future`` is done within ``seconds``; it is never cancelled here. What
    ``asyncio.wait({future}, timeout=seconds)`` answers, with one timer and one callback and
    none of its sets, checks and waiter bookkeeping: a client waits so for every commit."""
    if future.done():
        return True
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not woken.done():
            woken.set_result(None)

    timer = loop.call_later(seconds, wake)
    future.add_done_callback(wake)
    try:
        await woken
    finally:
        timer.cancel()
        future.remove_done_callback(wake)
    return future.done()


async def in_thread_to_the_end(func: Callable[..., T], /, *args: Any) -> T:
    """``asyncio.to_thread(func, *args)``, except that a cancel is raised only once the thread
    has returned: a thread cannot be stopped, and a store write left running lands whenever
    it ends. A checkpoint cancelled so by a stop had its rows overwrite the newer ones the
    stop's own checkpoint wrote: deleted rows came back after a restart on a slow HBase."""
    work = asyncio.ensure_future(asyncio.to_thread(func, *args))
    cancelled = False
    while not work.done():
        try:
            await asyncio.wait([work])
        except asyncio.CancelledError:
            cancelled = True  # asked again while the thread runs on: still wait for it
    if cancelled:
        work.exception()  # its failure, if any, goes with the cancel: not logged as lost
        raise asyncio.CancelledError
    return work.result()


def pass_on(done: asyncio.Future[T], to: asyncio.Future[T]) -> None:
    """Gives ``to`` the outcome of ``done`` (a done future), unless ``to`` is done already
    (its waiter went away): a chain of callbacks instead of a task that awaits."""
    if to.done():
        if not done.cancelled():
            done.exception()  # retrieved: nobody waits for it any more
        return
    if done.cancelled():
        to.cancel()
    elif (error := done.exception()) is not None:
        to.set_exception(error)
    else:
        to.set_result(done.result())
