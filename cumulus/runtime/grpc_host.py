"""The Cumulus runtime over gRPC: the switches and the epoch coordinator in this process, each
DW node a server (a process of its own, or a Spark task) reached by one ordered stream per
switch. Same interface as the simulator (``check``, ``feed``, ``finish``, ``maps``,
``snapshot``, ``latencies``), so the replay runs either.

Messages to a node are batched per stream: a batch leaves when it holds ``BATCH`` messages or
is older than ``LINGER`` seconds, and at every epoch end. The number of operations dispatched
and not yet written is held under ``WINDOW``, so a fast stream cannot swamp the nodes' inboxes.

``stamped``: switches of their own (a cluster's coordinating members'), as on the simulator:
``feed_stamped``, ``open_at``, ``close_switch``, and ``finish`` waits for the open epoch.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc

from aggview import errors
from aggview.net import GRPC_OPTIONS
from aggview.processes import Server, free_port
from aggview.security import TlsDir, member_metadata
from aggview.wire import cumulus_pb2 as pb
from aggview.wire import cumulus_pb2_grpc as pb_grpc
from cumulus.m3.printer import print_program
from cumulus.m3.program import Program
from cumulus.runtime.dw_server import RUN_HEADER, kind_name
from cumulus.runtime.epochs import EpochCoordinator, Sends
from cumulus.runtime.messages import COORDINATOR, Dispatch, EpochCommit, Key
from cumulus.runtime.placement import Placement
from cumulus.runtime.simulator import Report, Update
from cumulus.runtime.switch import Clock, Switch
from cumulus.runtime.wire import decode, decode_entries, encode, encode_entries

log = logging.getLogger(__name__)

BATCH = 256
LINGER = 0.005
PRELOAD_CHUNK = 20_000  # map entries per Preload message
WINDOW = 20_000
STALL = 120.0  # seconds without any answer from the nodes before a run is declared stuck
NO_TIMED_EPOCHS_MS = 10**9  # epoch_ms of a view's runtime: an epoch when it has fed one, no timer
CLOSE_WAIT = 5.0  # seconds a close waits for the nodes to end their Drive streams


def _channel(address: str, tls: TlsDir | None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(address, options=GRPC_OPTIONS)
    return grpc.secure_channel(address, tls.member_credentials(), options=GRPC_OPTIONS)


class GrpcRuntime:
    def __init__(
        self,
        program: Program,
        addresses: list[str],
        *,
        switches: int = 1,
        mode: str = "speculative",
        epoch_ms: int = 1000,
        tls: TlsDir | None = None,
        stamped: bool = False,
        run: str = "",
    ) -> None:
        """``run``: the nodes are a node pool's, assigned this run (``NodePool``)."""
        if switches < 1:
            raise ValueError("a Cumulus runtime needs at least one switch")
        self.program = program
        self.addresses = addresses
        self.placement = Placement(program, len(addresses))
        self.external = stamped
        shared = Clock() if mode == "conservative" and not stamped else None
        self.switches = [Switch(self.placement, i, shared) for i in range(switches)]
        self.epochs = EpochCoordinator(self.switches, len(addresses), external=stamped)
        self.epoch_every = epoch_ms / 1000
        self.tls = tls
        self.run = run
        self.report = Report()
        self._lock = threading.Condition()
        self._failure: str | None = None
        self._entered: dict[Any, float] = {}
        self._done: dict[Any, float] = {}
        self._outstanding = 0  # operations dispatched and not yet written
        self._start = self._last_answer = time.monotonic()
        self._fed = 0
        self._began = self._start
        self._next_epoch = self._began + self.epoch_every
        self._channels = [_channel(a, tls) for a in addresses]
        self._stubs = [pb_grpc.DwNodeStub(c) for c in self._channels]
        self._pending: dict[tuple[int, int], list[pb.Envelope]] = {}
        self._oldest: dict[tuple[int, int], float] = {}
        self._queues: dict[tuple[int, int], queue.SimpleQueue[pb.Batch | None]] = {}
        self._threads: list[threading.Thread] = []
        self.sent: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self.node_stats: list[pb.NodeStatsReply] = []  # as of the last finish
        for s in range(switches):
            for n in range(len(addresses)):
                self._open(s, n)

    # ------------------------------------------------------------------------- streams

    def _open(self, switch: int, node: int) -> None:
        requests: queue.SimpleQueue[pb.Batch | None] = queue.SimpleQueue()
        hello = pb.Hello(switch_id=switch, peers=self.addresses)
        requests.put(pb.Batch(source=-1, messages=[pb.Envelope(hello=hello)]))
        self._queues[(switch, node)] = requests
        self._pending[(switch, node)] = []
        responses = self._stubs[node].Drive(iter(requests.get, None), metadata=self._metadata)
        thread = threading.Thread(
            target=self._answers, args=(node, responses), name=f"cumulus-drive-{switch}-{node}"
        )
        thread.daemon = True
        thread.start()
        self._threads.append(thread)

    def _answers(self, node: int, responses: Iterator[pb.Batch]) -> None:
        """Reads one Drive stream's answers: READY and END REQUEST for the coordinator,
        completions for latency and the window."""
        try:
            for batch in responses:
                now = time.monotonic()
                with self._lock:
                    self._last_answer = now
                    for envelope in batch.messages:
                        kind = envelope.WhichOneof("kind")
                        if kind == "completed":
                            for ts in envelope.completed.ts:
                                self._done[(ts.counter, ts.switch_id)] = now
                            self._outstanding -= len(envelope.completed.ts)
                        else:
                            self._route(self.epochs.handle(decode(envelope)))
                    self._flush_all()
                    self._lock.notify_all()
        except grpc.RpcError as exc:
            with self._lock:
                if self._failure is None and exc.code() != grpc.StatusCode.CANCELLED:
                    self._failure = (
                        f"DW node {node} at {self.addresses[node]} failed: "
                        f"{exc.code().name}: {exc.details()}"
                    )
                self._lock.notify_all()

    def _send(self, switch: int, node: int, message: Any) -> None:
        envelope = encode(message)
        kind = kind_name(envelope)
        self.sent[kind] += 1
        self.bytes[kind] += envelope.ByteSize()
        key = (switch, node)
        pending = self._pending[key]
        if not pending:
            self._oldest[key] = time.monotonic()
        pending.append(envelope)
        if len(pending) >= BATCH:
            self._flush(key)

    def _flush(self, key: tuple[int, int]) -> None:
        pending = self._pending[key]
        if pending:
            self._queues[key].put(pb.Batch(source=-1, messages=pending))
            self._pending[key] = []

    def _flush_all(self, older_than: float | None = None) -> None:
        now = time.monotonic()
        for key, pending in self._pending.items():
            if pending and (older_than is None or now - self._oldest[key] >= older_than):
                self._flush(key)

    def _route(self, sends: Sends) -> None:
        for sender, node, message in sends:
            if isinstance(message, EpochCommit):
                cut = message.cut
                newest = self.epochs.newest()
                began = self._began - self._start
                self.report.epochs.append((cut, began, time.monotonic() - self._start, newest))
            else:
                self._began = time.monotonic()
            self._send(0 if sender == COORDINATOR else sender, node, message)

    # ------------------------------------------------------------------------- the run

    def check(self, update: Update) -> None:
        sign, relation, row = update
        self.switches[0].check(sign, relation, row)

    def feed(self, stream: Iterable[Update]) -> None:
        for sign, relation, row in stream:
            with self._lock:
                self._raise_failure()
                while self._outstanding > WINDOW and self._failure is None:
                    self._flush_all()
                    self._wait()
                switch = self.switches[self._fed % len(self.switches)]
                ts, messages = switch.update(sign, relation, row)
                self._fed += 1
                self.report.updates += 1
                self._entered[ts] = time.monotonic()
                for node, message in messages:
                    self._outstanding += len(message.puts) if isinstance(message, Dispatch) else 0
                    self._send(switch.number, node, message)
                if time.monotonic() >= self._next_epoch:
                    self._next_epoch = time.monotonic() + self.epoch_every
                    self._route(self.epochs.begin())
                    self._flush_all()
                else:
                    self._flush_all(LINGER)

    def feed_stamped(
        self, switch: int, stream: Iterable[tuple[int, Update]], checked: bool = False
    ) -> None:
        """``stamped``: updates of switch ``switch`` with their timestamp counters (rising);
        ``checked``: rows as ``Switch.update_at`` takes them unchecked."""
        with self._lock:
            self._raise_failure()
            while self._outstanding > WINDOW and self._failure is None:
                self._flush_all()
                self._wait()
            for counter, (sign, relation, row) in stream:
                ts, messages = self.switches[switch].update_at(
                    counter, sign, relation, row, checked
                )
                self._fed += 1
                self.report.updates += 1
                self._entered[ts] = time.monotonic()
                for node, message in messages:
                    self._outstanding += len(message.puts) if isinstance(message, Dispatch) else 0
                    self._send(switch, node, message)
            self._flush_all(LINGER)

    def open_at(self, cut: int) -> None:
        with self._lock:
            self.epochs.open_at(cut)
            self._began = time.monotonic()

    def close_switch(self, switch: int, cut: int) -> None:
        """``stamped``: switch ``switch`` dispatched everything of its own up to ``cut``."""
        with self._lock:
            self._route(self.epochs.close(switch, cut))
            self._flush_all()

    def deliver(self) -> None:
        """Sends what is batched (the nodes apply it on their own)."""
        with self._lock:
            self._flush_all()

    def finish(self) -> Report:
        """Commits a last epoch holding every update fed, and waits for it (``stamped``: waits
        for the open epoch, which every switch closed)."""
        with self._lock:
            while self.external and self.epochs.open is not None:
                self._raise_failure()
                self._flush_all()
                self._wait()
            while not self.external and self.epochs.committed < self.epochs.newest():
                self._raise_failure()
                self._route(self.epochs.begin())
                self._flush_all()
                self._wait()
            self._raise_failure()
        while True:  # the commit is on its way to the nodes: wait until all have applied it
            stats = [
                stub.Stats(pb.NodeStatsRequest(), metadata=self._metadata) for stub in self._stubs
            ]
            if all(s.committed >= self.epochs.committed for s in stats):
                break
            time.sleep(0.01)
        self.report.corrective = sum(s.corrective_sent for s in stats)
        self.report.max_depth = max((s.max_depth for s in stats), default=0)
        self.report.messages = Counter(self.sent)
        for s in stats:
            self.report.messages.update(dict(s.messages_sent))
            self.bytes.update(dict(s.bytes_sent))
        self.node_stats = stats
        return self.report

    @property
    def _metadata(self) -> tuple[tuple[str, str], ...]:
        run = ((RUN_HEADER, self.run),) if self.run else ()
        return (*member_metadata(self.tls), *run)

    def _wait(self) -> None:
        self._lock.wait(timeout=1.0)
        if time.monotonic() - self._last_answer > STALL and self._failure is None:
            self._failure = f"no DW node answered for {STALL:g}s"

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise errors.Unavailable(self._failure)

    # ------------------------------------------------------------------------- results

    def latencies(self) -> list[float]:
        """Seconds from each update's dispatch to its last write (updates that wrote)."""
        return [self._done[ts] - at for ts, at in self._entered.items() if ts in self._done]

    def preload(self, maps: Mapping[str, Mapping[Key, Any]]) -> None:
        """Maps computed before any update (over a snapshot), each entry to the node holding
        its key, in messages of at most ``PRELOAD_CHUNK`` entries."""
        if self._fed:
            raise errors.FailedPrecondition("preload after updates: the maps would miss them")
        for name, entries in maps.items():
            for number, part in self.placement.parts(name, entries).items():
                items = list(part.items())
                for start in range(0, len(items), PRELOAD_CHUNK):
                    chunk = dict(items[start : start + PRELOAD_CHUNK])
                    request = pb.PreloadRequest(map=name, entries=encode_entries(chunk))
                    self._stubs[number].Preload(request, metadata=self._metadata, timeout=60)

    def maps(self, names: Collection[str] | None = None) -> dict[str, dict[Key, Any]]:
        return self._gather(pb.MapRequest(committed=False), names)

    def snapshot(
        self, cut: int | None = None, names: Collection[str] | None = None
    ) -> tuple[int, dict[str, dict[Key, Any]]]:
        cut = self.epochs.committed if cut is None else cut
        return cut, self._gather(pb.MapRequest(committed=True, cut=cut), names)

    def _gather(
        self, request: pb.MapRequest, names: Collection[str] | None = None
    ) -> dict[str, dict[Key, Any]]:
        out: dict[str, dict[Key, Any]] = {}
        for m in self.program.maps:
            if names is not None and m.name not in names:
                continue
            request.map = m.name
            parts = [
                decode_entries(
                    self._stubs[number].ReadMap(request, metadata=self._metadata).entries
                )
                for number in self.placement.read_from(m.name)
            ]
            out[m.name] = self.placement.gather(m.name, parts)
        return out

    def log_sizes(self) -> dict[str, int]:
        stats = self.node_stats
        return {
            "write_log_entries": sum(s.write_log_entries for s in stats),
            "read_log_entries": sum(s.read_log_entries for s in stats),
            "operations": sum(s.operations for s in stats),
        }

    def close(self) -> None:
        """Ends every Drive stream (the nodes see the driver leave and end their answers) and
        closes the channels; a stream a node leaves open is cut after ``CLOSE_WAIT``."""
        for key in self._queues:
            self._flush(key)
            self._queues[key].put(None)
        deadline = time.monotonic() + CLOSE_WAIT
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        left = [thread.name for thread in self._threads if thread.is_alive()]
        if left:
            log.warning(
                "DW nodes left %s open %.0fs after the driver closed: cut", left, CLOSE_WAIT
            )
        for channel in self._channels:
            channel.close()


