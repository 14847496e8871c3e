"""A real HBase in Docker (testcontainers, the HBase image ``aggview docker build`` makes from
the pinned jars of ``aggview hbase start``), and the compose file.

The HBase tests run the store contract and the end-to-end view test against HBase's own Thrift
server in one container shared by the module; they skip, saying why, when no Docker engine can
run (the ``docker_images`` fixture). The compose file is checked always: parsed as YAML, every
aggview command parsed by aggview's own argument parser; and with ``docker compose config``
when that CLI exists. ``tests/test_docker_compose.py`` runs it.
"""

from __future__ import annotations

import argparse
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import happybase
import pytest
import yaml
from docker_session import DockerImages
from profiles import PROFILE
from store_contract import StoreContract
from test_store_hbase import check_after_restart, run_view_workload
from thriftpy2.thrift import TException

from aggcli.cli import build_parser
from aggcli.docker_images import HBASE_IMAGE, compose_cli

THRIFT_PORT = 9090
READY_TIMEOUT = 300.0
COMPOSE = Path(__file__).resolve().parents[1] / "docker" / "compose.yaml"


def wait_for_thrift(host: str, port: int, timeout: float = READY_TIMEOUT) -> None:
    """Until HBase serves real Thrift calls: a probe table created, written, read, dropped.
    (The Thrift port opens long before the master and a region server are up.)"""
    deadline = time.monotonic() + timeout
    probe = f"ready_{uuid.uuid4().hex[:8]}"
    while True:
        try:
            connection = happybase.Connection(host, port, timeout=20_000)
            try:
                # a create that timed out here may still have happened
                if probe.encode() not in connection.tables():
                    connection.create_table(probe, {"d": {}})
                connection.table(probe).put(b"k", {b"d:v": b"ok"})
                assert connection.table(probe).row(b"k") == {b"d:v": b"ok"}
                connection.delete_table(probe, disable=True)
                return
            finally:
                connection.close()
        except (TException, OSError) as exc:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"HBase at {host}:{port} not ready: {exc!r}") from exc
            time.sleep(2)


@pytest.fixture(scope="module")
def container_hbase(docker_images: DockerImages) -> Iterator[tuple[str, int]]:
    """One HBase container for the whole module (it takes about 20 s to serve), removed with
    its volume after."""
    from testcontainers.core.container import DockerContainer

    container = DockerContainer(docker_images.hbase).with_exposed_ports(THRIFT_PORT)
    container.start()
    try:
        host = container.get_container_host_ip()
        port = int(container.get_exposed_port(THRIFT_PORT))
        wait_for_thrift(host, port)
        yield host, port
    finally:
        container.stop()


class TestContainerHBaseStore(StoreContract):
    @pytest.fixture
    def url(self, container_hbase: tuple[str, int]) -> str:
        host, port = container_hbase
        return f"hbase://{host}:{port}?table_prefix=contract"


# The container runs the same HBase jars as ``test_real_hbase.py``, which runs the whole contract
# against them: what only the container can break is the way in (the image's Thrift server, the
# published port, Docker's network), which these exercise: tables, every kind of write and read,
# binary keys and large values, paged scans, guards and races. The other contract tests run
# against the container too under ``HYPOTHESIS_PROFILE=thorough`` (the suite's ten minutes).
CONTAINER_CONTRACT = {
    "test_create_list_drop_are_idempotent",
    "test_put_get_overwrite_delete",
    "test_get_many_large",
    "test_write_across_tables",
    "test_guarded_write_applies_only_under_its_guard",
    "test_compare_and_set_tells_empty_from_absent",
    "test_racing_compare_and_sets_have_one_winner_per_value",
    "test_binary_keys",
    "test_large_value",
    "test_scan_order_and_bounds",
    "test_scan_sees_writes_between_pages_without_repeats",
    "test_scan_prefix_is_exact",
    "test_concurrent_writes_from_threads",
    "test_count_counts_rows_and_refuses_unknown_tables",
}
if PROFILE != "thorough":
    for _name in dir(StoreContract):
        if _name.startswith("test_") and _name not in CONTAINER_CONTRACT:
            setattr(TestContainerHBaseStore, _name, None)  # not collected: not a function


