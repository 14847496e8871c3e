"""What one message between two of our processes costs, by transport, in one run.

Members exchange prepares, votes and decisions on one long-lived gRPC stream per pair
(``coordinator/ltm_channel.py``), and DECISIONS ("What a transaction costs") puts the Python
gRPC CPU of a message at 175-220 us. This measures that figure against the cheapest transport
Python offers, asyncio streams with length-prefixed frames, to tell whether a cheaper
member-to-member transport is a design move worth making (#17's 3-row target):

* a server process (this module, ``--serve``) echoes every frame on a gRPC bidirectional
  stream (raw bytes, no protobuf: both transports would carry the same encoded messages) and
  on a TCP socket;
* the client sends ``--messages`` frames of ``--size`` bytes with ``--window`` of them in
  flight (1: a round trip each; more: pipelined, as under load), and reads every echo;
* printed per message: client and server CPU (user + system, every thread, from /proc) and
  wall time; then the gRPC / TCP ratios. Cases alternate so drift hits both alike.

    python -m bench.messages --messages 20000 --window 1 16 --repeat 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from aggview.net import GRPC_OPTIONS
from aggview.processes import free_port, process_cpu_seconds

METHOD = "/bench.Echo/Stream"
FRAME = struct.Struct("!I")


def _identity(data: bytes) -> bytes:
    return data


async def _serve(grpc_port: int, tcp_port: int) -> None:
    async def echo_stream(requests: AsyncIterator[bytes], context: object) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Stream": grpc.stream_stream_rpc_method_handler(
                echo_stream, request_deserializer=_identity, response_serializer=_identity
            )
        },
    )
    server = grpc.aio.server(options=GRPC_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await server.start()

    async def echo_socket(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                header = await reader.readexactly(FRAME.size)
                body = await reader.readexactly(FRAME.unpack(header)[0])
                writer.write(header + body)
        except asyncio.IncompleteReadError:
            writer.close()

    tcp = await asyncio.start_server(echo_socket, "127.0.0.1", tcp_port)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until closed
    tcp.close()
    await server.stop(None)


async def _grpc_case(port: int, count: int, size: int, window: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as channel:
        call = channel.stream_stream(
            METHOD, request_serializer=_identity, response_deserializer=_identity
        )()
        payload = os.urandom(size)
        room = asyncio.Semaphore(window)

        async def send() -> None:
            for _ in range(count):
                await room.acquire()
                await call.write(payload)
            await call.done_writing()

        sender = asyncio.create_task(send())
        for _ in range(count):
            reply = await call.read()
            assert reply == payload, "echo mismatch"
            room.release()
        await sender


async def _tcp_case(port: int, count: int, size: int, window: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    frame = FRAME.pack(size) + os.urandom(size)
    room = asyncio.Semaphore(window)

    async def send() -> None:
        for _ in range(count):
            await room.acquire()
            writer.write(frame)
            await writer.drain()

    sender = asyncio.create_task(send())
    for _ in range(count):
        header = await reader.readexactly(FRAME.size)
        body = await reader.readexactly(FRAME.unpack(header)[0])
        assert header + body == frame, "echo mismatch"
        room.release()
    await sender
    writer.close()
    await writer.wait_closed()


@dataclass
class Result:
    transport: str
    window: int
    client_us: float  # CPU per message, client process
    server_us: float  # CPU per message, echo process
    wall_us: float

    @property
    def total_us(self) -> float:
        return self.client_us + self.server_us


def _measure(
    transport: str, ports: tuple[int, int], server: int, count: int, size: int, window: int
) -> Result:
    if transport == "grpc":
        case = _grpc_case(ports[0], count, size, window)
    else:
        case = _tcp_case(ports[1], count, size, window)
    me = os.getpid()
    client0, server0 = process_cpu_seconds(me), process_cpu_seconds(server)
    wall0 = time.perf_counter()
    asyncio.run(case)
    wall = time.perf_counter() - wall0
    client = process_cpu_seconds(me) - client0
    served = process_cpu_seconds(server) - server0
    micro = 1e6 / count
    return Result(transport, window, client * micro, served * micro, wall * micro)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--size", type=int, default=200, help="bytes per message")
    parser.add_argument("--window", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--serve", type=int, nargs=2, metavar=("GRPC_PORT", "TCP_PORT"))
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(*args.serve))
        return
    if args.messages < 1 or args.size < 1 or min(args.window) < 1 or args.repeat < 1:
        parser.error("--messages, --size, --window and --repeat must be positive")
    ports = (free_port(), free_port())
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.messages", "--serve", *map(str, ports)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        results: list[Result] = []
        for window in args.window:
            _measure("grpc", ports, server.pid, 2000, args.size, window)  # warm both up
            _measure("tcp", ports, server.pid, 2000, args.size, window)
            for _ in range(args.repeat):
                for transport in ("grpc", "tcp"):
                    results.append(
                        _measure(transport, ports, server.pid, args.messages, args.size, window)
                    )
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(10)
    print(f"{args.messages} messages of {args.size} bytes, per message in us", end="")
    print(f" (best of {args.repeat}):")
    print(f"{'transport':>9} {'window':>6} {'client CPU':>10} {'server CPU':>10}", end="")
    print(f" {'total':>7} {'wall':>7}")
    best: dict[tuple[str, int], Result] = {}
    for r in results:
        key = (r.transport, r.window)
        if key not in best or r.total_us < best[key].total_us:
            best[key] = r
    for r in best.values():
        print(
            f"{r.transport:>9} {r.window:>6} {r.client_us:>10.1f} {r.server_us:>10.1f} "
            f"{r.total_us:>7.1f} {r.wall_us:>7.1f}"
        )
    for window in args.window:
        g, t = best[("grpc", window)], best[("tcp", window)]
        print(
            f"window {window}: gRPC / TCP CPU per message {g.total_us / t.total_us:.2f} "
            f"({g.total_us:.0f} vs {t.total_us:.0f} us), wall {g.wall_us / t.wall_us:.2f}"
        )


if __name__ == "__main__":
    main()
