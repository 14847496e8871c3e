"""DW nodes by address (issue #42): ``aggview cumulus node`` without ``--program`` is a node
pool that views assign (``host = 'h1:port,h2:port'``). Two views share the pools, each exact
at its epochs; a pool killed and started again on its address gets a new run of each view and
both come back exact; bad options and an address nobody answers are refused by name with
nothing created; and the pools run on hosts of their own (network namespaces, their own
addresses on a bridge), reached from the members by address."""

from __future__ import annotations

import random
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import own_cluster
from test_cumulus_views import _assert_epoch_exact, _until_epoch_exact, _write

from aggclient import Client
from aggview import errors
from aggview.net import GRPC_OPTIONS
from aggview.processes import Server, free_port
from aggview.wire import cumulus_pb2 as pb
from aggview.wire import cumulus_pb2_grpc as pb_grpc
from bench.netns import Network, unavailable

TOTALS = "SELECT g, SUM(v) AS s, COUNT(*) AS n, MIN(x) AS low FROM ev GROUP BY g"
BIG = "SELECT g, COUNT(*) AS n, MAX(v) AS high FROM ev WHERE x > 3 GROUP BY g"


def _pools(log_dir: Path, hosts: list[tuple[list[str], str]]) -> list[Server]:
    """A node pool per (command prefix, address to listen on), started side by side."""
    started = []
    for number, (prefix, host) in enumerate(hosts):
        args = ["cumulus", "node", "--insecure", *(["--host", host] if host else [])]
        log = log_dir / f"pool-{number}.log"
        started.append(Server(f"dw pool {number}", args, log, port=free_port(), prefix=prefix))
    offsets = [server.launch() for server in started]
    for server, offset in zip(started, offsets, strict=True):
        server.wait_listening(offset)
    return started


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    """Two pools on loopback for the module's tests: each test's views are runs of their own
    (a test that kills a pool starts it again)."""
    started = _pools(tmp_path_factory.mktemp("pools"), [([], "")] * 2)
    try:
        yield started
    finally:
        for server in started:
            server.stop()


def test_views_share_node_pools_by_address_and_survive_a_pool_restart(
    tmp_path: Path, pools: list[Server]
) -> None:
    rng = random.Random(3)
    where = ",".join(p.address for p in pools)
    with own_cluster(tmp_path, ltms=2, processes=2) as cluster, Client(cluster.address) as client:
        client.sql("CREATE TABLE ev (id INT PRIMARY KEY, g TEXT, v DECIMAL(8,2), x INT)")
        ids = _write(client, rng, range(0, 30))
        client.sql(
            "CREATE MATERIALIZED VIEW totals WITH (refresh = 'cumulus', "
            f"host = '{where}', epoch_ms = 60000) AS {TOTALS}"
        )
        client.sql(  # the other order of the same pools, and conservative
            "CREATE MATERIALIZED VIEW big WITH (refresh = 'cumulus', mode = 'conservative', "
            f"host = '{pools[1].address}, {pools[0].address}', epoch_ms = 60000) AS {BIG}"
        )
        _write(client, rng, range(30, 60), ids)
        _assert_epoch_exact(client, "totals", TOTALS)
        _assert_epoch_exact(client, "big", BIG)

        pools[0].process.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        pools[0].process.wait()  # type: ignore[union-attr]
        _write(client, rng, range(60, 90), ids)
        with pytest.raises(errors.AggviewError, match="DW node"):
            client.refresh("totals")
        pools[0].start()  # on its address again: a new run of each view
        _write(client, rng, range(90, 120), ids)
        # the failed epoch's error, then "not loaded" until the new run is
        _until_epoch_exact(client, "totals", TOTALS, errors.AggviewError)
        _until_epoch_exact(client, "big", BIG, errors.AggviewError)
        client.sql("DROP MATERIALIZED VIEW big")
        _write(client, rng, range(120, 140), ids)
        _assert_epoch_exact(client, "totals", TOTALS)