def view_runtime_options(
    speculation: str, tls: TlsDir | None, members: int | None
) -> dict[str, Any]:
    """``GrpcRuntime``'s options for a cluster's view: an epoch when the view asks for one (no
    timer), and a switch per member stamped by it (``members``) or one, drained."""
    return {
        "mode": speculation,
        "epoch_ms": NO_TIMED_EPOCHS_MS,
        "tls": tls,
        "switches": members or 1,
        "stamped": members is not None,
    }


def assign_nodes(
    program: Program,
    addresses: list[str],
    *,
    view: str,
    run: str,
    switches: int = 1,
    mode: str = "speculative",
    per_switch: bool = False,
    tls: TlsDir | None = None,
    timeout: float = 10.0,
) -> None:
    """Assigns ``run`` of ``view`` to the node pools at ``addresses`` (``aggview cumulus node``
    without ``--program``), node i at the i-th; ``errors.Unavailable`` names the first that
    does not answer, ``errors.InvalidArgument`` the first that refuses."""
    text = print_program(program)
    for number, address in enumerate(addresses):
        channel = _channel(address, tls)
        try:
            request = pb.AssignRequest(
                view=view,
                run=run,
                program=text,
                number=number,
                nodes=len(addresses),
                switches=switches,
                mode=mode,
                per_switch=per_switch,
            )
            pb_grpc.DwNodeStub(channel).Assign(
                request, metadata=member_metadata(tls), timeout=timeout
            )
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details()  # type: ignore[attr-defined]
            where = f"DW node {number} at {address}"
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise errors.Unavailable(f"{where} does not answer: {details}") from None
            raise errors.InvalidArgument(f"{where} refused the view: {details}") from None
        finally:
            channel.close()


def start_node_processes(
    program: Program,
    nodes: int,
    base: Path,
    *,
    switches: int = 1,
    mode: str = "speculative",
    tls_dir: Path | None = None,
    per_switch: bool = False,
) -> list[Server]:
    """``nodes`` DW node processes on free local ports (stop them with ``Server.stop``)."""
    base.mkdir(parents=True, exist_ok=True)
    program_path = base / "program.m3"
    program_path.write_text(print_program(program))
    security = ["--tls-dir", str(tls_dir)] if tls_dir is not None else ["--insecure"]
    servers = []
    try:
        for number in range(nodes):
            server = Server(
                f"cumulus node {number}",
                [
                    "cumulus",
                    "node",
                    "--program",
                    str(program_path),
                    "--number",
                    str(number),
                    "--nodes",
                    str(nodes),
                    "--switches",
                    str(switches),
                    "--mode",
                    mode,
                    *(["--per-switch"] if per_switch else []),
                    *security,
                ],
                base / f"node-{number}.log",
                port=free_port(),
            )
            server.start()
            servers.append(server)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers
