"""Where a cumulus view's DW nodes run (the view's ``host`` option).

- ``local``: the simulator host in the coordinating process, the node state machines driven
  to quiescence at each epoch (no message leaves the process);
- ``grpc``: one process per DW node (``aggview cumulus node``), started by member 0 beside the
  view, driven over gRPC streams by the runtime's switch and epoch coordinator in member 0.
  The nodes die with the process that started them; a dead node fails the next epoch, which
  reports it, and the view loads a new runtime (new nodes) from a snapshot.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from aggview.cluster import Server
from aggview.security import TlsDir
from cumulus.m3.program import Program
from cumulus.plan import ViewPlan
from cumulus.runtime.grpc_host import GrpcRuntime, start_node_processes
from cumulus.runtime.simulator import Simulator

NO_TIMED_EPOCHS_MS = 10**9  # the view commits an epoch when it has fed one (never on a timer)


class NodeProcesses(GrpcRuntime):
    """The gRPC host with node processes of its own, stopped by ``close``."""

    def __init__(self, program: Program, plan: ViewPlan, directory: Path, tls: TlsDir | None):
        self.servers: list[Server] = start_node_processes(
            program,
            plan.nodes,
            directory,
            mode=plan.speculation,
            tls_dir=tls.directory if tls is not None else None,
        )
        try:
            super().__init__(
                program,
                [server.address for server in self.servers],
                mode=plan.speculation,
                epoch_ms=NO_TIMED_EPOCHS_MS,
                tls=tls,
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


def start_runtime(
    program: Program, plan: ViewPlan, directory: Path | None, tls: TlsDir | None
) -> Any:
    """A runtime for ``plan`` (same interface as the simulator's; ``close`` where it holds
    processes)."""
    if plan.host == "grpc":
        if directory is None:
            raise ValueError("a gRPC-hosted runtime needs a directory for its nodes' logs")
        return NodeProcesses(program, plan, directory, tls)
    return Simulator(program, nodes=plan.nodes, mode=plan.speculation)
