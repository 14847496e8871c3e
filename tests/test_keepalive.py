"""A stream to a peer that went silent without closing (its host cut off, or the process
paused) fails within a few seconds, so the member notices before the failover delay is up and
reconnects, instead of waiting on it for as long as TCP keeps a connection (minutes)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from aggview.net import GRPC_OPTIONS

SERVER = """
import asyncio, sys
import grpc
from aggview.net import GRPC_OPTIONS, SERVER_OPTIONS, add_health

async def main():
    server = grpc.aio.server(options=[*GRPC_OPTIONS, *SERVER_OPTIONS])
    add_health(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()

asyncio.run(main())
"""


def test_a_stream_to_a_paused_server_fails_within_seconds() -> None:
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())

        async def watch_until_it_fails() -> tuple[float, grpc.StatusCode]:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as ch:
                call = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest())
                first = await call.read()  # the stream is open: SERVING
                assert first.status == health_pb2.HealthCheckResponse.SERVING
                os.kill(server.pid, signal.SIGSTOP)
                paused = time.monotonic()
                try:
                    await asyncio.wait_for(call.read(), 30)
                except grpc.aio.AioRpcError as exc:
                    return time.monotonic() - paused, exc.code()
                raise AssertionError("the stream went on while its server was paused")

        took, code = asyncio.run(watch_until_it_fails())
        assert code == grpc.StatusCode.UNAVAILABLE
        assert took < 6.0, f"noticed only after {took:.1f}s"
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()
        server.wait()
