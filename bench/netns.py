"""Hosts as Linux network namespaces on a private bridge, and a member of a cluster per host.

One machine stands in for several: each host is a network namespace with its own address on a
bridge (10.77.K.I), so members talk over real addresses, not loopback, and a host can be cut off
(``ip link set … down``) as a machine whose cable is pulled. The bridge lives in a namespace of
its own, joined to the root namespace by a veth (with Docker's engine running, its firewall drops
bridged traffic through a bridge in the root namespace); clients run in the root namespace, at
10.77.K.254. A slow or cut link between two members goes through a detour: a namespace holding the
target's address on its loopback, which the source host routes that address to, and where a
proxy of this process (tests.chaos_proxy) listens and forwards to the real target, so no
firewall rule or ``tc`` is needed.

Every namespace, link and process is named after ``nmz<pid><letter>`` (15 characters at most for
a link) and removed by :meth:`Network.destroy`, and also by the next run (:func:`clean_stale`) if
the process that made them died first. Needs root and ``ip`` (iproute2).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aggview.processes import Server
from tests.chaos_proxy import ChaosProxy

PREFIX = "nmz"  # every name this module makes starts with it, then the owner's pid
_STALE = re.compile(rf"^{PREFIX}(\d+)[a-z]")
_CLONE_NEWNET = 0x40000000
_SERIAL = itertools.count()


def ip(*args: str, namespace: str | None = None, check: bool = True) -> str:
    """Runs ``ip`` (in ``namespace``); its output, or CalledProcessError naming stderr."""
    command = ["ip", *(["-n", namespace] if namespace else []), *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, command, done.stdout, done.stderr)
    return done.stdout


def unavailable() -> str:
    """Why hosts cannot be made here ('' if they can): not root, or no ``ip netns``."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no ip (iproute2) on PATH"
    probe = f"{PREFIX}{os.getpid()}z-probe"
    try:
        ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"ip netns add failed: {exc.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return ""


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _namespace_pids(namespace: str) -> list[int]:
    return [int(p) for p in ip("netns", "pids", namespace, check=False).split()]


def _delete_namespace(namespace: str) -> None:
    """Kills what still runs in it (only this module starts processes there), then deletes it
    (its links go with it)."""
    for pid in _namespace_pids(namespace):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
    ip("netns", "del", namespace, check=False)
    shutil.rmtree(f"/etc/netns/{namespace}", ignore_errors=True)