def test_node_pool_options_and_unreachable_addresses_are_refused_by_name(
    tmp_path: Path, pools: list[Server]
) -> None:
    a, b = (p.address for p in pools)
    nobody = f"127.0.0.1:{free_port()}"
    with own_cluster(tmp_path, ltms=1, processes=1) as cluster, Client(cluster.address) as client:
        client.sql("CREATE TABLE ev (id INT PRIMARY KEY, g TEXT, v DECIMAL(8,2), x INT)")
        create = (  # epochs only when the test asks (a timed one between its reads races them)
            "CREATE MATERIALIZED VIEW v WITH (refresh = 'cumulus', epoch_ms = 60000, {}) AS "
            + TOTALS
        )
        refusals = {
            f"nodes = 3, host = '{a},{b}'": "nodes = 3 but host names 2 DW node addresses",
            "host = 'somewhere:port'": "'somewhere:port' is not host:port",
            f"host = '{a},{a}'": "host names a DW node address twice",
            "host = 'elsewhere'": "host must be 'local', 'grpc' or 'spark'",
        }
        for options, message in refusals.items():
            with pytest.raises(errors.InvalidArgument, match=message):
                client.sql(create.format(options))
        with pytest.raises(errors.Unavailable, match=f"DW node 1 at {nobody} does not answer"):
            client.sql(create.format(f"host = '{a},{nobody}'"))
        with pytest.raises(errors.AggviewError, match="v"):  # nothing was created
            client.view("v")
        client.sql(create.format(f"host = '{a},{b}'"))
        with pytest.raises(errors.InvalidArgument, match="nodes = 3 on 2 DW node addresses"):
            client.sql("ALTER MATERIALIZED VIEW v SET (nodes = 3)")
        client.sql("ALTER MATERIALIZED VIEW v SET (host = 'local')")
        _write(client, random.Random(4), range(0, 20))
        _assert_epoch_exact(client, "v", TOTALS)


def test_a_pool_refuses_a_bad_assignment_and_calls_for_no_run_and_stays_up(
    pools: list[Server],
) -> None:
    with grpc.insecure_channel(pools[0].address, options=GRPC_OPTIONS) as channel:
        stub = pb_grpc.DwNodeStub(channel)
        bad = {
            "Assign names a view and a run": pb.AssignRequest(program="", nodes=1),
            "node number 2 of 2 nodes": pb.AssignRequest(view="v", run="r", number=2, nodes=2),
            "Assign:": pb.AssignRequest(view="v", run="r", program="not m3", nodes=1),
        }
        for message, request in bad.items():
            with pytest.raises(grpc.RpcError) as refused:
                stub.Assign(request, timeout=10)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert message in refused.value.details()
        with pytest.raises(grpc.RpcError) as refused:
            stub.Stats(pb.NodeStatsRequest(), metadata=(("aggview-dw-run", "nothing"),))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no run 'nothing' at this DW node" in refused.value.details()
    assert pools[0].running()


@pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "")
def test_node_pools_on_hosts_of_their_own_are_reached_by_address(tmp_path: Path) -> None:
    """Two hosts (network namespaces with their own addresses on a bridge) each run a pool on
    their address; the members, on this host, drive them there, and the nodes link to each
    other across the bridge."""
    network = Network(2).create()
    started: list[Server] = []
    try:
        hosts = [(["ip", "netns", "exec", network.host_ns(h)], network.ip_of(h)) for h in range(2)]
        started = _pools(tmp_path, hosts)
        where = ",".join(f"{network.ip_of(h)}:{server.port}" for h, server in enumerate(started))
        rng = random.Random(6)
        with own_cluster(tmp_path, ltms=2, processes=2) as cluster:
            with Client(cluster.address) as client:
                client.sql("CREATE TABLE ev (id INT PRIMARY KEY, g TEXT, v DECIMAL(8,2), x INT)")
                ids = _write(client, rng, range(0, 30))
                client.sql(
                    "CREATE MATERIALIZED VIEW remote WITH (refresh = 'cumulus', "
                    f"host = '{where}', epoch_ms = 60000) AS {TOTALS}"
                )
                _write(client, rng, range(30, 80), ids)
                _assert_epoch_exact(client, "remote", TOTALS)
    finally:
        for server in started:
            server.stop()
        network.destroy()
