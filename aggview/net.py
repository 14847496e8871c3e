"""gRPC settings every server and channel of the cluster shares."""

from __future__ import annotations

import asyncio
import signal

import grpc

from aggview import errors

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Servers refuse a port already in use instead of sharing it (gRPC reuses ports by default).
SERVER_OPTIONS = [("grpc.so_reuseport", 0)]
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # a restarted server is found again within a second, not after minutes of backoff
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def bind(server: grpc.aio.Server, host: str, port: int) -> int:
    """Binds a server, with an error naming the address if it is taken."""
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise errors.Unavailable(f"cannot listen on {host}:{port}: address in use or invalid")
    return bound


async def run_until_signalled(
    server: grpc.aio.Server, host: str, port: int, role: str, ready: asyncio.Event | None = None
) -> None:
    """Binds and starts a server, announces ``<role> listening on HOST:PORT`` (the line the
    cluster harness waits for), serves until SIGINT or SIGTERM, then stops it gracefully."""
    bound = bind(server, host, port)
    await server.start()
    print(f"{role} listening on {host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready.set()
    await stop.wait()
    await server.stop(grace=1.0)
