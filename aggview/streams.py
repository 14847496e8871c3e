"""Many requests on one gRPC stream, each answered on its own: how the coordinator talks to an
LTM (``Exchange``) and a client sends its transactions to the coordinator (``Transact``).

A stream message costs a Python gRPC server a fraction of what a call costs, so concurrent
requests share messages both ways, and no request waits for another one to finish.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

Request = TypeVar("Request")
Reply = TypeVar("Reply")


@dataclass
class _End:
    failure: Exception | None


class AnswerEach(Generic[Request, Reply]):
    """Serves one stream: every request of every message is handled concurrently, and the
    answers that are ready together go out as one message (nothing waits for a batch to
    fill). The stream ends when the peer has stopped writing and every request is answered;
    if ``requests_of`` raises (a message that makes no sense), it ends with that error once
    the requests already running are answered."""

    def __init__(
        self,
        requests_of: Callable[[Any], Iterable[Request]],
        handle: Callable[[Request], Awaitable[Reply]],
        pack: Callable[[list[Reply]], Any],
    ) -> None:
        self.requests_of = requests_of
        self.handle = handle  # answers every request, failures included; never raises
        self.pack = pack

    async def serve(self, messages: AsyncIterator[Any]) -> AsyncIterator[Any]:
        replies: asyncio.Queue[Reply | _End] = asyncio.Queue()
        handlers: set[asyncio.Task[None]] = set()

        async def run(request: Request) -> None:
            try:
                replies.put_nowait(await self.handle(request))
            except Exception:  # a bug in a handler: the others go on
                log.exception("a request on a stream got no answer")

        async def read() -> None:
            failure = None
            try:
                async for message in messages:
                    for request in self.requests_of(message):
                        task = asyncio.ensure_future(run(request))
                        handlers.add(task)
                        task.add_done_callback(handlers.discard)
            except Exception as exc:  # noqa: BLE001 - ends the stream after the answers
                failure = exc
            if handlers:
                await asyncio.gather(*handlers, return_exceptions=True)
            replies.put_nowait(_End(failure))

        reader = asyncio.ensure_future(read())
        try:
            end = None
            while end is None:
                batch: list[Reply] = []
                item = await replies.get()
                while True:
                    if isinstance(item, _End):
                        end = item
                        break
                    batch.append(item)
                    if replies.empty():
                        break
                    item = replies.get_nowait()
                if batch:
                    yield self.pack(batch)
            if end.failure is not None:
                raise end.failure
        finally:
            reader.cancel()
