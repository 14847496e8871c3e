"""Where a cumulus view's DW nodes run (the view's ``host`` option).

- ``local``: the simulator host in the coordinating process, the node state machines driven
  to quiescence at each epoch (no message leaves the process);
- ``grpc``: one process per DW node (``aggview cumulus node``), started by member 0 beside the
  view, driven over gRPC streams by the runtime's switches (one per coordinating member, fed
  by its stream, ``coordinator.member_switch``) and epoch coordinator in member 0.
  The nodes die with the process that started them; a dead node fails the next epoch, which
  reports it, and the view loads a new runtime (new nodes) from a snapshot;
- addresses (``host = 'h1:7100,h2:7100'``): node pools started elsewhere (``aggview cumulus
  node`` without ``--program``, on machines with cores to spare), each assigned a run of the
  view (``NodePool``) and driven as the ``grpc`` host's. A node that dies fails the next epoch;
  the view then loads a new run, retried until every address answers again;
- ``spark``: the DW nodes as the tasks of a barrier stage of member 0's Spark session
  (``aggspark.view_host``, registered in ``EXTRA_HOSTS`` by the server entry point: this
  layer does not import Spark). A failed stage fails the next epoch, and is recovered the same
  way.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aggview import errors
from aggview.processes import Server
from aggview.security import TlsDir
from cumulus.m3.program import Program
from cumulus.plan import ViewPlan, node_addresses
from cumulus.runtime.grpc_host import (
    GrpcRuntime,
    assign_nodes,
    start_node_processes,
    view_runtime_options,
)
from cumulus.runtime.simulator import FEED_BATCH, Simulator

# Hosts of other layers, by name: (program, plan, directory, tls, members) -> runtime;
# members: the switches, one per coordinating member, stamped by them (None: one, drained)
EXTRA_HOSTS: dict[
    str, Callable[[Program, ViewPlan, Path | None, TlsDir | None, int | None], Any]
] = {}


class NodeProcesses(GrpcRuntime):
    """The gRPC host with node processes of its own, stopped by ``close``."""

    def __init__(
        self,
        program: Program,
        plan: ViewPlan,
        directory: Path,
        tls: TlsDir | None,
        members: int | None = None,
    ):
        self.servers: list[Server] = start_node_processes(
            program,
            plan.nodes,
            directory,
            mode=plan.speculation,
            tls_dir=tls.directory if tls is not None else None,
            switches=members or 1,
            per_switch=members is not None,
        )
        try:
            super().__init__(
                program,
                [server.address for server in self.servers],
                **view_runtime_options(plan.speculation, tls, members),
            )
        except BaseException:
            self._stop_servers()
            raise

    def close(self) -> None:
        with contextlib.suppress(Exception):
            super().close()
        self._stop_servers()

    def _stop_servers(self) -> None:
        for server in self.servers:
            server.stop()


class AssignedNodes(GrpcRuntime):
    """The gRPC host on node pools at the view's addresses, assigned a run of their own."""

    def __init__(
        self, program: Program, plan: ViewPlan, tls: TlsDir | None, members: int | None = None
    ):
        addresses = node_addresses(plan.host)
        run = f"{plan.name}-{uuid.uuid4().hex[:12]}"
        switches = members or 1
        assign_nodes(
            program,
            addresses,
            view=plan.name,
            run=run,
            switches=switches,
            mode=plan.speculation,
            per_switch=members is not None,
            tls=tls,
        )
        super().__init__(
            program,
            addresses,
            **view_runtime_options(plan.speculation, tls, members),
            run=run,
        )


def start_runtime(
    program: Program,
    plan: ViewPlan,
    directory: Path | None,
    tls: TlsDir | None,
    members: int | None = None,
) -> Any:
    """A runtime for ``plan`` (same interface as the simulator's; ``close`` where it holds
    processes), with a switch per member stamped by them (``members``) or one, drained."""
    if plan.host == "grpc":
        if directory is None:
            raise ValueError("a gRPC-hosted runtime needs a directory for its nodes' logs")
        return NodeProcesses(program, plan, directory, tls, members)
    if node_addresses(plan.host):
        return AssignedNodes(program, plan, tls, members)
    if plan.host == "local":
        return Simulator(
            program,
            nodes=plan.nodes,
            mode=plan.speculation,
            switches=members or 1,
            stamped=members is not None,
            batch=FEED_BATCH,
        )
    start = EXTRA_HOSTS.get(plan.host)
    if start is None:
        raise errors.FailedPrecondition(
            f"materialized view {plan.name}: host '{plan.host}' is not available in this "
            "server (host 'spark' needs the Spark layer: pip install 'aggview[spark]')"
        )
    return start(program, plan, directory, tls, members)
