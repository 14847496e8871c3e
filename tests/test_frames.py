"""The members' framed-TCP transport (``aggview.frames``) on real sockets in this process: many
requests in flight each find their answer, a refused or broken connection fails clearly and
leaves the server serving, random bytes never take it down, and mutual TLS plus the cluster
secret keep out what is not a member."""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggview import errors, frames
from aggview.certs import make_certs
from aggview.security import TlsDir
from aggview.streams import AnswerEach, AskEach
from aggview.wire import ltm_pb2 as pb
from ltm.server import framed_exchange
from ltm.store import ownership


def echo_welcome(hello: bytes, certified: bool = False, direct: bool = False) -> frames.Answer:
    """Answers every request with a vote whose ts is the request's prepare ts; ``no`` refuses.
    ``direct``: answers are written by the stream's own callback while the connection takes
    them."""
    if hello == b"no":
        raise errors.FailedPrecondition("partition 9 is not served here")

    async def handle(request: pb.LtmRequest) -> pb.LtmReply:
        await asyncio.sleep(0.001 * (request.prepare.low_watermark % 3))  # answers out of order
        return pb.LtmReply(id=request.id, vote=pb.Vote(ts=request.prepare.low_watermark))

    stream = AnswerEach(
        lambda m: m.requests, handle, lambda replies: pb.LtmReplies(replies=replies)
    )

    return frames.answering(pb.LtmRequests.FromString, stream.serve, direct=direct)


def asker(
    address: str,
    hello: bytes = b"hi",
    context: ssl.SSLContext | None = None,
    grace: float = 5.0,  # tests of the grace pass their own: a loaded CI took 0.5 s to welcome
) -> AskEach:
    return AskEach(
        lambda: frames.FramedCall(address, hello, pb.LtmReplies.FromString, context, grace=grace),
        lambda requests: pb.LtmRequests(requests=requests),
        lambda exc: errors.Unavailable(f"stream ended: {exc!r}"),
    )


async def ask(stream: AskEach, n: int) -> pb.LtmReply:
    request = pb.LtmRequest(prepare=pb.PrepareRequest(low_watermark=n))
    return await stream.ask(request, 5.0, lambda: errors.Unavailable("no answer"))


