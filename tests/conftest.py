"""Shared fixtures: a real local cluster (separate processes, free ports) per test session."""

from __future__ import annotations

import compileall
import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import settings
from lookup_check import lookup_mismatches
from profiles import PROFILE

from aggclient import Client
from agglauncher.cluster import LocalCluster
from aggview.processes import PORT_RANGE, process_tree_cpu_seconds

# Every cluster a test starts checks each answer of the coordinator's lookup cache against the
# LTMs; a difference anywhere fails the session (see pytest_sessionfinish).
os.environ.setdefault("AGGVIEW_LOOKUP_CACHE_CHECK", "1")
# The suite's Spark jobs read a few hundred rows each: two shuffle partitions (the local
# master's two cores) and expressions interpreted instead of compiled to Java (whole-stage
# code generation compiles each query's code with Janino, more CPU than these rows ever cost)
# take about a quarter off the Spark files' CPU; the results are Spark's either way.
os.environ.setdefault(
    "AGGVIEW_SPARK_CONF",
    "spark.sql.shuffle.partitions=2,spark.default.parallelism=2,"
    "spark.sql.codegen.wholeStage=false,spark.sql.codegen.factoryMode=NO_CODEGEN",
)
# duckdb, the oracle, answers statements over a few hundred rows: its default pool of one
# thread per core costs a fifth more CPU per statement than one thread (measured) and competes
# with the other workers for the 2 cores, so every connection the tests open has one thread
# unless it asks for more.
_duckdb_connect = duckdb.connect


def _one_thread_duckdb(
    database: str = ":memory:", read_only: bool = False, config: dict | None = None, **kwargs: Any
) -> Any:
    return _duckdb_connect(database, read_only, {"threads": 1, **(config or {})}, **kwargs)


duckdb.connect = _one_thread_duckdb
# Property tests: ``ci`` (the default) or ``thorough`` (HYPOTHESIS_PROFILE; see profiles.py).
settings.register_profile("ci", settings())
settings.register_profile("thorough", settings(max_examples=500))
settings.load_profile(PROFILE)
# The layout (LocalCluster.processes) of the session cluster and of ``own_cluster``'s: 1, the
# whole cluster in one process; P >= 2, P coordinating members; -1 (AS_START), as ``aggview
# start`` runs it. Default 2: members that message each other, the layout of machines over two
# cores (on two, ``aggview start`` runs one process, which the clusters tests start without a
# layout run).
PROCESSES = int(os.environ.get("AGGVIEW_TEST_PROCESSES", 2))


