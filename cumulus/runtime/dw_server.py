"""A DW node as a gRPC server: the ``Node`` state machine behind ordered streams.

The driver opens one ``Drive`` stream per switch; the node opens one ``Link`` stream to each
other node on first use. Every stream delivers in order, so each pair of processes is a FIFO
link, as the protocol assumes. Messages wait in one inbox and one task feeds them to the node,
so the state machine never runs twice at once; what it sends goes out batched per stream, and
each batch received is handed to the node as one ``Batch`` (one call, one epoch check).

The same ``NodeHost`` runs in a process of its own (``aggview cumulus node``) and inside a
Spark task (``aggspark/dw_stage.py``). Started without a program, a process is a ``NodePool``:
views on other machines assign it (``Assign``), each a run of its own, so DW nodes can run
wherever there are cores and be reached by address.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from aggview import errors
from aggview.net import GRPC_OPTIONS, SERVER_OPTIONS, add_health, add_reflection, bind
from aggview.security import MemberGate, TlsDir, member_channel, member_metadata
from aggview.status import add_service
from aggview.wire import cumulus_pb2 as pb
from aggview.wire import cumulus_pb2_grpc as pb_grpc
from cumulus.m3.parser import parse_program
from cumulus.runtime.messages import COORDINATOR, Message, batched
from cumulus.runtime.node import Node, ProtocolError
from cumulus.runtime.placement import Placement
from cumulus.runtime.wire import decode, decode_entries, encode, encode_entries

log = logging.getLogger("aggview.cumulus")

BATCH = 512  # messages per batch on a stream, at most
SERVICE = pb.DESCRIPTOR.services_by_name["DwNode"]
RUN_HEADER = "aggview-dw-run"  # which assigned run a call to a node pool is for


@dataclass(frozen=True)
class NodeConfig:
    program_text: str  # the M3 program (every node holds it)
    number: int
    nodes: int
    switches: int = 1
    mode: str = "speculative"
    log_limit: int | None = None
    per_switch: bool = False  # conservative with switches of their own (``Node.per_switch``)
    host: str = "127.0.0.1"
    port: int = 0
    tls: TlsDir | None = None
    run: str = ""  # a node pool's run (``RUN_HEADER``); empty for a node of its own


class NodeHost:
    """One node's state machine, inbox, streams and server."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        placement = Placement(parse_program(config.program_text), config.nodes)
        self.node = Node(
            placement,
            config.number,
            switches=config.switches,
            mode=config.mode,
            log_limit=config.log_limit,
            ordered=True,  # each Drive stream delivers one switch's messages in order
            per_switch=config.per_switch,
        )
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.to_driver: asyncio.Queue[pb.Envelope | None] = asyncio.Queue()
        self.peers: list[str] = []
        self.links: dict[int, asyncio.Queue[pb.Envelope | None]] = {}
        self.sent: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self.failure: str | None = None
        self.drives = 0  # Drive streams open
        self.finished = asyncio.Event()  # every Drive stream that opened has ended
        self._tasks: list[asyncio.Task[Any]] = []
        self._channels: list[grpc.aio.Channel] = []
        self.server: grpc.aio.Server | None = None

    async def start(self) -> int:
        """Starts the server and the node's task; returns the bound port."""
        tls = self.config.tls
        gates = [MemberGate(tls.secret)] if tls is not None else []
        self.server = grpc.aio.server(
            interceptors=gates or None, options=[*GRPC_OPTIONS, *SERVER_OPTIONS]
        )
        add_service(self.server, SERVICE, _Servicer(self))
        add_health(self.server)
        add_reflection(self.server, [SERVICE.full_name])
        credentials = tls.server_credentials(members_only=True) if tls else None
        port = bind(self.server, self.config.host, self.config.port, credentials)
        await self.server.start()
        self.begin()
        return port

    def begin(self) -> None:
        """Starts the node's task (a pool's run has no server of its own)."""
        self._tasks.append(asyncio.create_task(self._run()))

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What this node's calls to its peers carry: the member secret, and its run."""
        run = ((RUN_HEADER, self.config.run),) if self.config.run else ()
        return (*member_metadata(self.config.tls), *run)

    async def stop(self) -> None:
        self.to_driver.put_nowait(None)  # a driver still connected sees its stream end
        for queue in self.links.values():
            queue.put_nowait(None)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await task
        for channel in self._channels:
            await channel.close()
        if self.server is not None:
            await self.server.stop(grace=1.0)

    # ------------------------------------------------------------------------- the node

    async def _run(self) -> None:
        """Feeds the inbox to the node, one message at a time, and routes what it sends."""
        node, number = self.node, self.config.number
        while True:
            message = await self.inbox.get()
            try:
                out = node.handle(message)
            except Exception as exc:  # a protocol or evaluation error ends this node's run
                self.failure = f"DW node {number}: {type(exc).__name__}: {exc}"
                log.exception("DW node %d failed", number)
                self.to_driver.put_nowait(None)
                return
            for target, reply in out:
                if target == number:
                    self.inbox.put_nowait(reply)
                elif target == COORDINATOR:
                    self.to_driver.put_nowait(encode(reply))
                else:
                    self._link(target).put_nowait(encode(reply))
            if node.completed:
                done = [pb.Ts(counter=c, switch_id=s) for c, s in node.completed]
                self.to_driver.put_nowait(pb.Envelope(completed=pb.Completed(ts=done)))
                node.completed.clear()

    def _link(self, target: int) -> asyncio.Queue[pb.Envelope | None]:
        queue = self.links.get(target)
        if queue is None:
            queue = self.links[target] = asyncio.Queue()
            self._tasks.append(asyncio.create_task(self._send_to(target, queue)))
        return queue

    async def _send_to(self, target: int, queue: asyncio.Queue[pb.Envelope | None]) -> None:
        tls = self.config.tls
        channel = member_channel(self.peers[target], tls, GRPC_OPTIONS)
        self._channels.append(channel)
        stub = pb_grpc.DwNodeStub(channel)
        batches = _batches(queue, self.config.number, self.sent, self.bytes)
        await stub.Link(batches, metadata=self.metadata)

    def hello(self, hello: pb.Hello) -> None:
        if len(hello.peers) != self.config.nodes:
            raise ValueError(f"{len(hello.peers)} peer addresses for {self.config.nodes} nodes")
        self.peers = list(hello.peers)