def clean_stale() -> list[str]:
    """Removes the namespaces and root links of earlier runs whose process is gone; their names."""
    removed = []
    for line in ip("netns", "list", check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        match = _STALE.match(name)
        if match and not _alive(int(match.group(1))):
            _delete_namespace(name)
            removed.append(name)
    for line in ip("-o", "link", "show", check=False).splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        match = _STALE.match(name)
        if match and not _alive(int(match.group(1))):
            ip("link", "del", name, check=False)
            removed.append(name)
    return removed


def _free_subnet(start: int) -> int:
    """A third octet K with nothing of 10.77.K.0/24 on this machine's root namespace."""
    used = ip("-4", "-o", "addr", "show", check=False) + ip("-4", "route", "show", check=False)
    for k in itertools.islice(itertools.cycle(range(1, 255)), start % 254, start % 254 + 254):
        if f"10.77.{k}." not in used:
            return k
    raise RuntimeError("no free 10.77.K.0/24 subnet")


def listening_socket_in(namespace: str, host: str, port: int) -> socket.socket:
    """A listening TCP socket made inside ``namespace`` (a socket keeps the namespace it was made
    in): a thread of ours enters it, makes the socket and ends; the rest of the process stays."""
    made: list[socket.socket | BaseException] = []

    def enter_and_listen() -> None:
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            with open(f"/var/run/netns/{namespace}") as handle:
                if libc.setns(handle.fileno(), _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {namespace}")
            made.append(socket.create_server((host, port)))
        except BaseException as exc:  # handed to the caller
            made.append(exc)

    thread = threading.Thread(target=enter_and_listen)
    thread.start()
    thread.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


class DetourProxy(ChaosProxy):
    """A ChaosProxy serving a socket made elsewhere (a detour namespace) instead of loopback."""

    def __init__(self, target: str, listening: socket.socket) -> None:
        super().__init__(target)
        self._listening = listening

    async def _start(self) -> None:
        self._open.set()
        self._server = await asyncio.start_server(self._handle, sock=self._listening)
        host, port = self._listening.getsockname()[:2]
        self.address = f"{host}:{port}"


@dataclass
class Network:
    """``hosts`` namespaces on a bridge in a namespace of its own, the root namespace on it too."""

    hosts: int
    name: str = ""
    subnet: int = 0  # K of 10.77.K.0/24; 0: a free one
    namespaces: list[str] = field(default_factory=list, init=False)
    root_link: str = field(default="", init=False)

    def __post_init__(self) -> None:
        letter = "abcdefghijklmnopqrstuvwxy"[next(_SERIAL) % 25]
        self.name = self.name or f"{PREFIX}{os.getpid()}{letter}"
        self.bridge_ns = f"{self.name}-br"
        self.root_link = f"{self.name}r"

    def host_ns(self, host: int) -> str:
        return f"{self.name}-h{host}"

    def ip_of(self, host: int) -> str:
        return f"10.77.{self.subnet}.{host + 1}"

    @property
    def root_ip(self) -> str:
        return f"10.77.{self.subnet}.254"

    def create(self) -> Network:
        clean_stale()
        self.subnet = self.subnet or _free_subnet(os.getpid())
        try:
            self._add_namespace(self.bridge_ns)
            ip("link", "add", "br0", "type", "bridge", namespace=self.bridge_ns)
            ip("link", "set", "br0", "up", namespace=self.bridge_ns)
            for host in range(self.hosts):
                self._plug(self.host_ns(host), f"h{host}", self.ip_of(host))
            ip(
                "link",
                "add",
                self.root_link,
                "type",
                "veth",
                "peer",
                "name",
                "root",
                "netns",
                self.bridge_ns,
            )
            ip("link", "set", "root", "master", "br0", "up", namespace=self.bridge_ns)
            ip("addr", "add", f"{self.root_ip}/24", "dev", self.root_link)
            ip("link", "set", self.root_link, "up")
        except BaseException:
            self.destroy()
            raise
        return self

    def _add_namespace(self, namespace: str) -> None:
        ip("netns", "add", namespace)
        self.namespaces.append(namespace)
        ip("link", "set", "lo", "up", namespace=namespace)

    def _plug(self, namespace: str, port: str, address: str) -> None:
        """A namespace with ``eth0`` at ``address``, its peer ``port`` on the bridge."""
        self._add_namespace(namespace)
        ip(
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            namespace,
            namespace=self.bridge_ns,
        )
        ip("link", "set", port, "master", "br0", "up", namespace=self.bridge_ns)
        ip("addr", "add", f"{address}/24", "dev", "eth0", namespace=namespace)
        ip("link", "set", "eth0", "up", namespace=namespace)

    def destroy(self) -> None:
        """Every namespace (and what runs in it) and the root link; safe to call twice."""
        for namespace in reversed(self.namespaces):
            _delete_namespace(namespace)
        self.namespaces.clear()
        ip("link", "del", self.root_link, check=False)

    # --- faults

    def cut(self, host: int) -> None:
        """The host's cable pulled: its bridge port down (it reaches nobody, nobody reaches it)."""
        ip("link", "set", f"h{host}", "down", namespace=self.bridge_ns)

    def heal(self, host: int) -> None:
        ip("link", "set", f"h{host}", "up", namespace=self.bridge_ns)

    def detour(self, source: int, target: int, ports: list[int]) -> list[DetourProxy]:
        """Routes ``source``'s traffic to ``target`` through proxies of this process (one per port
        of the target's): a namespace holds the target's address on its loopback (answering no
        ARP for it), the source routes that address there, and the proxies forward from the root
        namespace to the real target. Set a delay on them, or hold them, for a slow or cut link;
        connections the target opens to the source go straight."""
        namespace = f"{self.name}-d{source}{target}"
        gateway = f"10.77.{self.subnet}.{200 + 10 * source + target}"
        self._plug(namespace, f"d{source}{target}", gateway)
        for knob in ("all", "eth0"):
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    namespace,
                    "sysctl",
                    "-qw",
                    f"net.ipv4.conf.{knob}.arp_ignore=1",
                    f"net.ipv4.conf.{knob}.arp_announce=2",
                ],
                check=True,
            )
        ip("addr", "add", f"{self.ip_of(target)}/32", "dev", "lo", namespace=namespace)
        ip(
            "route",
            "add",
            f"{self.ip_of(target)}/32",
            "via",
            gateway,
            namespace=self.host_ns(source),
        )
        proxies = []
        for port in ports:
            listening = listening_socket_in(namespace, self.ip_of(target), port)
            proxies.append(DetourProxy(f"{self.ip_of(target)}:{port}", listening).start())
        return proxies