def _port_slice() -> None:
    """Each xdist worker (``gwN`` of ``PYTEST_XDIST_WORKER_COUNT``) hands out ports from its
    own slice of the range, in its servers and in every process it starts (the environment)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker.startswith("gw") and count > 1:
        low, high = PORT_RANGE
        size = (high - low) // count
        start = low + int(worker[2:]) * size
        os.environ["AGGVIEW_PORTS"] = f"{start}-{start + size}"


_port_slice()


# The longest files first: pytest-xdist (``--dist loadfile --no-loadscope-reorder``, see
# pyproject.toml) hands out files in collection order, so a long one started last would hold the
# run's end alone. (Without ``--no-loadscope-reorder`` xdist orders files by their number of
# tests, which put the one-test nemesis file last.)
LONGEST_FIRST = (  # by wall time on a quiet CI run (AGGVIEW_TEST_CPU's third column)
    "test_real_hbase.py",
    "test_ownership.py",  # short, but next to the other user of the real HBase (HBASE_FILES)
    "test_spark.py",
    "test_tpcw.py",
    "test_failpoints.py",
    # Docker (when an engine runs): mostly waiting on HBase and compose, early so that it
    # overlaps the others' work instead of ending the run
    "test_docker_compose.py",
    "test_hbase_containers.py",
    "test_failover.py",
    "test_cumulus_grpc.py",
    "test_lookup_cache.py",
    "test_spark_views.py",
    "test_members.py",
    "test_nemesis.py",
    "test_cli.py",
    "test_cumulus_views.py",
    "test_cumulus_spark.py",
    "test_views.py",
    "test_crash.py",
    "test_demo.py",
    "test_m3_differential.py",
    "test_dashboard_bench.py",
    "test_leader_failover.py",
)


# The files that start a Spark session (the ``spark`` fixture, one JVM per worker that runs
# any of them), in two groups of about equal wall time: each group goes to one worker as one
# unit, so two JVMs start instead of one per worker (a start costs about 12 CPU-s, and four
# starting together at the run's beginning starved everything else). The files that start the
# real HBase (the session's ``real_hbase``, another JVM: about 14 CPU-s) go with them.
SPARK_GROUPS = {
    "test_real_hbase.py": "spark-a",
    "test_ownership.py": "spark-a",
    "test_spark_views.py": "spark-a",
    "test_m3_spark.py": "spark-a",
    "test_spark_hbase.py": "spark-a",
    "test_tpcw.py": "spark-b",
    "test_spark.py": "spark-b",
    "test_cumulus_spark.py": "spark-b",
    "test_demo.py": "spark-b",
}


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with the Spark files in their ``SPARK_GROUPS`` (each group one unit,
    its files in collection order); any other distribution is xdist's own."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SparkGroupedScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SPARK_GROUPS.get(Path(path).name, path)

    return SparkGroupedScheduling(config, log)


# ``AGGVIEW_TEST_CPU=FILE``: each test file's CPU seconds (the worker, its live descendants
# and the children it reaped: clusters, Spark's JVM, HBase) appended to FILE, to see where the
# suite's time goes (its floor on two cores is its CPU over two); then its wall seconds, the
# xdist worker and the time it ended, to see how the workers were packed.
_CPU_LOG = os.environ.get("AGGVIEW_TEST_CPU")
_cpu_mark: list[float] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if _CPU_LOG and not _cpu_mark:
        _cpu_mark[:] = [process_tree_cpu_seconds(os.getpid()), time.monotonic()]
    yield
    if _CPU_LOG and (nextitem is None or nextitem.path != item.path):
        cpu, wall = process_tree_cpu_seconds(os.getpid()), time.monotonic()
        with open(_CPU_LOG, "a") as log:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
            log.write(
                f"{item.path.name}\t{cpu - _cpu_mark[0]:.1f}\t{wall - _cpu_mark[1]:.1f}"
                f"\t{worker}\t{time.time():.0f}\n"
            )
        _cpu_mark[:] = [cpu, wall]


def pytest_configure(config: pytest.Config) -> None:
    """Compile the checkout's modules once, before any worker starts: with
    PYTHONDONTWRITEBYTECODE set (as on CI's machine) no import writes a ``.pyc``, so every
    member, CLI run and Spark worker the suite starts would compile them again (a member's
    start: 0.95 -> 0.75 CPU-s)."""
    if hasattr(config, "workerinput"):  # an xdist worker: its controller compiled them
        return
    root = Path(__file__).resolve().parents[1]
    for package in root.iterdir():  # the checkout's top-level packages
        if (package / "__init__.py").exists():
            compileall.compile_dir(package, quiet=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file keeps its own order


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not hasattr(session.config, "workerinput"):
        # a Spark class archive's writer a session started (once per machine) ends with the run
        from aggspark.class_archive import wait_for_writer
        from aggspark.session import cache_directory

        wait_for_writer(cache_directory(), timeout=180)
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    found = lookup_mismatches(factory.getbasetemp())
    if found:
        print(f"\n{len(found)} wrong answers of the lookup cache:", *found[:20], sep="\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cluster"), ltms=3, processes=PROCESSES) as running:
        yield running


@pytest.fixture
def client(cluster: LocalCluster) -> Iterator[Client]:
    with Client(cluster.address, timeout=30) as c:
        yield c


@pytest.fixture
def table_name() -> str:
    """A fresh table name, so tests sharing the session cluster never see each other's rows."""
    return f"t_{uuid.uuid4().hex[:10]}"


@contextlib.contextmanager
def own_cluster(tmp_path: Path, **layout: Any) -> Iterator[LocalCluster]:
    """A cluster of its own (``layout``: LocalCluster's fields), stopped and checked after."""
    running = LocalCluster(
        tmp_path / "data", checkpoint_interval=0.5, **{"processes": PROCESSES, **layout}
    )
    try:
        yield running.start()
    finally:
        running.stop()
        running.kill()
    assert not lookup_mismatches(tmp_path), lookup_mismatches(tmp_path)


@pytest.fixture
def fresh_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster of its own, for tests that kill servers."""
    with own_cluster(tmp_path, ltms=3, verbose=True) as running:
        yield running


@pytest.fixture(scope="session")
def spark() -> Any:
    """The one local Spark session every test shares (it starts in about 15 s)."""
    from aggspark.session import spark_session, stop_session

    session = spark_session()
    yield session
    stop_session()


# The files whose tests use the real HBase (``real_hbase``), next to each other in their
# group's order (``LONGEST_FIRST``): the HBase stops after the last test of them, as an idle
# one costs a tenth of a core (50 CPU-s over the rest of its worker's run), and starts again
# should a later test ask for it.
HBASE_FILES = ("test_real_hbase.py", "test_ownership.py")


class SessionHBase:
    """The session's one real Apache HBase (standalone, jars from Maven Central), with its
    Thrift server and a second one in framed mode: started on first use, stopped between
    the runs of ``HBASE_FILES``."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.hbase: Any = None

    def running(self) -> Any:
        if self.hbase is None:
            from ltm.store.hbase_server import StandaloneHBase

            hbase = StandaloneHBase(self.factory.mktemp("hbase"), port=0, framed_port=0)
            hbase.start()
            self.hbase = hbase
        return self.hbase

    def stop(self) -> None:
        if self.hbase is not None:
            hbase, self.hbase = self.hbase, None
            hbase.stop(clean=False)  # its data is the tests' (a clean shutdown: 26 s on CI)


_session_hbase: list[SessionHBase] = []


@pytest.fixture(scope="session")
def session_hbase(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionHBase]:
    """Skipped only where Java or Maven is absent."""
    import shutil

    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"a real HBase needs {' and '.join(missing)} on PATH")
    home = SessionHBase(tmp_path_factory)
    _session_hbase.append(home)
    try:
        yield home
    finally:
        home.stop()


@pytest.fixture
def real_hbase(session_hbase: SessionHBase) -> Any:
    """The session's real HBase, running (``SessionHBase``)."""
    return session_hbase.running()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if _session_hbase and (nextitem is None or nextitem.path.name not in HBASE_FILES):
        _session_hbase[0].stop()


@pytest.fixture(scope="session")
def docker_images() -> Iterator[Any]:
    """A Docker engine, found or started, with aggview's and HBase's images built
    (``tests/docker_session.py``); or a skip saying exactly why not."""
    from docker_session import DockerSkip, docker_session

    with contextlib.ExitStack() as stack:
        try:
            images = stack.enter_context(docker_session())
        except DockerSkip as exc:
            pytest.skip(str(exc))
        yield images
