"""Docker images of aggview and of HBase built on this machine, with or without an image
registry (``aggview docker build``); and a Docker engine found, or started as root (the tests,
CI).

Offline (the default) the base image is Debian bookworm made here from Debian's packages
(``debootstrap --variant=minbase``, then ``docker import``), tagged :data:`BASE_IMAGE` and
built once; ``--base debian:bookworm-slim`` takes Debian's image from a registry instead. On
that base: :data:`AGGVIEW_IMAGE` (``docker/Dockerfile``: Debian's python3, ``pip install`` of
the checkout) and :data:`HBASE_IMAGE` (``docker/hbase.Dockerfile``: Debian's JRE 17 and the
jars ``aggview hbase start`` resolves with Maven, copied into the build context, run as
``aggview hbase start`` runs them). Every build is ``docker build`` on a context staged here
with only what its Dockerfile copies: Docker's layer cache makes a build of unchanged sources
take seconds.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from aggview import errors
from aggview.processes import log_tail
from ltm.store.hbase_server import (
    HBASE_VERSION,
    JVM_FLAGS,
    MASTER_CLASS,
    THRIFT_CLASS,
    Ports,
    resolve_jars,
    site_xml,
)

BASE_IMAGE = "aggview-debian:bookworm"
ONLINE_BASE = "debian:bookworm-slim"
AGGVIEW_IMAGE = "aggview:latest"
HBASE_IMAGE = f"aggview-hbase:{HBASE_VERSION}"
SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# This machine's own trust anchors beyond Debian's (a TLS-inspecting egress, say): the offline
# base carries them, so that pip in a build reaches PyPI the way this machine does.
EXTRA_CAS = Path("/usr/local/share/ca-certificates")
# Inside the HBase container: its files under /data (a volume), every port fixed.
HBASE_DATA = Path("/data")
HBASE_PORTS = Ports(thrift=9090, zookeeper=2181, master=16000, regionserver=16020)
HBASE_HOME = "/opt/hbase"
# dockerd's output, when started here
DOCKERD_LOG = Path(tempfile.gettempdir()) / "aggview-dockerd.log"
CONSOLE_LOG4J = """\
log4j.rootLogger=INFO,console
log4j.appender.console=org.apache.log4j.ConsoleAppender
log4j.appender.console.target=System.err
log4j.appender.console.layout=org.apache.log4j.PatternLayout
log4j.appender.console.layout.ConversionPattern=%d{ISO8601} %-5p [%t] %c{2}: %m%n
log4j.logger.org.apache.zookeeper=WARN
log4j.logger.org.apache.hadoop.hbase.zookeeper=WARN
"""


class DockerUnavailable(errors.FailedPrecondition):
    """No Docker engine here, or an image could not be built: the message says why."""


# ---------------------------------------------------------------------------- the engine


def engine_problem() -> str | None:
    """None when a Docker engine answers ``docker info``, else why not."""
    docker = shutil.which("docker")
    if docker is None:
        return "no docker command on PATH"
    try:
        done = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 30 s"
    if done.returncode == 0:
        return None
    said = (done.stderr or done.stdout).strip().splitlines()
    return f"no Docker engine answers `docker info` ({said[-1] if said else done.returncode})"


@dataclass
class Engine:
    """A Docker engine that answers; ``started`` is the dockerd this process started (None:
    one ran already), which :meth:`stop` ends."""

    started: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def stop(self, grace: float = 30.0) -> None:
        process, self.started = self.started, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)  # dockerd stops its containers and containerd
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def can_start_engine() -> str | None:
    """None where this process may start dockerd (root, Linux), else why not."""
    if sys.platform != "linux":
        return f"starting a Docker engine needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "starting a Docker engine needs root"
    return None


def apt_install(*packages: str) -> None:
    """``apt-get install`` of Debian's ``packages`` (as root), or DockerUnavailable saying why
    not."""
    apt = shutil.which("apt-get")
    if apt is None:
        raise DockerUnavailable(f"installing {' '.join(packages)} needs apt-get (not found)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in ([apt, "update", "-qq"], [apt, "install", "-y", "-qq", *packages]):
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=1800, check=False
        )
        if done.returncode != 0:
            raise DockerUnavailable(
                f"{' '.join(command)} failed (status {done.returncode}):\n"
                + (done.stdout + done.stderr)[-2000:]
            )


def ensure_engine(*, log: Path, install: bool = False, timeout: float = 60.0) -> Engine:
    """A Docker engine that answers: the one running, or dockerd started here (root, Linux;
    Debian's docker.io installed first when ``install``), its output in ``log``. Raises
    DockerUnavailable naming why none can run, with the end of dockerd's log if it failed."""
    problem = engine_problem()
    if problem is None:
        return Engine()
    refused = can_start_engine()
    if refused is not None:
        raise DockerUnavailable(f"{problem}; {refused}")
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        if not install:
            raise DockerUnavailable(f"{problem}; dockerd is not installed (Debian: docker.io)")
        apt_install("docker.io")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        # dockerd picks its storage driver (overlay2 where the kernel has it) and starts its
        # own containerd, which stops with it
        process = subprocess.Popen(
            [shutil.which("dockerd") or "dockerd"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    engine = Engine(process, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DockerUnavailable(
                f"dockerd exited at start (status {process.returncode}); {log} ends with:\n"
                + log_tail(log, 15)
            )
        if engine_problem() is None:
            return engine
        time.sleep(0.5)
    engine.stop(grace=10)
    raise DockerUnavailable(
        f"dockerd did not answer within {timeout:.0f} s; {log} ends with:\n" + log_tail(log, 15)
    )


def compose_cli() -> list[str] | None:
    """``docker compose`` (the plugin) where it answers, else ``docker-compose`` (Debian's
    1.29), else None."""
    docker = shutil.which("docker")
    if docker is not None:
        version = subprocess.run(
            [docker, "compose", "version"], capture_output=True, timeout=60, check=False
        )
        if version.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy is not None else None


def ensure_compose(*, install: bool = False) -> list[str]:
    """A compose CLI for ``docker/compose.yaml``: the one there, or Debian's docker-compose
    installed when ``install`` (as root); DockerUnavailable saying why not."""
    cli = compose_cli()
    if cli is None and install:
        apt_install("docker-compose")
        cli = compose_cli()
    if cli is None:
        raise DockerUnavailable(
            "no `docker compose` (plugin) or `docker-compose` CLI installed "
            "(Debian: docker-compose)"
        )
    return cli


# ---------------------------------------------------------------------------- images


def image_exists(tag: str) -> bool:
    done = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", tag],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return done.returncode == 0


def debian_mirror(apt: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this machine's apt uses for bookworm (sources.list and
    sources.list.d, one-line or deb822), else deb.debian.org."""
    files = [apt / "sources.list", *sorted((apt / "sources.list.d").glob("*"))]
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            fields = line.split("#", 1)[0].split()
            if fields[:1] == ["deb"]:
                rest = [f for f in fields[1:] if not f.startswith("[")]
                if len(rest) >= 2 and rest[1] == SUITE:
                    return rest[0].rstrip("/")
        for stanza in re.split(r"\n\s*\n", text):
            fields = dict(
                (key.strip(), value.strip())
                for key, sep, value in (
                    line.partition(":")
                    for line in stanza.splitlines()
                    if not line.lstrip().startswith("#")
                )
                if sep
            )
            if SUITE in fields.get("Suites", "").split() and "deb" in fields.get("Types", ""):
                return fields.get("URIs", DEFAULT_MIRROR).split()[0].rstrip("/")
    return DEFAULT_MIRROR


def _run(command: list[str], what: str, output: TextIO | None, timeout: float, **kw: object):
    """Runs a build step; its output goes to ``output`` (or is kept for the error)."""
    started = time.monotonic()
    done = subprocess.run(
        command,
        stdout=output if output is not None else subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
        **kw,  # type: ignore[arg-type]
    )
    if done.returncode != 0:
        raise DockerUnavailable(
            f"{what} failed (status {done.returncode}): {shlex.join(command)}"
            + (f"\n{done.stdout[-3000:]}" if done.stdout else "")
        )
    return time.monotonic() - started


def build_base(
    tag: str = BASE_IMAGE,
    *,
    mirror: str | None = None,
    install: bool = False,
    output: TextIO | None = None,
) -> bool:
    """Debian bookworm from Debian's packages, imported as ``tag``, unless ``tag`` exists.
    True if built."""
    if image_exists(tag):
        return False
    if os.geteuid() != 0:
        raise DockerUnavailable("debootstrap (the offline base image) needs root")
    if shutil.which("debootstrap") is None:
        if not install:
            raise DockerUnavailable("the offline base image needs debootstrap (Debian package)")
        apt_install("debootstrap")
    mirror = mirror or debian_mirror()
    with tempfile.TemporaryDirectory(prefix="aggview-rootfs-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _run(
            ["debootstrap", "--variant=minbase", SUITE, str(rootfs), mirror],
            f"debootstrap of Debian {SUITE} from {mirror}",
            output,
            timeout=1800,
        )
        cas = rootfs / EXTRA_CAS.relative_to("/")
        cas.mkdir(parents=True, exist_ok=True)
        for ca in sorted(EXTRA_CAS.glob("*.crt")) if EXTRA_CAS.is_dir() else []:
            shutil.copyfile(ca, cas / ca.name)
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for leftover in (rootfs / cache).glob("*"):
                if leftover.is_file():
                    leftover.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            _run(
                ["docker", "import", "--change", 'CMD ["bash"]', "-", tag],
                f"docker import of the Debian {SUITE} root file system",
                output,
                timeout=600,
                stdin=tar.stdout,
            )
        finally:
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait()
    return True


def default_source() -> Path:
    """The checkout this aggview runs from (its ``docker/Dockerfile``)."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "docker" / "Dockerfile").is_file():
        raise errors.InvalidArgument(
            f"{root} is not a checkout of aggview (no docker/Dockerfile): give --source"
        )
    return root


def _copy(source: Path, target: Path) -> None:
    """A copy whose modes are 644 or 755 whatever the checkout's umask: Docker's layer cache
    compares file modes too, so the same sources always hit it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(
            source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
        )
    else:
        shutil.copy2(source, target)
    for path in [target, *target.rglob("*")]:
        executable = path.is_dir() or path.stat().st_mode & stat.S_IXUSR
        path.chmod(0o755 if executable else 0o644)


def stage_aggview_context(source: Path, into: Path) -> Path:
    """Only what ``docker/Dockerfile`` copies (no caches, no data): its COPY sources and the
    Dockerfile itself, at their paths in the checkout. Returns the staged Dockerfile."""
    dockerfile = source / "docker" / "Dockerfile"
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--") for w in words):
            for name in words[1:-1]:
                _copy(source / name, into / name)
    _copy(dockerfile, into / "docker" / "Dockerfile")
    return into / "docker" / "Dockerfile"


def build_aggview(
    source: Path, *, base: str, tag: str = AGGVIEW_IMAGE, output: TextIO | None = None
) -> float:
    """``docker/Dockerfile`` of ``source`` FROM ``base`` as ``tag``; returns its seconds."""
    with tempfile.TemporaryDirectory(prefix="aggview-context-") as tmp:
        dockerfile = stage_aggview_context(source, Path(tmp))
        command = ["docker", "build", "-f", str(dockerfile), "--build-arg", f"BASE_IMAGE={base}"]
        return _run([*command, "-t", tag, tmp], f"docker build of {tag}", output, timeout=3600)


def hbase_entrypoint() -> str:
    """The HBase image's command: the master (with its region server and ZooKeeper) and the
    Thrift server, as ``aggview hbase start`` runs them; the container ends when either does."""
    jvm = [
        "java",
        *JVM_FLAGS,
        f"-Djava.io.tmpdir={HBASE_DATA / 'tmp'}",
        f"-Dlog4j.configuration=file:{HBASE_HOME}/conf/log4j.properties",
        "-cp",
        f"{HBASE_HOME}/conf:{HBASE_HOME}/lib/*",
    ]
    thrift = [THRIFT_CLASS, "-p", str(HBASE_PORTS.thrift), "--bind", "0.0.0.0", "start"]
    return (
        "#!/bin/bash\n"
        f"# HBase {HBASE_VERSION} standalone and its Thrift server, made by\n"
        "# aggcli/docker_images.py from ltm/store/hbase_server.py: the JVM flags and the\n"
        "# configuration of `aggview hbase start`\n"
        "set -u\n"
        f"mkdir -p {HBASE_DATA / 'tmp'}\n"
        f"jvm=({shlex.join(jvm)})\n"
        f'"${{jvm[@]}}" "-Xmx${{HBASE_HEAP:-768m}}" {MASTER_CLASS} start &\n'
        f'"${{jvm[@]}}" "-Xmx${{THRIFT_HEAP:-256m}}" {shlex.join(thrift)} &\n'
        "trap 'kill -TERM $(jobs -p) 2>/dev/null' TERM INT\n"
        "wait -n\n"
        "status=$?\n"
        "kill -TERM $(jobs -p) 2>/dev/null\n"
        "wait\n"
        'exit "$status"\n'
    )


def stage_hbase_context(source: Path, into: Path, jars: list[Path]) -> Path:
    """The jars (hard links where they can be), conf/ and the entrypoint; returns the staged
    Dockerfile."""
    lib = into / "lib"
    lib.mkdir(parents=True)
    for jar in jars:
        try:
            os.link(jar, lib / jar.name)
        except OSError:
            shutil.copyfile(jar, lib / jar.name)
    conf = into / "conf"
    conf.mkdir()
    (conf / "hbase-site.xml").write_text(site_xml(HBASE_DATA, "127.0.0.1", HBASE_PORTS))
    (conf / "log4j.properties").write_text(CONSOLE_LOG4J)
    entrypoint = into / "hbase-entrypoint.sh"
    entrypoint.write_text(hbase_entrypoint())
    entrypoint.chmod(0o755)
    _copy(source / "docker" / "hbase.Dockerfile", into / "Dockerfile")
    return into / "Dockerfile"


def build_hbase(
    source: Path, *, base: str, tag: str = HBASE_IMAGE, output: TextIO | None = None
) -> float:
    """``docker/hbase.Dockerfile`` FROM ``base`` with the pinned jars, as ``tag``."""
    jars = resolve_jars()  # Maven, once per machine (the cache of `aggview hbase start`)
    cache = jars[0].parent.parent  # the same file system: the jars are hard-linked
    with tempfile.TemporaryDirectory(prefix="aggview-hbase-context-", dir=cache) as tmp:
        dockerfile = stage_hbase_context(source, Path(tmp), jars)
        command = ["docker", "build", "-f", str(dockerfile), "--build-arg", f"BASE_IMAGE={base}"]
        return _run([*command, "-t", tag, tmp], f"docker build of {tag}", output, timeout=3600)


@dataclass
class Built:
    """What :func:`build_images` did, in seconds (base: 0 when it existed)."""

    base: float
    aggview: float
    hbase: float


def build_images(
    source: Path | None = None,
    *,
    base: str | None = None,
    mirror: str | None = None,
    install: bool = False,
    output: TextIO | None = None,
) -> Built:
    """The base (offline: made here once; ``base`` names another, such as
    :data:`ONLINE_BASE`), then the aggview and HBase images on it."""
    source = source or default_source()
    problem = engine_problem()
    if problem is not None:
        raise DockerUnavailable(problem)
    started = time.monotonic()
    if base is None:
        base = BASE_IMAGE
        build_base(base, mirror=mirror, install=install, output=output)
    elif not image_exists(base):
        _run(["docker", "pull", base], f"docker pull of {base}", output, timeout=1800)
    base_seconds = time.monotonic() - started
    return Built(
        base_seconds,
        build_aggview(source, base=base, output=output),
        build_hbase(source, base=base, output=output),
    )