async def raw_exchange(port: int, data: bytes) -> bytes:
    """Sends ``data`` as is and returns whatever comes back before the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    writer.write_eof()
    try:
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


@pytest.mark.parametrize("direct", [False, True], ids=["by-task", "direct"])
def test_concurrent_requests_find_their_answers(direct: bool) -> None:
    async def main() -> None:
        welcome = functools.partial(echo_welcome, direct=direct)
        server = await frames.FramedServer(welcome).start("127.0.0.1", 0)
        stream = asker(f"127.0.0.1:{server.port}")
        try:
            replies = await asyncio.gather(*(ask(stream, n) for n in range(200)))
            assert [r.vote.ts for r in replies] == list(range(200))
            assert stream.messages_written < 200  # requests shared messages
        finally:
            await stream.close()
            await server.close()

    asyncio.run(main())


def test_requests_of_one_loop_pass_share_a_message_written_without_a_task() -> None:
    """On an open connection the requests asked in one pass of the loop go out together at
    the start of the next, by a plain callback: no writer task per request (a one-client
    commit paid a task, its step and its completion on top of its own)."""

    async def main() -> None:
        server = await frames.FramedServer(echo_welcome).start("127.0.0.1", 0)
        stream = asker(f"127.0.0.1:{server.port}")
        writers: list[str] = []
        loop = asyncio.get_running_loop()

        def factory(loop: asyncio.AbstractEventLoop, coro: Any) -> asyncio.Task[Any]:
            if coro.__qualname__ == "AskEach._write":
                writers.append(coro.__qualname__)
            return asyncio.Task(coro, loop=loop)

        try:
            await ask(stream, 0)  # opens the connection (the first write waits for it)
            loop.set_task_factory(factory)
            before = stream.messages_written
            expired = lambda: errors.Unavailable("no answer")  # noqa: E731
            answers = [
                stream.send(pb.LtmRequest(prepare=pb.PrepareRequest(low_watermark=n)), 5, expired)
                for n in (1, 2, 3)
            ]
            replies = await asyncio.gather(*answers)
            assert [r.vote.ts for r in replies] == [1, 2, 3]
            assert stream.messages_written == before + 1
            assert writers == []
        finally:
            loop.set_task_factory(None)
            await stream.close()
            await server.close()

    asyncio.run(main())


@pytest.mark.parametrize("taken", [True, False], ids=["sent", "refused"])
def test_answers_of_one_loop_pass_are_sent_together_or_yielded(taken: bool) -> None:
    """With ``send``, the answers ready in one loop pass go out as one message by a plain
    callback; what ``send`` does not take (a full buffer) is yielded, for the connection's
    task to write once the buffer drains. Nothing is lost or sent twice either way."""

    async def handle(request: pb.LtmRequest) -> pb.LtmReply:
        return pb.LtmReply(id=request.id)

    stream = AnswerEach(lambda m: m.requests, handle, lambda r: pb.LtmReplies(replies=r))
    sent: list[list[int]] = []

    def send(message: pb.LtmReplies) -> bool:
        if taken:
            sent.append([r.id for r in message.replies])
        return taken

    async def messages() -> AsyncIterator[pb.LtmRequests]:
        yield pb.LtmRequests(requests=[pb.LtmRequest(id=n) for n in (1, 2, 3)])
        await asyncio.sleep(0.01)  # the answers are out before the stream ends
        yield pb.LtmRequests(requests=[pb.LtmRequest(id=4)])

    async def main() -> list[int]:
        return [r.id async for m in stream.serve(messages(), send) for r in m.replies]

    yielded = asyncio.run(main())
    if taken:
        assert sent == [[1, 2, 3], [4]] and yielded == []
    else:
        assert sent == [] and sorted(yielded) == [1, 2, 3, 4]


def test_a_refused_stream_says_why_and_the_server_goes_on() -> None:
    async def main() -> None:
        server = await frames.FramedServer(echo_welcome).start("127.0.0.1", 0)
        address = f"127.0.0.1:{server.port}"
        refused, fine = asker(address, b"no"), asker(address)
        try:
            with pytest.raises(errors.Unavailable, match="partition 9 is not served here"):
                await ask(refused, 1)
            assert (await ask(fine, 7)).vote.ts == 7
        finally:
            await refused.close()
            await fine.close()
            await server.close()

    asyncio.run(main())


def test_an_oversized_frame_ends_only_its_own_connection() -> None:
    async def main() -> None:
        server = await frames.FramedServer(echo_welcome).start("127.0.0.1", 0)
        stream = asker(f"127.0.0.1:{server.port}")
        try:
            assert (await ask(stream, 3)).vote.ts == 3
            huge = frames.HEADER.pack(frames.MAX_MESSAGE_BYTES + 1)
            assert await raw_exchange(server.port, frames.framed(b"hi") + huge) == frames.framed(
                frames.OK
            )
            assert (await ask(stream, 4)).vote.ts == 4
        finally:
            await stream.close()
            await server.close()

    asyncio.run(main())


def test_a_peer_that_is_down_fails_as_unavailable_after_the_grace() -> None:
    async def main() -> None:
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()
        # a grace the refusals fill even on a loaded machine (0.5 s once timed out a connect
        # starved of CPU in CI before any refusal came back)
        stream = asker(f"127.0.0.1:{port}", grace=2.0)
        try:
            with pytest.raises(errors.Unavailable, match="Connection"):
                await ask(stream, 1)
            # a peer that comes up within the grace is reached
            late = asyncio.ensure_future(ask(stream, 2))
            await asyncio.sleep(0.2)
            server = await frames.FramedServer(echo_welcome).start("127.0.0.1", port)
            try:
                assert (await late).vote.ts == 2
            finally:
                await stream.close()
                await server.close()
        finally:
            await stream.close()

    asyncio.run(main())


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.one_of(
        st.binary(max_size=64),
        st.builds(
            lambda hello, rest: frames.framed(hello) + rest,
            st.binary(max_size=8),
            st.binary(max_size=64),
        ),
        st.builds(lambda body: frames.framed(b"hi") + frames.framed(body), st.binary(max_size=64)),
    )
)
def test_random_bytes_never_take_the_server_down(data: bytes) -> None:
    async def main() -> None:
        # (a hello's grace the loaded machine keeps: this test is about the bytes)
        server = await frames.FramedServer(echo_welcome, grace=5.0).start("127.0.0.1", 0)
        stream = asker(f"127.0.0.1:{server.port}")
        try:
            await raw_exchange(server.port, data)
            assert (await ask(stream, 5)).vote.ts == 5
        finally:
            await stream.close()
            await server.close()

    asyncio.run(main())


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsDir:
    directory = tmp_path_factory.mktemp("certs")
    make_certs(directory)
    return TlsDir.load(directory)


def test_mutual_tls_and_the_secret_keep_out_what_is_not_a_member(tls: TlsDir) -> None:
    """The member server's welcome checks the secret before it looks for a partition."""
    looked_up: list[dict[str, str]] = []

    def participant_of(metadata: dict[str, str]) -> Any:
        looked_up.append(metadata)
        raise errors.FailedPrecondition(f"partition {metadata} is not served here")

    welcome = framed_exchange(participant_of, tls.secret)

    async def main() -> None:
        server = await frames.FramedServer(welcome, tls.frames_server_ssl).start("127.0.0.1", 0)
        address = f"127.0.0.1:{server.port}"
        right = pb.ExchangeHello(secret=tls.secret, partition=4, epoch=2).SerializeToString()
        wrong = pb.ExchangeHello(secret="guess", partition=4).SerializeToString()
        no_cert = ssl.create_default_context(cadata=tls.ca.decode())
        cases = {
            "secret": asker(address, wrong, tls.member_client_ssl),
            "certificate": asker(address, right, no_cert),
            "plaintext": asker(address, right, None),
            "member": asker(address, right, tls.member_client_ssl),
        }
        try:
            with pytest.raises(errors.Unavailable, match="without the cluster secret"):
                await ask(cases["secret"], 1)
            for name in ("certificate", "plaintext"):
                with pytest.raises(errors.Unavailable):
                    await ask(cases[name], 1)
            assert looked_up == []
            with pytest.raises(errors.Unavailable, match="not served here"):
                await ask(cases["member"], 1)  # through TLS and the secret, to the partition
            assert looked_up == [dict(ownership.partition_metadata(4, 2))]
        finally:
            for stream in cases.values():
                await stream.close()
            await server.close()

    asyncio.run(main())


def test_the_server_closes_a_connection_that_never_says_hello() -> None:
    async def main() -> None:
        server = await frames.FramedServer(echo_welcome, grace=0.3).start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, no welcome
            writer.close()
        finally:
            await server.close()

    asyncio.run(main())
