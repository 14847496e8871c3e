"""Spark hosts the Cumulus runtime: the DW nodes are the tasks of one barrier stage, the switches
and the epoch coordinator stay in the driver (``GrpcRuntime``).

A barrier stage starts all its tasks together or none, which is what a set of nodes that talk to
each other needs. Each task starts a DW node server (``NodeHost``), and ``allGather`` gives every
task every node's address; task 0 sends the list to the driver over a one-shot socket. The tasks
then serve until the driver closes its streams, and return their node's figures. The stage needs
one task slot per node, checked before anything runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import threading
from collections.abc import Iterator
from typing import Any

from aggview import errors, loops
from aggview.security import TlsDir
from cumulus.runtime.dw_server import NodeConfig, NodeHost

START_TIMEOUT = 120.0  # seconds for the stage's tasks to start and report their addresses


def task_slots(spark: Any) -> int:
    """How many tasks the cluster can run at once (what a barrier stage needs)."""
    sc = spark.sparkContext
    with contextlib.suppress(Exception):  # Spark's own count, through the JVM
        jsc = sc._jsc.sc()
        return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))
    match = re.fullmatch(r"local\[(\d+)\]", sc.master)
    return int(match.group(1)) if match else 1


@contextlib.contextmanager
def spark_nodes(
    spark: Any,
    program_text: str,
    nodes: int,
    *,
    switches: int = 1,
    mode: str = "speculative",
    tls: TlsDir | None = None,
    per_switch: bool = False,
) -> Iterator[list[str]]:
    """Runs ``nodes`` DW nodes as one barrier stage; yields their addresses. Close every stream
    to them (``GrpcRuntime.close``) before leaving the block: that is what ends the tasks."""
    slots = task_slots(spark)
    if slots < nodes:
        raise errors.FailedPrecondition(
            f"the Cumulus runtime on Spark needs {nodes} task slots (one per DW node) and this "
            f"Spark ({spark.sparkContext.master}) has {slots}: use fewer --nodes or more cores "
            "(local[N], or executors on a cluster)"
        )
    driver_host = spark.sparkContext.getConf().get("spark.driver.host", "127.0.0.1")
    listener = socket.create_server((driver_host, 0))
    listener.settimeout(START_TIMEOUT)
    report_to = f"{driver_host}:{listener.getsockname()[1]}"
    configs = [
        NodeConfig(
            program_text, n, nodes, switches, mode, per_switch=per_switch, host="0.0.0.0", tls=tls
        )
        for n in range(nodes)
    ]
    outcome: dict[str, Any] = {}

    def run_stage() -> None:
        rdd = spark.sparkContext.parallelize(configs, nodes)
        try:
            outcome["stats"] = rdd.barrier().mapPartitions(_task(report_to)).collect()
        except Exception as exc:  # noqa: BLE001 - reported by the driver, with Spark's words
            outcome["error"] = exc

    stage = threading.Thread(target=run_stage, name="cumulus-dw-stage", daemon=True)
    stage.start()
    try:
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            raise errors.Unavailable(
                f"the DW node tasks did not report within {START_TIMEOUT:g}s"
                + (f": {outcome['error']}" if "error" in outcome else "")
            ) from None
        with connection:
            addresses = json.loads(_read_all(connection))
        yield addresses
    finally:
        listener.close()
    stage.join()
    if "error" in outcome:
        raise errors.Unavailable(f"the DW node stage failed: {outcome['error']}")


def _read_all(connection: socket.socket) -> bytes:
    chunks = []
    while chunk := connection.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _task(report_to: str) -> Any:
    def run(configs: Iterator[NodeConfig]) -> Iterator[dict[str, Any]]:
        from pyspark import BarrierTaskContext

        (config,) = list(configs)
        context = BarrierTaskContext.get()
        loops.collect_less()  # a DW node's heaps, as in a server's process
        yield asyncio.run(_serve(config, context, report_to))

    return run


async def _serve(config: NodeConfig, context: Any, report_to: str) -> dict[str, Any]:
    """One DW node inside a Spark task, until the driver's streams end."""
    host = NodeHost(config)
    port = await host.start()
    executor_host = context.getTaskInfos()[context.partitionId()].address.rsplit(":", 1)[0]
    if executor_host in ("localhost", ""):
        executor_host = "127.0.0.1"  # the server listens on IPv4
    mine = json.dumps([config.number, f"{executor_host}:{port}"])
    loop = asyncio.get_running_loop()
    gathered = await loop.run_in_executor(None, context.allGather, mine)
    addresses = [address for _, address in sorted(json.loads(g) for g in gathered)]
    if context.partitionId() == 0:
        address, _, driver_port = report_to.rpartition(":")
        with socket.create_connection((address, int(driver_port)), timeout=30) as connection:
            connection.sendall(json.dumps(addresses).encode())
    try:
        await host.finished.wait()
    finally:
        await host.stop()
    stats = host.node.stats
    return {
        "node": config.number,
        "corrective_sent": stats.corrective_sent,
        "epochs": stats.epochs,
        "failure": host.failure,
    }