@dataclass
class HostCluster:
    """A member per host, started as a deployment starts them by hand (README "Run a cluster"):
    ``aggview ltm --store URL --log-dir DIR --partitions N --member I --member-address …
    --member-exchange … --host 10.77.K.I --port P --failover-after S --insecure``, member 0
    first with ``--take-lead``. The store is one embedded store file, shared as HBase would be
    (every member reaches it, also when cut off from the others)."""

    data: Path
    members: int = 3
    partitions: int = 3
    failover_after: float = 2.0
    checkpoint_interval: float = 1.0
    fsync: bool = True
    port: int = 7070
    exchange_port: int = 7071
    slow_pair: tuple[int, int] | None = None  # two members whose link goes through detours
    network: Network = field(init=False)
    servers: list[Server] = field(default_factory=list, init=False)
    detours: list[DetourProxy] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.network = Network(self.members)

    @property
    def store_url(self) -> str:
        return f"sqlite:///{(self.data / 'store.db').resolve()}"

    def address(self, member: int) -> str:
        return f"{self.network.ip_of(member)}:{self.port}"

    @property
    def client_address(self) -> str:
        return self.address(0)

    def log_path(self, member: int) -> Path:
        return self.data / "logs" / f"member-{member}.log"

    def start(self) -> HostCluster:
        self.data.mkdir(parents=True, exist_ok=True)
        try:
            self.network.create()
            if self.slow_pair is not None:
                a, b = self.slow_pair
                for source, target in ((a, b), (b, a)):
                    ports = [self.port, self.exchange_port]
                    self.detours += self.network.detour(source, target, ports)
            self.servers = [self._server(m) for m in range(self.members)]
            for m, server in enumerate(self.servers):
                server.start(once=["--take-lead"] if m == 0 else ())
        except BaseException:
            self.close()
            raise
        return self

    def _server(self, member: int) -> Server:
        net = self.network
        addresses = [
            *(arg for m in range(self.members) for arg in ("--member-address", self.address(m))),
            *(
                arg
                for m in range(self.members)
                for arg in ("--member-exchange", f"{net.ip_of(m)}:{self.exchange_port}")
            ),
        ]
        return Server(
            f"member-{member}",
            [
                "ltm",
                "--store",
                self.store_url,
                "--log-dir",
                str(self.data / f"member-{member}"),
                "--partitions",
                str(self.partitions),
                "--member",
                str(member),
                *addresses,
                "--exchange-port",
                str(self.exchange_port),
                "--checkpoint-interval",
                str(self.checkpoint_interval),
                "--failover-after",
                str(self.failover_after),
                "--host",
                net.ip_of(member),
                *([] if self.fsync else ["--no-fsync"]),
                "--insecure",
            ],
            self.log_path(member),
            port=self.port,
            flags=["-v"],
            prefix=["ip", "netns", "exec", net.host_ns(member)],
        )

    def close(self) -> None:
        """Stops every member (SIGTERM, then kill -9), the proxies, and removes the hosts."""
        try:
            for server in self.servers:
                if server.process is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(server.process.pid, signal.SIGCONT)
                server.signal_stop()
            for server in self.servers:
                server.wait_stopped(10)
            for proxy in self.detours:
                proxy.close()
        finally:
            self.network.destroy()

    def __enter__(self) -> HostCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def host_cluster(data: Path, **layout: object) -> Iterator[HostCluster]:
    """A started :class:`HostCluster` (``layout``: its fields), removed whatever happens."""
    cluster = HostCluster(data, **layout)  # type: ignore[arg-type]
    with cluster:
        yield cluster