def test_cluster_on_container_hbase_keeps_a_sync_view_exact(
    container_hbase: tuple[str, int], tmp_path: Path
) -> None:
    host, port = container_hbase
    url = f"hbase://{host}:{port}?table_prefix=e{uuid.uuid4().hex[:8]}"
    live = run_view_workload(url, tmp_path / "data")
    check_after_restart(url, tmp_path / "data", live)


# --- the compose file ---------------------------------------------------------------------


def test_compose_config_is_valid_for_docker_compose() -> None:
    cli = compose_cli()
    if cli is None:
        pytest.skip("no `docker compose` (plugin) or `docker-compose` CLI installed")
    result = subprocess.run(
        [*cli, "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def _aggview_args(service: str, command: list[str]) -> argparse.Namespace:
    assert command[0] == "aggview", f"{service}: command must run aggview: {command}"
    try:
        return build_parser().parse_args(command[1:])
    except SystemExit:
        pytest.fail(f"{service}: aggview refuses the command line {command}")


def test_compose_file_runs_real_aggview_commands() -> None:
    spec: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    services: dict[str, Any] = spec["services"]
    ltm_names = sorted(name for name in services if name.startswith("ltm-"))
    assert ltm_names == ["ltm-0", "ltm-1", "ltm-2"]
    assert {"hbase", "hbase-ready"} <= set(services)
    assert "coordinator" not in services  # every LTM coordinates

    hbase = services["hbase"]
    assert hbase["image"] == f"${{AGGVIEW_HBASE_IMAGE:-{HBASE_IMAGE}}}"
    assert "healthcheck" in hbase
    ready = " ".join(services["hbase-ready"]["command"])
    assert "wait_for_hbase.py" in ready and f"hbase:{THRIFT_PORT}" in ready
    assert (Path(COMPOSE).parent / "wait_for_hbase.py").is_file()

    declared_volumes = set(spec["volumes"])
    roles: dict[str, argparse.Namespace] = {}
    for name in ltm_names:
        service = services[name]
        args = _aggview_args(name, service["command"])
        roles[name] = args
        assert args.store == f"hbase://hbase:{THRIFT_PORT}"
        assert args.host == "0.0.0.0"
        if hasattr(args, "insecure"):  # servers refuse to start without a security mode
            assert args.insecure or args.tls_dir, f"{name}: give --insecure or --tls-dir"
        # the healthcheck asks the gRPC health service on the port the server listens on
        check = service["healthcheck"]["test"]
        assert check[0] == "CMD" and check[-2].endswith("docker/healthcheck.py")
        assert check[-1] == f"127.0.0.1:{args.port}"
        # the log directory (WAL or decision log) is on a declared named volume
        mounts = [v.split(":") for v in service["volumes"]]
        assert any(
            volume in declared_volumes and args.log_dir.startswith(path + "/")
            for volume, path in mounts
        ), f"{name}: --log-dir {args.log_dir} is not on a named volume"
        assert service["build"]["dockerfile"] == "docker/Dockerfile"

    members = [f"{name}:{roles[name].port}" for name in ltm_names]
    for index, name in enumerate(ltm_names):
        args = roles[name]
        assert args.command == "ltm"  # a coordinating LTM, the one server role
        assert (args.member, args.partitions, args.member_address) == (
            index,
            len(ltm_names),
            members,
        )
        depends = services[name]["depends_on"]
        if index == 0:  # the leader at start: once HBase answers
            assert depends["hbase-ready"]["condition"] == "service_completed_successfully"
        else:  # the followers: once the leader serves
            assert depends == {"ltm-0": {"condition": "service_healthy"}}
    assert services["ltm-0"]["ports"] == ["127.0.0.1:${AGGVIEW_PORT:-7070}:7070"]
    assert (Path(COMPOSE).parent / "Dockerfile").is_file()
