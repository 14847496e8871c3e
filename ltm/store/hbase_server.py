"""A real Apache HBase on one machine, without Docker: ``aggview hbase start|stop``.

HBase's standalone mode runs the master, a region server and ZooKeeper in one JVM on the local
file system; its Thrift (thrift1) server, a second JVM, is what ``hbase://HOST:PORT`` talks to.
Both come as jars from Maven Central: ``hbase_pom.xml`` (beside this file) pins the release,
Maven resolves it once into a cache directory, and every later start reuses the jars.

Everything a running HBase writes stays under its directory: ``conf/`` (``hbase-site.xml`` with
free ports for ZooKeeper, the master and the region server), ``root/`` (the tables), ``zk/``,
``tmp/``, ``logs/`` and ``hbase.json`` (process ids and ports, what ``stop`` reads).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from aggview import errors
from aggview.processes import alive, free_port, log_tail

POM = Path(__file__).with_name("hbase_pom.xml")
SPLIT_TOOL = Path(__file__).with_name("hbase_tools") / "SplitTable.java"
HBASE_VERSION = "2.6.1"  # the one in hbase_pom.xml
STATE_FILE = "hbase.json"
START_TIMEOUT = 240.0
MASTER_CLASS = "org.apache.hadoop.hbase.master.HMaster"
THRIFT_CLASS = "org.apache.hadoop.hbase.thrift.ThriftServer"
# What HBase's own launcher passes a Java 17 JVM (bin/hbase): its code reaches into these.
JAVA_MODULE_FLAGS = [
    *(
        f"--add-opens=java.base/{package}=ALL-UNNAMED"
        for package in (
            "java.lang",
            "java.lang.reflect",
            "java.io",
            "java.nio",
            "sun.nio.ch",
            "java.util",
            "java.util.concurrent",
            "java.util.concurrent.atomic",
        )
    ),
    "--add-exports=java.base/jdk.internal.misc=ALL-UNNAMED",
    "-Dorg.apache.hbase.thirdparty.io.netty.tryReflectionSetAccessible=true",
]
# Every HBase JVM's flags but its heap: a standalone HBase serves development and tests (short
# runs, where the C1 compiler alone and the serial collector use far less CPU than C2 and G1).
# The HBase Docker image runs the same (agglauncher/docker_images.py).
JVM_FLAGS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", *JAVA_MODULE_FLAGS]
LOG4J = """\
log4j.rootLogger=INFO,file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=${hbase.log.file}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=%d{ISO8601} %-5p [%t] %c{2}: %m%n
"""


def cache_directory() -> Path:
    """Where the jars are kept: ``$AGGVIEW_HBASE_CACHE``, or ``aggview/hbase-<version>`` in the
    user's cache directory."""
    if os.environ.get("AGGVIEW_HBASE_CACHE"):
        return Path(os.environ["AGGVIEW_HBASE_CACHE"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "aggview" / f"hbase-{HBASE_VERSION}"


def _tool(name: str, purpose: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise errors.FailedPrecondition(
            f"a local HBase needs {name} ({purpose}); install it (Debian: apt-get install "
            f"{'openjdk-17-jre-headless' if name == 'java' else 'maven'}) and try again"
        )
    return found


def resolve_jars(cache: Path | None = None) -> list[Path]:
    """HBase's jars, resolved by Maven into ``cache/lib`` the first time and reused after.
    A lock keeps two starts from resolving at once; a marker file is written last, so a
    resolution cut short is done again."""
    cache = cache or cache_directory()
    lib, done = cache / "lib", cache / "resolved"
    if not done.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with (cache / "lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                _resolve(cache, lib)
                done.write_text(HBASE_VERSION + "\n")
    jars = sorted(lib.glob("*.jar"))
    if not jars:
        raise errors.FailedPrecondition(f"no HBase jars in {lib}: remove {done} to resolve again")
    return jars


def _resolve(cache: Path, lib: Path) -> None:
    mvn = _tool("mvn", "Maven resolves HBase's jars from Maven Central")
    shutil.rmtree(lib, ignore_errors=True)
    shutil.copyfile(POM, cache / "pom.xml")
    command = [
        mvn,
        "-B",
        "-q",
        "-f",
        str(cache / "pom.xml"),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={lib}",
        "-DincludeScope=runtime",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise errors.FailedPrecondition(
            f"Maven could not resolve HBase {HBASE_VERSION} ({' '.join(command)}):\n"
            + (done.stdout + done.stderr)[-3000:]
        )


@dataclass
class Ports:
    thrift: int
    zookeeper: int
    master: int
    regionserver: int


@dataclass
class Running:
    """What ``hbase.json`` records of a started HBase."""

    host: str
    ports: Ports
    master_pid: int
    thrift_pid: int
    version: str = HBASE_VERSION
    framed_port: int = 0  # a second, framed Thrift server (0: none)
    framed_pid: int = 0

    @property
    def url(self) -> str:
        return f"hbase://{self.host}:{self.ports.thrift}"

    @property
    def framed_url(self) -> str:
        return f"hbase://{self.host}:{self.framed_port}?transport=framed"


def site_properties(directory: Path, host: str, ports: Ports) -> dict[str, str]:
    """Standalone mode with every file under ``directory`` and every port chosen here."""
    return {
        "hbase.cluster.distributed": "false",
        "hbase.rootdir": (directory / "root").resolve().as_uri(),
        "hbase.tmp.dir": str(directory / "tmp"),
        "hbase.zookeeper.property.dataDir": str(directory / "zk"),
        "hbase.zookeeper.quorum": host,
        "hbase.zookeeper.property.clientPort": str(ports.zookeeper),
        "hbase.master.hostname": host,
        "hbase.regionserver.hostname": host,
        "hbase.master.port": str(ports.master),
        "hbase.regionserver.port": str(ports.regionserver),
        "hbase.master.info.port": "-1",
        "hbase.regionserver.info.port": "-1",
        "hbase.thrift.info.port": "-1",
        # the local file system cannot hflush; standalone HBase says so and must be told it may
        "hbase.unsafe.stream.capability.enforce": "false",
    }


def site_xml(directory: Path, host: str, ports: Ports) -> str:
    """``hbase-site.xml`` of :func:`site_properties`."""
    properties = "".join(
        f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>\n"
        for k, v in site_properties(directory, host, ports).items()
    )
    return f"<configuration>\n{properties}</configuration>\n"


def write_config(directory: Path, host: str, ports: Ports) -> Path:
    conf = directory / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "hbase-site.xml").write_text(site_xml(directory, host, ports))
    (conf / "log4j.properties").write_text(LOG4J)
    return conf


class StandaloneHBase:
    """One standalone HBase with its Thrift server, under ``directory``.

    ``start()`` returns once a real Thrift call succeeds; ``stop()`` stops both JVMs (the master
    by HBase's own shutdown, so the region server flushes its tables). The processes run in a
    session of their own: they outlive the command that started them until ``stop``."""

    def __init__(
        self,
        directory: Path,
        *,
        port: int = 9090,
        host: str = "127.0.0.1",
        heap: str = "768m",
        framed_port: int | None = None,
    ) -> None:
        self.directory = Path(directory).resolve()
        self.port = port
        # a second Thrift server in framed mode (its frame limit is real), for tests of it
        self.framed_port = framed_port
        self.host = host
        self.heap = heap

    # ------------------------------------------------------------------ state

    @property
    def state_path(self) -> Path:
        return self.directory / STATE_FILE

    def running(self) -> Running | None:
        """The recorded HBase if its processes are alive, else None."""
        try:
            data = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return None
        record = Running(**{**data, "ports": Ports(**data["ports"])})
        if any(alive(pid) and _runs_hbase(pid) for pid in (record.master_pid, record.thrift_pid)):
            return record
        return None

    # ------------------------------------------------------------------ start

    def start(self, timeout: float = START_TIMEOUT) -> Running:
        already = self.running()
        if already is not None:
            raise errors.AlreadyExists(
                f"an HBase already runs from {self.directory} ({already.url}); stop it first"
            )
        _tool("java", "HBase is a Java program: Java 17 or newer")
        resolve_jars()
        thrift_port = self.port or free_port()
        if not _port_free(self.host, thrift_port):
            raise errors.Unavailable(
                f"cannot start HBase's Thrift server: port {thrift_port} is taken"
            )
        ports = Ports(thrift_port, free_port(), free_port(), free_port())
        write_config(self.directory, self.host, ports)
        (self.directory / "logs").mkdir(exist_ok=True)
        (self.directory / "tmp").mkdir(exist_ok=True)
        master = self._launch("master", [MASTER_CLASS, "start"])
        thrift = self._launch("thrift", self._thrift_arguments(ports.thrift))
        record = Running(self.host, ports, master.pid, thrift.pid)
        processes = {"master": master, "thrift": thrift}
        if self.framed_port is not None:
            record.framed_port = self.framed_port or free_port()
            framed = self._launch(
                "thrift-framed", [*self._thrift_arguments(record.framed_port), "-f"]
            )
            record.framed_pid = framed.pid
            processes["thrift-framed"] = framed
        self.state_path.write_text(json.dumps(asdict(record), indent=2) + "\n")
        try:
            self._wait_ready(record, processes, timeout)
        except BaseException:
            self.stop(record, clean=False)
            raise
        return record

    def _java(self, role: str, arguments: list[str], heap: str = "256m") -> list[str]:
        """A JVM on HBase's jars and this directory's configuration, logging to logs/ROLE.log."""
        conf = self.directory / "conf"
        classpath = os.pathsep.join([str(conf), *map(str, resolve_jars())])
        return [
            _tool("java", "HBase is a Java program: Java 17 or newer"),
            f"-Xmx{heap}",
            *JVM_FLAGS,
            f"-Djava.io.tmpdir={self.directory / 'tmp'}",
            f"-Dlog4j.configuration={(conf / 'log4j.properties').as_uri()}",
            f"-Dhbase.log.file={self.directory / 'logs' / (role + '.log')}",
            "-cp",
            classpath,
            *arguments,
        ]

    def _launch(self, role: str, arguments: list[str]) -> subprocess.Popen[bytes]:
        command = self._java(role, arguments, heap=self.heap)
        with (self.directory / "logs" / f"{role}.out").open("ab") as out:
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                start_new_session=True,  # a Ctrl-C in the starting terminal does not reach it
            )

    def _thrift_arguments(self, port: int) -> list[str]:
        return [THRIFT_CLASS, "-p", str(port), "--bind", self.host, "start"]

    def restart_thrift(self, timeout: float = 60.0) -> Running:
        """Kills the Thrift server (as a crash would) and starts it again on the same port:
        every connection a client held is gone, HBase itself keeps running."""
        record = self.running()
        if record is None:
            raise errors.FailedPrecondition(f"no HBase runs from {self.directory}")
        _terminate(record.thrift_pid, grace=0)
        thrift = self._launch("thrift", self._thrift_arguments(record.ports.thrift))
        record.thrift_pid = thrift.pid
        self.state_path.write_text(json.dumps(asdict(record), indent=2) + "\n")
        self._wait_ready(record, {"thrift": thrift}, timeout)
        return record

    def split(self, hbase_table: str, key: bytes) -> None:
        """Splits ``hbase_table`` at ``key`` through HBase's Admin API (Thrift1 has no split
        call) and returns once the table has another region."""
        done = subprocess.run(
            self._java("split", [str(SPLIT_TOOL), hbase_table, key.hex()]),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if done.returncode != 0:
            raise errors.StoreError(
                f"splitting {hbase_table} at {key!r} failed: {(done.stdout + done.stderr)[-2000:]}"
            )

    def _wait_ready(
        self, record: Running, processes: dict[str, subprocess.Popen[bytes]], timeout: float
    ) -> None:
        """Until a Thrift call lists the tables (the master is up and serving), on every Thrift
        server started."""
        import happybase

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        servers = [(record.ports.thrift, "buffered")]
        if record.framed_port and "thrift-framed" in processes:
            servers.append((record.framed_port, "framed"))
        while time.monotonic() < deadline:
            for role, process in processes.items():
                if process.poll() is not None:
                    raise errors.Unavailable(
                        f"HBase's {role} exited at start (status {process.returncode}); "
                        f"{self.directory / 'logs' / (role + '.log')} ends with:\n"
                        + log_tail(self.directory / "logs" / f"{role}.log", 15)
                        + "\n"
                        + log_tail(self.directory / "logs" / f"{role}.out", 15)
                        + "\n"
                    )
            try:
                for port, transport in servers:
                    connection = happybase.Connection(
                        record.host, port, timeout=10_000, transport=transport
                    )
                    try:
                        connection.tables()
                    finally:
                        connection.close()
                return
            except Exception as exc:  # noqa: BLE001 - not up yet: try again until the deadline
                last = exc
                time.sleep(0.5)
        raise errors.Unavailable(
            f"HBase did not answer a Thrift call on {record.url} within {timeout:.0f} s "
            f"(last: {last}); see {self.directory / 'logs'}"
        )

    # ------------------------------------------------------------------ stop

    def stop(self, record: Running | None = None, *, clean: bool = True) -> bool:
        """Stops the Thrift server, then the master (HBase's own shutdown when ``clean``);
        whatever has not exited within a minute is killed. False if nothing ran."""
        record = record or self.running()
        if record is None:
            return False
        _terminate(record.thrift_pid, grace=15)
        if record.framed_pid:
            _terminate(record.framed_pid, grace=15)
        if clean and alive(record.master_pid):
            self._shutdown_master()
        _terminate(record.master_pid, grace=60 if clean else 5)
        with contextlib.suppress(OSError):
            self.state_path.unlink()
        return True

    def _shutdown_master(self) -> None:
        """``HMaster stop --shutDownCluster``: regions flushed, WAL closed, in seconds (a
        SIGTERM alone waits half a minute on its own ZooKeeper, already gone)."""
        command = self._java("stop", [MASTER_CLASS, "stop", "--shutDownCluster"])
        out_path = self.directory / "logs" / "stop.out"
        with out_path.open("ab") as out, contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=60,
                check=False,
            )


def _runs_hbase(pid: int) -> bool:
    """The pid is still one of HBase's JVMs (not a process that reused the number)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: trust the pid
    return MASTER_CLASS.encode() in command or THRIFT_CLASS.encode() in command


def _terminate(pid: int, grace: float) -> None:
    """SIGTERM, then SIGKILL if ``pid`` is still alive after ``grace`` seconds."""
    if not alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not alive(pid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    while alive(pid):
        time.sleep(0.05)


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True
