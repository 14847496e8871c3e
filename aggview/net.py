"""gRPC settings every server and channel of the cluster shares."""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import socket
import sys
import threading

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from aggview import errors

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Once signalled, a server has this long to stop (checkpoint included) before it exits anyway.
SHUTDOWN_DEADLINE = float(os.environ.get("AGGVIEW_SHUTDOWN_DEADLINE", "15"))
# Keepalive (framed streams only, ``keep_alive``): a host cut off is noticed within about three
# seconds, not when TCP gives up minutes later. gRPC's own keepalive at this rate exposed a
# transient inconsistent read after a paused member's hand-back (2 of 10 runs of
# test_a_member_declared_dead_while_alive_stops_and_rejoins, 0 of 8 without): left off until
# that is understood; the probes (1 s timeouts) notice silence on the gRPC side.
KEEPALIVE_MS = 1000
KEEPALIVE_TIMEOUT_MS = 2000
# Servers refuse a port already in use instead of sharing it (gRPC reuses ports by default).
SERVER_OPTIONS = [("grpc.so_reuseport", 0)]
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # a restarted server is found again within a second, not after minutes of backoff
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Despite its name, how long one connection attempt may wait for the server's first
    # HTTP/2 frame. At 100 ms, a busy machine (a server not scheduled for a moment) failed new
    # channels' calls as unavailable ("connection attempt timed out before receiving SETTINGS
    # frame"), with nothing wrong: a transaction's outcome unknown, a member looking dead. A
    # server that is down refuses the connection at once, whatever this is.
    ("grpc.min_reconnect_backoff_ms", 5000),
]
# For control channels (probes, log copies, outcome questions): gRPC shares one connection per
# address between channels, so one of them dialling a member that is not up yet (members start
# one by one) would put the transaction channels to that address into backoff as well.
CONTROL_OPTIONS = [*GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]


def is_host_port(text: str) -> bool:
    """``host:port`` (``[v6]:port``) with a port gRPC can dial: a bare host would dial 443."""
    host, sep, port = text.rpartition(":")
    return bool(sep and host.strip("[]") and port.isdigit() and 0 < int(port) < 65536)


def keep_alive(sock: socket.socket | None) -> None:
    """TCP keepalive and a send timeout on a framed stream's socket: the same promise as the
    gRPC channels' keepalive (a host cut off is noticed within about three seconds, whether
    the stream idles or has data in flight; a paused process is not: its kernel answers)."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    seconds = max(1, KEEPALIVE_MS // 1000)
    for option, value in (
        ("TCP_KEEPIDLE", seconds),
        ("TCP_KEEPINTVL", seconds),
        ("TCP_KEEPCNT", 2),
        ("TCP_USER_TIMEOUT", KEEPALIVE_MS + KEEPALIVE_TIMEOUT_MS),
    ):
        if hasattr(socket, option):  # Linux has them all
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def add_health(server: grpc.aio.Server) -> health.aio.HealthServicer:
    """Adds the standard gRPC health service (grpc.health.v1.Health), overall status SERVING,
    so orchestrators (compose, Kubernetes, grpc_health_probe) can probe any aggview server."""
    servicer = health.aio.HealthServicer()  # starts with "" (the whole server) SERVING
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer


def add_reflection(server: grpc.aio.Server, services: list[str]) -> None:
    """Adds gRPC server reflection listing ``services`` (full names), health and reflection
    itself, so grpcurl and similar tools can list and call any aggview server."""
    names = [*services, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name]
    reflection.enable_server_reflection([*names, reflection.SERVICE_NAME], server)


def bind(
    server: grpc.aio.Server,
    host: str,
    port: int,
    credentials: grpc.ServerCredentials | None = None,
) -> int:
    """Binds a server (TLS when given credentials), with an error naming the address if it
    is taken."""
    try:
        if credentials is None:
            bound = server.add_insecure_port(f"{host}:{port}")
        else:
            bound = server.add_secure_port(f"{host}:{port}", credentials)
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise errors.Unavailable(f"cannot listen on {host}:{port}: address in use or invalid")
    return bound


async def run_until_signalled(
    server: grpc.aio.Server,
    host: str,
    port: int,
    role: str,
    ready: asyncio.Event | None = None,
    credentials: grpc.ServerCredentials | None = None,
) -> None:
    """Binds and starts a server, announces ``<role> listening on HOST:PORT`` (the line the
    cluster harness waits for), serves until SIGINT or SIGTERM, then stops it gracefully."""
    bound = bind(server, host, port, credentials)
    await server.start()
    print(f"{role} listening on {host}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, _print_tasks, loop, role)
    if ready is not None:
        ready.set()
    await stop.wait()
    arm_shutdown_deadline(loop, role)
    await server.stop(grace=1.0)


def _print_tasks(loop: asyncio.AbstractEventLoop, role: str) -> None:
    """``kill -USR1``: where every task of the server waits, to the log (a hang's report)."""
    tasks = list(asyncio.all_tasks(loop))
    lines = [f"{role}: {len(tasks)} tasks"]
    for task in tasks:
        lines.append(f"task {task.get_name()}: {task.get_coro()!r}")
        for frame in task.get_stack():  # a compiled frame may have no line number
            lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
    print("\n".join(lines), file=sys.stderr, flush=True)


def arm_shutdown_deadline(
    loop: asyncio.AbstractEventLoop, role: str, seconds: float = SHUTDOWN_DEADLINE
) -> None:
    """A stop that hangs (in a library's shutdown, say) must not keep the cluster from
    stopping: after ``seconds`` the stacks of every task and thread go to the log, for the
    bug report, and the process exits with status 3. Exiting there loses nothing: what was
    not checkpointed is replayed from the write-ahead log at the next start."""

    def overrun() -> None:
        print(f"{role}: stopping took over {seconds:g}s; exiting", file=sys.stderr, flush=True)
        try:
            for task in list(asyncio.all_tasks(loop)):
                task.print_stack(file=sys.stderr)
        except RuntimeError:  # the loop changed its task set meanwhile: threads still help
            pass
        faulthandler.dump_traceback(all_threads=True)
        os._exit(3)

    timer = threading.Timer(seconds, overrun)
    timer.daemon = True  # still fires while the interpreter waits for other threads at exit
    timer.start()
