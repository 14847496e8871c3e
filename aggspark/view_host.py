"""A cumulus view's DW nodes hosted by Spark (``host = 'spark'``): the nodes are the tasks of
one barrier stage of process 0's local Spark session (``aggspark.dw_stage``), driven over
gRPC by the runtime's switch and epoch coordinator in process 0, as the ``grpc`` host's node
processes are. The stage ends when the runtime closes its streams.

Registered into ``coordinator.cumulus_hosts`` by the server entry point (the coordinator layer
does not import Spark): a server without PySpark refuses the host with an error saying so."""

from __future__ import annotations

import contextlib
from pathlib import Path

from aggspark.dw_stage import spark_nodes
from aggspark.session import spark_session
from aggview.security import TlsDir
from cumulus.m3.printer import print_program
from cumulus.m3.program import Program
from cumulus.plan import ViewPlan
from cumulus.runtime.grpc_host import GrpcRuntime, view_runtime_options


class SparkStageNodes(GrpcRuntime):
    """The gRPC host over a barrier stage's tasks; ``close`` ends the stage."""

    def __init__(
        self,
        program: Program,
        plan: ViewPlan,
        directory: Path | None,
        tls: TlsDir | None,
        members: int | None = None,
    ) -> None:
        self._stage = contextlib.ExitStack()
        addresses = self._stage.enter_context(
            spark_nodes(
                spark_session(),
                print_program(program),
                plan.nodes,
                mode=plan.speculation,
                tls=tls,
                switches=members or 1,
                per_switch=members is not None,
            )
        )
        try:
            super().__init__(
                program,
                addresses,
                **view_runtime_options(plan.speculation, tls, members),
            )
        except BaseException:
            self._stage.close()
            raise

    def close(self) -> None:
        try:
            super().close()  # the tasks see their driver leave and return
        finally:
            with contextlib.suppress(Exception):  # a failed stage was reported by the epoch
                self._stage.close()
