"""A commit's silence checks never hide its answer (``Client._watched``,
``AsyncClient._watched``): a commit unanswered for ``ASK_OTHERS_AFTER`` makes the client ask
another member whether it hears the coordinator silent, and when the member asked is the one
cut off, that question waits out its timeout. The nemesis's follower cuts showed commits at a
healthy member answered 1.2 s into the cut reach the client at 2.0 s, the question's end."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from aggclient import AsyncClient, Client
from aggclient.core import ASK_OTHERS_AFTER
from aggclient.routing import Router
from aggview.wire import client_pb2 as pb

ANSWERED_AT = ASK_OTHERS_AFTER + 0.2  # the commit's answer, while the question is asked


class DeadlineExceeded(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED


class Later:
    """A grpc future finished by a timer: with ``value``, or failing once it times out."""

    def __init__(self, after: float, value: Any = None) -> None:
        self._done = threading.Event()
        self._callbacks: list[Callable[[Any], None]] = []
        self._lock = threading.Lock()
        self.value = value
        self.cancelled = False
        threading.Timer(after, self._finish).start()

    def _finish(self) -> None:
        with self._lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    def result(self, timeout: float | None = None) -> Any:
        if not self._done.wait(timeout):
            raise grpc.FutureTimeoutError()
        if self.value is None:
            raise DeadlineExceeded()
        return self.value

    def trailing_metadata(self) -> tuple[()]:
        return ()


class Method:
    def __init__(self, answer: Callable[[float], Any]) -> None:
        self._answer = answer

    def future(self, request: Any, timeout: float, metadata: Any = None) -> Any:
        return self._answer(timeout)

    def __call__(self, request: Any, timeout: float, metadata: Any = None) -> Any:
        return self._answer(timeout).result()  # blocking, as a stub's call


class Stub:
    def __init__(self, commit: Later | None = None) -> None:
        self.Commit = Method(lambda timeout: commit)
        # a cut member: nothing answers before the deadline
        self.Members = Method(lambda timeout: Later(timeout))


def test_a_commit_answered_while_a_cut_member_is_asked_about_it_is_returned_at_once() -> None:
    client = Client("127.0.0.1:1", timeout=10)
    try:
        client._core.router = Router(["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"], 3)
        commit = Later(ANSWERED_AT, pb.CommitReply(timestamp=7))
        coordinator, cut = Stub(commit), Stub()
        client._members[1] = (None, cut)  # the first other member, asked first: cut off
        started = time.monotonic()
        reply = client._watched(coordinator, pb.CommitRequest(), member=0)
        took = time.monotonic() - started
    finally:
        del client._members[1]
        client.close()
    assert reply.timestamp == 7
    assert took < ANSWERED_AT + 0.4, f"the answer reached the client after {took:.2f}s"


def test_an_async_clients_commit_answered_while_a_cut_member_is_asked_is_returned_at_once() -> None:
    async def scenario() -> tuple[int, float]:
        client = AsyncClient("127.0.0.1:1", timeout=10)
        try:
            client._core.router = Router(["10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"], 3)

            async def answered() -> int:
                await asyncio.sleep(ANSWERED_AT)
                return 7

            async def cut_member(question: Any, pinned: Any) -> Any:
                await asyncio.sleep(question.timeout)  # the cut member's question times out
                return grpc.StatusCode.DEADLINE_EXCEEDED

            client._answer = cut_member  # type: ignore[method-assign]
            watch = client._core.watch(0)
            assert watch is not None
            started = time.monotonic()
            ts = await client._watched(asyncio.ensure_future(answered()), watch, {})
            return ts, time.monotonic() - started
        finally:
            await client.close()

    ts, took = asyncio.run(scenario())
    assert ts == 7
    assert took < ANSWERED_AT + 0.4, f"the answer reached the client after {took:.2f}s"