async def _batches(
    queue: asyncio.Queue[pb.Envelope | None],
    source: int,
    sent: Counter[str] | None = None,
    sizes: Counter[str] | None = None,
) -> AsyncIterator[pb.Batch]:
    """The queue's envelopes as batches, in order, until a None."""
    while True:
        first = await queue.get()
        if first is None:
            return
        batch = [first]
        while len(batch) < BATCH and not queue.empty():
            more = queue.get_nowait()
            if more is None:
                yield _batch(batch, source, sent, sizes)
                return
            batch.append(more)
        yield _batch(batch, source, sent, sizes)


def _batch(
    envelopes: list[pb.Envelope],
    source: int,
    sent: Counter[str] | None,
    sizes: Counter[str] | None,
) -> pb.Batch:
    if sent is not None and sizes is not None:
        for envelope in envelopes:
            kind = kind_name(envelope)
            sent[kind] += 1
            sizes[kind] += envelope.ByteSize()
    return pb.Batch(source=source, messages=envelopes)


def kind_name(envelope: pb.Envelope) -> str:
    """The message's class name (``epoch_end`` -> ``EpochEnd``), as the simulator counts."""
    return "".join(part.title() for part in (envelope.WhichOneof("kind") or "").split("_"))


class _Servicer:
    def __init__(self, host: NodeHost) -> None:
        self.host = host

    async def Drive(  # noqa: N802 (gRPC method name)
        self, requests: AsyncIterator[pb.Batch], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Batch]:
        host = self.host
        host.drives += 1
        hello: pb.Hello | None = None
        reader: asyncio.Task[None] | None = None
        try:
            first = await anext(aiter(requests), None)
            kind = first.messages[0].WhichOneof("kind") if first and first.messages else None
            if first is None or kind != "hello":
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Drive starts with Hello")
                return
            hello = first.messages[0].hello
            try:
                host.hello(hello)
                _take(first.messages[1:], host)
            except (ValueError, TypeError) as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            reader = asyncio.create_task(_read(requests, host))
            if hello.switch_id != 0:  # only switch 0's stream carries the node's answers
                await reader
                return
            # the driver's end of its requests ends the answers too: its close waits for them
            answering = True

            def driver_left(_: asyncio.Task[None]) -> None:
                if answering:  # (not once this stream ended otherwise)
                    host.to_driver.put_nowait(None)

            reader.add_done_callback(driver_left)
            try:
                async for batch in _batches(host.to_driver, host.config.number):
                    yield batch
            finally:
                answering = False
            refused = reader.exception() if reader.done() and not reader.cancelled() else None
            if isinstance(refused, ValueError | TypeError):  # a malformed message ended it
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(refused))
            if host.failure is not None:
                await context.abort(grpc.StatusCode.INTERNAL, host.failure)
        finally:
            if reader is not None and not reader.done():
                reader.cancel()
            host.drives -= 1
            if not host.drives:
                host.finished.set()

    async def Link(  # noqa: N802
        self, requests: AsyncIterator[pb.Batch], context: grpc.aio.ServicerContext
    ) -> pb.LinkReply:
        try:
            await _read(requests, self.host)
        except (ValueError, TypeError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.LinkReply()

    async def _holding(self, map_name: str, context: grpc.aio.ServicerContext) -> Node:
        """This node, once ``map_name`` is known to be one of the program's maps."""
        node = self.host.node
        if map_name not in node.placement.key_counts:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no map {map_name!r}")
        return node

    async def ReadMap(  # noqa: N802
        self, request: pb.MapRequest, context: grpc.aio.ServicerContext
    ) -> pb.MapReply:
        node = await self._holding(request.map, context)
        try:
            if request.committed:
                entries = node.snapshot(request.map, request.cut)
            else:
                entries = node.entries(request.map)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.MapReply(entries=encode_entries(entries))

    async def Preload(  # noqa: N802
        self, request: pb.PreloadRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreloadReply:
        node = await self._holding(request.map, context)
        entries = decode_entries(request.entries)
        holders = node.placement.holders
        strangers = [k for k in entries if node.number not in holders(request.map, k)]
        if strangers:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"map {request.map}: key {strangers[0]!r} belongs to node "
                f"{node.placement.node_of(request.map, strangers[0])}, not {node.number}",
            )
        try:
            node.preload(request.map, entries)
        except ProtocolError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.PreloadReply()

    async def Assign(  # noqa: N802
        self, request: pb.AssignRequest, context: grpc.aio.ServicerContext
    ) -> pb.AssignReply:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"DW node {self.host.config.number} runs the program it was started with; a node "
            "that views assign is started without --program",
        )
        raise AssertionError("abort raises")

    async def Stats(  # noqa: N802
        self, request: pb.NodeStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.NodeStatsReply:
        host = self.host
        node, stats = host.node, host.node.stats
        return pb.NodeStatsReply(
            corrective_sent=stats.corrective_sent,
            corrective_received=stats.corrective_received,
            max_depth=stats.max_depth,
            deferred_fetches=stats.deferred_fetches,
            epochs=stats.epochs,
            write_log_entries=sum(m.entries() for m in node.maps.values()),
            read_log_entries=sum(len(r) for r in node.reads.values()),
            operations=node.kept_operations,
            messages_sent=dict(host.sent),
            bytes_sent=dict(host.bytes),
            committed=node.committed,
        )


async def _read(requests: AsyncIterator[pb.Batch], host: NodeHost) -> None:
    async for batch in requests:
        _take(batch.messages, host)


def _take(envelopes: Sequence[pb.Envelope], host: NodeHost) -> None:
    """A stream's batch of envelopes as one message in the inbox: the node takes them in order
    in one call (``Node.handle`` of a ``Batch``)."""
    if envelopes:
        host.inbox.put_nowait(batched([decode(envelope) for envelope in envelopes]))


class NodePool:
    """DW nodes for the views that assign this process (``aggview cumulus node`` without
    ``--program``): a ``NodeHost`` per run, behind one server. A view's new run (its runtime
    loaded again, after a failure or a restart) replaces its old one; a run ends when its
    driver's streams have all ended."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, tls: TlsDir | None = None):
        self.host, self.port, self.tls = host, port, tls
        self.runs: dict[str, NodeHost] = {}
        self.views: dict[str, str] = {}  # view -> its run here
        self.server: grpc.aio.Server | None = None
        self._watchers: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        gates = [MemberGate(self.tls.secret)] if self.tls is not None else []
        self.server = grpc.aio.server(
            interceptors=gates or None, options=[*GRPC_OPTIONS, *SERVER_OPTIONS]
        )
        add_service(self.server, SERVICE, _PoolServicer(self))
        add_health(self.server)
        add_reflection(self.server, [SERVICE.full_name])
        credentials = self.tls.server_credentials(members_only=True) if self.tls else None
        port = bind(self.server, self.host, self.port, credentials)
        await self.server.start()
        return port

    async def assign(self, request: pb.AssignRequest) -> None:
        """A fresh node for ``request.run`` (ValueError for a program or layout that does
        not parse); the view's previous run here stops."""
        if not request.view or not request.run:
            raise ValueError("Assign names a view and a run")
        if request.run in self.runs:
            raise ValueError(f"run {request.run!r} is assigned already")
        if not 0 <= request.number < request.nodes:
            raise ValueError(f"node number {request.number} of {request.nodes} nodes")
        config = NodeConfig(
            request.program,
            number=request.number,
            nodes=request.nodes,
            switches=max(request.switches, 1),
            mode=request.mode or "speculative",
            per_switch=request.per_switch,
            tls=self.tls,
            run=request.run,
        )
        host = NodeHost(config)  # parses the program
        await self._end(request.view)
        self.runs[request.run] = host
        self.views[request.view] = request.run
        host.begin()
        log.info("view %s: run %s as node %d", request.view, request.run, request.number)
        watcher = asyncio.create_task(self._end_when_driven_out(request.view, host))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    async def _end_when_driven_out(self, view: str, host: NodeHost) -> None:
        await host.finished.wait()
        if self.views.get(view) == host.config.run:
            await self._end(view)

    async def _end(self, view: str) -> None:
        """Stops the view's run here, if it has one."""
        run = self.views.pop(view, None)
        host = self.runs.pop(run, None) if run is not None else None
        if host is not None:
            await host.stop()

    async def stop(self) -> None:
        for watcher in list(self._watchers):
            watcher.cancel()
        for view in list(self.views):
            await self._end(view)
        if self.server is not None:
            await self.server.stop(grace=1.0)


class _PoolServicer:
    """Each call reaches the run its metadata names (``RUN_HEADER``)."""

    def __init__(self, pool: NodePool) -> None:
        self.pool = pool

    async def _run(self, context: grpc.aio.ServicerContext) -> _Servicer:
        run = dict(context.invocation_metadata() or ()).get(RUN_HEADER, "")
        host = self.pool.runs.get(run)
        if host is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"no run {run!r} at this DW node: a view assigns it first (Assign), and a "
                "view's newer run replaces an older one",
            )
        return _Servicer(host)

    async def Assign(  # noqa: N802
        self, request: pb.AssignRequest, context: grpc.aio.ServicerContext
    ) -> pb.AssignReply:
        try:
            await self.pool.assign(request)
        except (ValueError, TypeError, errors.AggviewError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Assign: {exc}")
        return pb.AssignReply()

    async def Drive(  # noqa: N802
        self, requests: AsyncIterator[pb.Batch], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Batch]:
        async for batch in (await self._run(context)).Drive(requests, context):
            yield batch

    async def Link(  # noqa: N802
        self, requests: AsyncIterator[pb.Batch], context: grpc.aio.ServicerContext
    ) -> pb.LinkReply:
        return await (await self._run(context)).Link(requests, context)

    async def ReadMap(  # noqa: N802
        self, request: pb.MapRequest, context: grpc.aio.ServicerContext
    ) -> pb.MapReply:
        return await (await self._run(context)).ReadMap(request, context)

    async def Preload(  # noqa: N802
        self, request: pb.PreloadRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreloadReply:
        return await (await self._run(context)).Preload(request, context)

    async def Stats(  # noqa: N802
        self, request: pb.NodeStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.NodeStatsReply:
        return await (await self._run(context)).Stats(request, context)


async def _until_signalled() -> None:
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve(config: NodeConfig) -> None:
    """``aggview cumulus node --program``: one DW node until SIGINT or SIGTERM."""
    host = NodeHost(config)
    port = await host.start()
    print(f"cumulus node {config.number} listening on {config.host}:{port}", flush=True)
    await _until_signalled()
    await host.stop()


async def serve_pool(pool: NodePool) -> None:
    """``aggview cumulus node`` without ``--program``: DW nodes for the views that assign
    this process, until SIGINT or SIGTERM."""
    port = await pool.start()
    print(f"cumulus node pool listening on {pool.host}:{port}", flush=True)
    await _until_signalled()
    await pool.stop()
