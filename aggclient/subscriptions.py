"""The client side of view subscriptions (``WatchView``, see ``coordinator.watch``).

``ViewCopy`` applies the stream's messages to a copy of the view (pure). ``Watch`` keeps one up
to date on a thread for the blocking client, calling back on each message and reconnecting
(from its copy's timestamp) when the stream breaks; ``watch_changes`` is the asyncio iterator.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import grpc

from aggview import errors
from aggview.status import error_from_rpc
from aggview.values import from_row, to_row
from aggview.wire import client_pb2 as pb

RECONNECT_DELAY = 0.2


@dataclass(frozen=True)
class Change:
    group: dict[str, Any]  # the group columns' values
    old: dict[str, Any] | None  # None: the group is new
    new: dict[str, Any] | None  # None: the group is gone


@dataclass(frozen=True)
class Changes:
    """One message: the copy with these applied is the view at ``timestamp``; ``reset``: they
    are the whole view and replace the copy; ``tentative``: the copy is then a cumulus view's
    newest values (``timestamp``: the last change fed to its runtime), which may mix
    timestamps."""

    timestamp: int
    changes: list[Change]
    reset: bool
    tentative: bool = False


def decode(message: pb.ViewChanges) -> Changes:
    return Changes(
        message.timestamp,
        [
            Change(
                from_row(c.group),
                from_row(c.old) if c.HasField("old") else None,
                from_row(c.new) if c.HasField("new") else None,
            )
            for c in message.changes
        ],
        message.reset,
        message.tentative,
    )


@dataclass
class ViewCopy:
    """A view's rows by group, as the messages so far make them."""

    rows: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)
    timestamp: int = 0
    tentative: bool = False  # a cumulus view's newest values (see ``Changes``)

    def apply(self, changes: Changes) -> None:
        self.tentative = changes.tentative
        if changes.reset:
            self.rows = {}
        for change in changes.changes:
            key = tuple(change.group.values())
            if change.new is None:
                self.rows.pop(key, None)
            else:
                self.rows[key] = change.new
        self.timestamp = changes.timestamp


class Watch:
    """A subscription of the blocking client, on a thread: ``copy`` is the view as of
    ``copy.timestamp``; ``callback(changes, watch)`` runs on that thread after each message.
    It runs until ``close()`` (or ``stop()``); ``with client.watch(...) as watch:`` closes it
    when the block ends."""

    def __init__(
        self,
        open_stream: Callable[[int], Iterator[pb.ViewChanges]],
        callback: Callable[[Changes, Watch], None] | None,
    ) -> None:
        self.copy = ViewCopy()
        self.error: errors.AggviewError | None = None
        self._open = open_stream
        self._callback = callback
        self._stopped = threading.Event()
        self._stream: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="aggview-watch")
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                self._stream = self._open(self.copy.timestamp)
                for message in self._stream:
                    changes = decode(message)
                    self.copy.apply(changes)
                    if self._callback is not None:
                        self._callback(changes, self)
                    if self._stopped.is_set():
                        return
            except grpc.RpcError as exc:
                if self._stopped.is_set():
                    return
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                    self.error = error_from_rpc(exc)
                    return
            time.sleep(RECONNECT_DELAY)  # the server went away: again, from the copy's time

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Ends the subscription, and waits (at most 10 s) for a callback running to end,
        unless called from one."""
        self._stopped.set()
        if self._stream is not None:
            self._stream.cancel()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)

    stop = close


def when(
    open_stream: Callable[[int], Iterator[pb.ViewChanges]],
    predicate: Callable[[dict[str, Any]], bool],
) -> Future[dict[str, Any]]:
    """A future that resolves with the first row (of a watch sliced to one group) for which
    ``predicate`` holds; it fails if the subscription does."""
    future: Future[dict[str, Any]] = Future()

    def seen(changes: Changes, watch: Watch) -> None:
        for row in watch.copy.rows.values():
            if not future.done() and predicate(row):
                future.set_result(row)
                threading.Thread(target=watch.stop, daemon=True).start()

    watch = Watch(open_stream, seen)

    def failed() -> None:
        watch._thread.join()
        if not future.done():
            future.set_exception(watch.error or errors.Unavailable("the watch ended"))

    threading.Thread(target=failed, daemon=True).start()
    future.add_done_callback(lambda f: f.cancelled() and watch.stop())
    return future


async def watch_changes(
    open_stream: Callable[[int], Any], since: int = 0
) -> AsyncIterator[Changes]:
    """The asyncio client's subscription: each message as it comes, reconnecting from the
    last timestamp seen when the server goes away."""
    while True:
        try:
            async for message in open_stream(since):
                changes = decode(message)
                since = changes.timestamp
                yield changes
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise error_from_rpc(exc) from None
        await asyncio.sleep(RECONNECT_DELAY)


def opener(
    stub: Any,
    metadata: Any,
    view: str,
    where: Mapping[str, Any] | None,
    interval_ms: int,
    tentative: bool = False,
) -> Callable[[int], Any]:
    """How a client (blocking or asyncio: its stub) opens the subscription from a timestamp."""

    def open_stream(since: int) -> Any:
        request = pb.WatchRequest(
            view=view,
            where=to_row(dict(where or {})),
            since=since,
            interval_ms=interval_ms,
            tentative=tentative,
        )
        return stub.WatchView(request, metadata=metadata)

    return open_stream
