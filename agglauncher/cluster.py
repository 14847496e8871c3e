"""A local cluster of real processes over one data directory: by default one coordinating
member per core beyond the first, each hosting a share of the N partitions (``processes``: 1
runs the whole cluster in one process, 0 a coordinator and one process per LTM).

``aggview start`` runs one of these; the tests use it to kill -9 and restart single servers.
Layout of the data directory: ``store.db`` (the embedded store, shared), ``member-<m>/``
(a member's partition logs and decision log; in the separate layout ``ltm-<i>/`` and
``coordinator/``), ``logs/`` (each server's output).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggview import errors
from aggview.processes import CHECKOUT, Server, free_port, preload_servers
from aggview.security import token_for

LAYOUT_FILE = "layout.json"  # the layout of the last run, and whether it stopped cleanly


def default_processes(ltms: int, replicate: bool, cores: int | None = None) -> int:
    """One coordinating process per core beyond the first (so one on one or two cores), at
    most one per partition; copies of logs need two processes, so --replicate runs two on one
    core. The first core is left to what every member runs beside its loop (its log's flush
    thread, gRPC's threads) and to clients on the machine: on two cores a second member costs
    twice the CPU per transaction (messages between members, the clock) and carries less
    (docs/DECISIONS.md)."""
    processes = min(max(1, (cores or os.cpu_count() or 1) - 1), ltms)
    if replicate:
        return min(max(processes, 2), ltms)
    return processes


# What a member imports before it serves: a fork server holds them imported (aggview.processes)
MEMBER_MODULES = ("aggcli.cli", "coordinator.service", "coordinator.cumulus_hosts")
AS_START = -1  # LocalCluster(processes=AS_START): the layout ``aggview start`` runs


def checked_processes(ltms: int, processes: int | None, replicate: bool = False) -> int:
    """The ``--processes`` a local cluster runs (None: :func:`default_processes`), or
    InvalidArgument naming why it cannot."""
    if processes is None:
        return default_processes(ltms, replicate)
    if processes < 1:
        raise errors.InvalidArgument("--processes must be 1 or more")
    if replicate and min(processes, ltms) == 1:
        raise errors.InvalidArgument(
            "--replicate copies each process's logs to another process: it needs two or more "
            "(--processes 2 and more, and --ltms 2 or more)"
        )
    return processes


PROCESSES_HELP = (
    "the --ltms partitions in P processes that each coordinate transactions (1: the whole "
    "cluster in one process, no message between processes). Default: one per core beyond the "
    "first (one on two cores; at most --ltms; two with --replicate)"
)


@dataclass
class LocalCluster:
    data: Path
    ltms: int = 3
    port: int = 0
    fsync: bool = True
    checkpoint_interval: float = 2.0
    cache_rows: int = 1_000_000
    verbose: bool = False
    log_format: str = "text"  # or "json": every server's log lines (aggview.logformat)
    # Security: plaintext and no authentication unless tls_dir is given or secure is set (then
    # a development CA and tokens are made in data/tls on first start); see aggview.security.
    tls_dir: Path | None = None
    tokens: Path | None = None  # default: tls_dir / "tokens"
    secure: bool = False
    limits: dict[str, int] = field(default_factory=dict)  # coordinator --limit NAME=VALUE
    # Replicated LTM logs: LTM i's log is copied to LTM i+1, which takes partition i over
    # when LTM i is silent for failover_after seconds (see ltm.replication, coordinator.failover).
    replicate: bool = False
    failover_after: float = 2.0
    # Where the other members reach member m (default: its own address); tests put proxies
    # there.
    member_route: Callable[[int, str], str] | None = None
    # where each member serves framed TCP (set at start; none for an older checkout)
    exchange_addresses: list[str] = field(default_factory=list, init=False)
    servers: list[Server] = field(default_factory=list)
    # The shared store: "" is the embedded one in data/store.db; or hbase://HOST:PORT[?...].
    store: str = ""
    # P >= 2: P members that each host a share of the partitions and coordinate; 1: the
    # whole cluster in one process. Default (AS_START): ``default_processes``, as ``aggview
    # start`` runs it. 0: the layout of checkouts from before members (a coordinator and a
    # process per LTM), only to run such a ``code`` (benchmarks compare with it).
    processes: int = AS_START
    # The checkout the servers run (default: this one); benchmarks compare an older one.
    code: Path = CHECKOUT
    # Each member serves /metrics (``--metrics-port``): member m on metrics_port + m, or, with
    # 0, on a free port each (``Server.metrics_url`` says where); None: none does.
    metrics_port: int | None = None
    metrics: bool = True  # False: the members keep no metrics (``--no-metrics``)

    def __post_init__(self) -> None:
        if self.processes == AS_START:
            self.processes = default_processes(self.ltms, self.replicate)
        if self.processes == 0 and self.code == CHECKOUT:
            raise ValueError(
                "processes=0 (a coordinator over LTM processes) only runs an older checkout "
                "(code=...): this one has members only"
            )

    @property
    def store_url(self) -> str:
        return self.store or f"sqlite:///{(self.data / 'store.db').resolve()}"

    @property
    def coordinator(self) -> Server:
        """The process clients are pointed at: member 0 (an older checkout's coordinator)."""
        if self.processes == 0:
            return self.servers[-1]
        return self.servers[0]

    @property
    def address(self) -> str:
        return self.coordinator.address

    def member(self, index: int) -> Server:
        """A coordinating member (an older checkout's LTM ``index``)."""
        return self.servers[index]

    @property
    def tokens_path(self) -> Path | None:
        if self.tls_dir is None:
            return None
        return self.tokens or self.tls_dir / "tokens"

    def client_options(self, role: str = "admin") -> dict[str, Any]:
        """What ``Client(cluster.address, **options)`` needs: nothing when insecure, else the
        CA and the first token of ``role``."""
        if self.tls_dir is None:
            return {}
        assert self.tokens_path is not None
        return {"ca": self.tls_dir / "ca.pem", "token": token_for(self.tokens_path, role)}

    def _metrics_flags(self, member: int) -> list[str]:
        if not self.metrics:
            return ["--no-metrics"]
        if self.metrics_port is None:
            return []
        return ["--metrics-port", str(self.metrics_port + member if self.metrics_port else 0)]

    @property
    def metrics_urls(self) -> list[str]:
        """Each member's /metrics, in member order ('' for one that serves none)."""
        return [server.metrics_url for server in self.servers]

    def _security_flags(self) -> tuple[list[str], list[str]]:
        """Flags for the LTMs and for the coordinator."""
        if self.secure and self.tls_dir is None:
            from aggview.certs import make_certs  # cryptography: only when certificates are made

            self.tls_dir = self.data / "tls"
            if not (self.tls_dir / "ca.pem").exists():
                make_certs(self.tls_dir)
        if self.tls_dir is None:
            ltm = ["--insecure"]
            coordinator = ["--insecure"]
        else:
            ltm = ["--tls-dir", str(self.tls_dir)]
            coordinator = [*ltm, "--tokens", str(self.tokens_path)]
        for name, value in self.limits.items():
            coordinator += ["--limit", f"{name}={value}"]
        return ltm, coordinator

    def start(self) -> LocalCluster:
        self.data.mkdir(parents=True, exist_ok=True)
        if self.code == CHECKOUT:
            preload_servers(MEMBER_MODULES)
        self._claim_layout()
        coordinator_port = self.port or free_port()
        common = [] if self.fsync else ["--no-fsync"]
        ltm_security, coordinator_security = self._security_flags()
        if self.replicate and min(self.processes, self.ltms) == 1:
            raise ValueError("replication needs two or more processes to copy logs between")
        if self.processes >= 2:
            self._start_members(common, coordinator_security, coordinator_port)
        else:
            self._start_ltms_and_coordinator(
                common, ltm_security, coordinator_security, coordinator_port
            )
        return self

    def _start_ltms_and_coordinator(
        self, common: list[str], ltm_security: list[str], security: list[str], port: int
    ) -> None:
        """One process per LTM and a coordinator (an older checkout's layout), or with one
        process, one member holding every partition."""
        coordinator_address = f"127.0.0.1:{port}"
        # an older checkout's replicated LTMs each need the next one's address before it starts
        ports = [free_port() if self.replicate else 0 for _ in range(self.ltms)]
        for i in range(self.ltms if self.processes != 1 else 0):
            self.servers.append(
                self._ltm_server(i, ports, coordinator_address, [*common, *ltm_security])
            )
        try:
            for server in self.servers:
                server.start()
            coordinator = self._coordinator_server([*common, *security], port)
            self.servers.append(coordinator)
            coordinator.start()
        except BaseException:
            self.stop()
            raise

    def _ltm_server(
        self, i: int, ports: list[int], coordinator_address: str, extra: list[str]
    ) -> Server:
        """LTM ``i`` of an older checkout's layout (not started)."""
        backup = (
            ["--backup", f"127.0.0.1:{ports[(i + 1) % self.ltms]}"]
            if self.replicate and self.ltms > 1
            else []
        )
        return self._server(
            f"ltm-{i}",
            [
                "ltm",
                "--store",
                self.store_url,
                "--log-dir",
                str(self.data / f"ltm-{i}"),
                "--partition",
                str(i),
                "--partitions",
                str(self.ltms),
                "--coordinator",
                coordinator_address,
                *self._participant_flags(),
                *backup,
                *extra,
            ],
            ports[i],
        )

    def _server(self, name: str, args: list[str], port: int) -> Server:
        """A server process named ``name`` (not started): its log under the data directory's
        ``logs``, the logging flags and the code every server of this cluster runs."""
        return Server(
            name,
            args,
            self.data / "logs" / f"{name}.log",
            port=port,
            flags=self._log_flags(),
            code=self.code,
        )

    def _participant_flags(self) -> list[str]:
        """The flags of a process that holds partitions: how often it checkpoints, how many
        rows it caches."""
        return [
            "--checkpoint-interval",
            str(self.checkpoint_interval),
            "--cache-rows",
            str(self.cache_rows),
        ]

    def _route(self, member: int, address: str) -> str:
        """Where the others reach ``member`` at ``address`` (``member_route``, if set)."""
        return self.member_route(member, address) if self.member_route else address

    def _framed(self) -> bool:
        """Whether the servers serve framed TCP (older code, run by benchmarks, has only
        gRPC)."""
        return (self.code / "aggview" / "frames.py").exists()

    def _framed_flags(self, port: int) -> list[str]:
        """A member alone serves clients' transactions on framed TCP too: its address and its
        framed port, as one member of one."""
        if not self._framed():
            return []
        exchange = free_port()
        self.exchange_addresses = [f"127.0.0.1:{exchange}"]
        return [
            "--member-address",
            self._route(0, f"127.0.0.1:{port}"),
            "--member-exchange",
            self._route(0, self.exchange_addresses[0]),
            "--exchange-port",
            str(exchange),
        ]

    def _log_flags(self) -> list[str]:
        """The command-line flags every server gets for its logging (none by default: an older
        checkout, which a benchmark may run, knows no --log-format)."""
        flags = ["-v"] if self.verbose else []
        return flags + (["--log-format", "json"] if self.log_format == "json" else [])

    def _coordinator_server(self, extra: list[str], port: int) -> Server:
        """The coordinator over the LTMs started so far, or with one process, the one member
        holding every partition (not started)."""
        addresses = [self._route(i, server.address) for i, server in enumerate(self.servers)]
        role = ["coordinator", *(arg for a in addresses for arg in ("--ltm", a))]
        if self.processes == 1:  # one coordinating LTM alone: every partition in it
            role = [
                "ltm",
                "--partitions",
                str(self.ltms),
                *self._participant_flags(),
                *self._metrics_flags(0),
                *self._framed_flags(port),
            ]
        return self._server(
            "coordinator",
            [
                *role,
                "--store",
                self.store_url,
                "--log-dir",
                str(self.data / "coordinator"),
                *(["--failover-after", str(self.failover_after)] if self.replicate else []),
                *extra,
            ],
            port,
        )

    def _start_members(self, common: list[str], security: list[str], port: int) -> None:
        """P members over the partitions; member 0 (the clock, the catalog) starts first."""
        members = min(self.processes, self.ltms)
        ports = [port, *(free_port() for _ in range(members - 1))]
        # the members' streams on framed TCP
        exchange_ports = [free_port() for _ in range(members)] if self._framed() else []
        self.exchange_addresses = [f"127.0.0.1:{p}" for p in exchange_ports]
        addresses = [
            arg
            for m, p in enumerate(ports)
            for arg in ("--member-address", self._route(m, f"127.0.0.1:{p}"))
        ] + [
            arg
            for m, p in enumerate(exchange_ports)
            for arg in ("--member-exchange", self._route(m, f"127.0.0.1:{p}"))
        ]
        for m in range(members):
            self.servers.append(
                self._server(
                    f"member-{m}",
                    [
                        "ltm",
                        "--store",
                        self.store_url,
                        "--log-dir",
                        str(self.data / f"member-{m}"),
                        "--partitions",
                        str(self.ltms),
                        "--member",
                        str(m),
                        *addresses,
                        *(["--exchange-port", str(exchange_ports[m])] if exchange_ports else []),
                        *self._participant_flags(),
                        *(["--failover-after", str(self.failover_after)] if self.replicate else []),
                        *self._metrics_flags(m),
                        *common,
                        *security,
                    ],
                    ports[m],
                )
            )
        # Every member starts: member 0 leads, whoever led before (an older checkout, which
        # a benchmark may run, has no leadership record).
        knows_leads = (self.code / "coordinator" / "leadership.py").exists()
        lead = ["--take-lead"] if self.replicate and knows_leads else []
        try:
            for m, server in enumerate(self.servers):
                server.start(once=lead if m == 0 else ())
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 20.0) -> None:
        """Coordinator first, so no new transaction reaches an LTM that is going away; then
        the LTMs together (each checkpoints), so stopping takes at most twice ``timeout``."""
        # members together (they checkpoint their partitions), as LTMs are
        ltms = [s for s in self.servers if s.role.startswith(("ltm", "member"))]
        for server in [s for s in self.servers if s not in ltms]:
            server.stop(timeout)
        for server in ltms:
            server.signal_stop()
        for server in ltms:
            server.wait_stopped(timeout)
        if self.servers and all(
            s.process is not None and s.process.returncode == 0 for s in self.servers
        ):
            self._write_layout(clean=True)  # every partition checkpointed its log

    # Each layout keeps its partitions' logs in its own directories (ltm-I; coordinator/
    # member or partitions; member-M/member or partitions), so a start in another layout
    # would not replay what the last run logged and did not checkpoint: acknowledged writes
    # would seem lost, and come back over newer ones when the old layout ran again. A layout
    # changes only after a clean stop, when every log is checkpointed.

    def _claim_layout(self) -> None:
        previous, clean = self._last_layout()
        if previous is not None and previous != self.processes and not clean:
            raise errors.FailedPrecondition(
                f"{self.data} was last run with --processes {previous} and did not stop "
                f"cleanly: its logs hold writes that layout replays. Start it with --processes "
                f"{previous} and stop it (Ctrl-C) before changing to --processes "
                f"{self.processes}"
            )
        self._write_layout(clean=False)

    def _last_layout(self) -> tuple[int | None, bool]:
        """The layout of the last run and whether it stopped cleanly; for a directory from
        before the record, the layout its directories show (not known to be clean)."""
        record = self.data / LAYOUT_FILE
        if record.exists():
            last = json.loads(record.read_text())
            return int(last["processes"]), bool(last["clean"])
        if (self.data / "ltm-0").is_dir():
            return 0, False
        if any((self.data / "coordinator" / d).is_dir() for d in ("partitions", "member")):
            return 1, False
        members = len(
            {p.parent for d in ("partitions", "member") for p in self.data.glob(f"member-*/{d}")}
        )
        return (members, False) if members >= 2 else (None, False)

    def _write_layout(self, clean: bool) -> None:
        record = self.data / LAYOUT_FILE
        record.write_text(json.dumps({"processes": self.processes, "clean": clean}) + "\n")

    def kill(self) -> None:
        for server in self.servers:
            server.kill()

    def dump_stacks(self) -> list[Path]:
        """``kill -USR1`` of every running server: each writes where its tasks wait to its
        log, whose paths this returns."""
        logs = []
        for server in self.servers:
            if server.running():
                assert server.process is not None
                server.process.send_signal(signal.SIGUSR1)
                logs.append(server.log_path)
        return logs

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def exit_status(code: int | None) -> str:
    """A process's return code in words: ``status 1``, ``killed by SIGKILL``."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"status {code}"


@dataclass
class Restarts:
    """Brings the dead servers of a running cluster back, each on its own data (its logs
    replay what it had not checkpointed), so one crash never stops the others. A server
    that fails to start, or dies again soon, is retried after a delay that doubles up to
    ``longest``: a cause that lasts (a port taken, a full disk) costs a line a while, not
    a busy loop, and the cluster serves on with what runs."""

    servers: Sequence[Server]
    say: Callable[[str], None]
    first: float = 0.5
    longest: float = 30.0
    settled: float = 30.0  # a server that ran this long and dies is restarted at once
    _due: dict[str, float] = field(default_factory=dict)
    _delay: dict[str, float] = field(default_factory=dict)
    _started: dict[str, float] = field(default_factory=dict)

    def tend(self) -> None:
        """Restarts each dead server whose delay has passed (a start waits for it to listen)."""
        for server in self.servers:
            if not server.running():
                self._revive(server)

    def _revive(self, server: Server) -> None:
        role, now = server.role, time.monotonic()
        if role not in self._due:  # just found dead
            if now - self._started.get(role, -self.settled) >= self.settled:
                self._delay[role] = 0.0
            self._due[role] = now + self._delay.get(role, 0.0)
            code = server.process.returncode if server.process is not None else None
            self.say(
                f"{role} exited ({exit_status(code)}); restarting it on its data"
                f"{_after(self._delay[role])}; its log: {server.log_path}"
            )
        if now < self._due[role]:
            return
        delay = min(max(self.first, 2 * self._delay.get(role, 0.0)), self.longest)
        self._delay[role] = delay
        try:
            server.start()
        except RuntimeError as exc:
            self._due[role] = time.monotonic() + delay
            reason = str(exc).splitlines()[0]
            self.say(f"{reason}; trying again{_after(delay)}; see {server.log_path}")
            return
        del self._due[role]
        self._started[role] = time.monotonic()
        self.say(f"{role} restarted, listening on {server.address}")


def _after(delay: float) -> str:
    return f" in {delay:g} s" if delay else ""
