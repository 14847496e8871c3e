"""The Cumulus runtime's nodes as real processes over gRPC: the same stream gives the same maps
as the simulator and the interpreter, committed snapshots are exact, a dead node is named, a
malformed stream is refused while the node stays up, and TLS members only."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from test_cumulus_replay import config, dashboard_stream
from test_cumulus_runtime import _program, interpreted, random_stream

from aggview import certs, errors
from aggview.net import GRPC_OPTIONS
from aggview.processes import Server
from aggview.wire import cumulus_pb2 as pb
from aggview.wire import cumulus_pb2_grpc as pb_grpc
from coordinator.catalog import table_from_create
from cumulus.runtime.grpc_host import GrpcRuntime, start_node_processes
from cumulus.runtime.replay import replay
from cumulus.runtime.simulator import Simulator
from cumulus.runtime.wire import decode_entries, encode_entries


@pytest.fixture
def nodes(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[Server]]:
    program = _program(request.param["program"], request.param.get("replicas", 0))
    servers = start_node_processes(
        program,
        request.param["nodes"],
        tmp_path / "nodes",
        switches=request.param["switches"],
        mode=request.param.get("mode", "speculative"),
    )
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.mark.parametrize(
    "nodes",
    [
        {"program": "seed003_q3", "nodes": 2, "switches": 2, "replicas": 3},
        {"program": "with_deletes", "nodes": 3, "switches": 1, "mode": "conservative"},
    ],
    indirect=True,
)
def test_processes_give_the_simulators_maps_and_exact_snapshots(
    nodes: list[Server], caplog: pytest.LogCaptureFixture
) -> None:
    name = "seed003_q3" if len(nodes) == 2 else "with_deletes"
    mode = "speculative" if len(nodes) == 2 else "conservative"
    switches = 2 if len(nodes) == 2 else 1
    program = _program(name, 3 if len(nodes) == 2 else 0)  # q3's dimensions replicated
    stream = random_stream(program, random.Random(11), 1500)
    runtime = GrpcRuntime(
        program, [s.address for s in nodes], switches=switches, mode=mode, epoch_ms=50
    )
    try:
        runtime.feed(stream)
        report = runtime.finish()
        want = interpreted(program, stream)
        assert runtime.maps() == want
        cut, snapshot = runtime.snapshot()
        assert snapshot == want and cut == max(c for c, _ in runtime._entered)
        assert len(report.epochs) >= 1 and report.messages["Dispatch"] > 0
        if mode == "conservative":
            assert report.corrective == 0
        assert runtime.log_sizes() == {
            "write_log_entries": 0,
            "read_log_entries": 0,
            "operations": 0,
        }
        latencies = runtime.latencies()
        assert latencies and min(latencies) >= 0
    finally:
        runtime.close()
    # the driver's close ends each Drive stream at both ends (the nodes once kept their answers
    # open until they stopped, and close cut them after waiting), and the nodes serve on
    assert "after the driver closed" not in caplog.text
    assert all(node.running() for node in nodes)
    simulated = Simulator(program, nodes=len(nodes), switches=switches, mode=mode)
    simulated.run(stream)
    assert simulated.maps() == want


@pytest.mark.parametrize(
    "nodes", [{"program": "seed003_q3", "nodes": 2, "switches": 1, "replicas": 3}], indirect=True
)
def test_maps_preloaded_over_grpc_then_fed_equal_the_interpreter(nodes: list[Server]) -> None:
    """What a cumulus view on node processes does at each load: the maps over a snapshot
    go to the nodes in Preload calls, each entry to the node holding its key; the updates
    after the snapshot run the protocol on top. A Preload of the wrong node's key, of a map
    that does not exist, or after updates is refused and the nodes serve on. The maps of
    replicated relations (customer and orders) go to every node."""
    program = _program("seed003_q3", 3)
    stream = random_stream(program, random.Random(8), 600)
    runtime = GrpcRuntime(program, [s.address for s in nodes], epoch_ms=10**9)
    try:
        loaded = interpreted(program, stream[:400])
        runtime.preload(loaded)
        stub = runtime._stubs[0]
        assert runtime.placement.replicated  # some maps are everywhere
        partitioned = [(n, e) for n, e in loaded.items() if n not in runtime.placement.replicated]
        name, entries = next((n, e) for n, e in partitioned if len(e) > 1)
        stranger = next(k for k in entries if runtime.placement.node_of(name, k) != 0)
        wrong = pb.PreloadRequest(map=name, entries=encode_entries({stranger: entries[stranger]}))
        with pytest.raises(grpc.RpcError) as caught:
            stub.Preload(wrong)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "belongs to node 1, not 0" in (caught.value.details() or "")
        with pytest.raises(grpc.RpcError) as caught:
            stub.Preload(pb.PreloadRequest(map="nope"))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        runtime.feed(stream[400:])
        runtime.finish()
        want = interpreted(program, stream)
        assert runtime.snapshot()[1] == want
        for replica in runtime.placement.replicated:  # each node holds the whole map
            for node_stub in runtime._stubs:
                reply = node_stub.ReadMap(pb.MapRequest(map=replica, committed=False))
                assert decode_entries(reply.entries) == want[replica]
        with pytest.raises(errors.FailedPrecondition, match="preload after updates"):
            runtime.preload(loaded)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Preload(pb.PreloadRequest(map=name))
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        runtime.close()
    assert all(node.running() for node in nodes)


def test_member_switches_over_processes_commit_exact_epochs(tmp_path: Path) -> None:
    """Two members' switches stamping commit timestamps (issue #42): member 1's updates sent
    in bursts behind member 0's; each epoch opened at a cut and closed switch by switch is
    the stream's prefix up to the cut. Conservative, versions per switch, in the node
    processes (speculation over stamped switches: ``test_member_switches.py``)."""
    mode = "conservative"
    program = _program("with_deletes")
    stream = random_stream(program, random.Random(5), 600)
    servers = start_node_processes(
        program, 2, tmp_path / "nodes", switches=2, mode=mode, per_switch=True
    )
    runtime = GrpcRuntime(
        program, [s.address for s in servers], switches=2, mode=mode, stamped=True
    )
    try:
        owner = [i % 3 == 0 for i in range(len(stream))]  # a third of the commits at member 1
        for cut in (200, 400, 600):
            start = cut - 200
            for member in (0, 1):  # member 1's batch arrives after member 0's later commits
                runtime.feed_stamped(
                    member,
                    [(i + 1, stream[i]) for i in range(start, cut) if owner[i] == bool(member)],
                )
            runtime.open_at(cut)
            runtime.close_switch(1, cut)
            runtime.close_switch(0, cut)
            report = runtime.finish()
            assert runtime.snapshot() == (cut, interpreted(program, stream[:cut]))
        assert runtime.maps() == interpreted(program, stream)
        assert report.corrective == 0
    finally:
        runtime.close()
        for server in servers:
            server.stop()


def test_replay_over_grpc_checks_and_names_a_dead_node(tmp_path: Path) -> None:
    stream = dashboard_stream(tmp_path / "updates.csv", seed=4, length=800)
    result = replay(
        config(tmp_path, stream, host="grpc", nodes=2, switches=2, epoch_ms=100, check=True),
        table_from_create,
    )
    assert result.differences == []
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert stats["host"] == "grpc" and stats["latency_unit"] == "s"
    assert stats["bytes"]["Dispatch"] > 0 and stats["epochs"] >= 1

    program = _program("seed003_q3")
    servers = start_node_processes(program, 2, tmp_path / "dead")
    runtime = GrpcRuntime(program, [s.address for s in servers], epoch_ms=50)
    try:
        runtime.feed(random_stream(program, random.Random(1), 200))
        servers[1].kill()
        with pytest.raises(errors.Unavailable, match="DW node 1 at 127.0.0.1:"):
            runtime.feed(random_stream(program, random.Random(2), 2_000))
            runtime.finish()
    finally:
        runtime.close()
        for server in servers:
            server.stop()


@pytest.mark.parametrize(
    "nodes", [{"program": "seed002_ex1", "nodes": 1, "switches": 1}], indirect=True
)
def test_a_malformed_drive_is_refused_and_the_node_stays_up(nodes: list[Server]) -> None:
    channel = grpc.insecure_channel(nodes[0].address, options=GRPC_OPTIONS)
    stub = pb_grpc.DwNodeStub(channel)
    without_hello = [pb.Batch(messages=[pb.Envelope(settled=pb.Settled(seq=1))])]
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Drive(iter(without_hello)))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Drive starts with Hello" in (caught.value.details() or "")
    wrong_peers = [pb.Batch(messages=[pb.Envelope(hello=pb.Hello(peers=["a", "b"]))])]
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Drive(iter(wrong_peers)))
    assert "2 peer addresses for 1 nodes" in (caught.value.details() or "")
    # a malformed message after a good start ends the stream with the reason (the answers
    # end with the requests; before, they would have ended as if the driver had just left)
    hello = pb.Envelope(hello=pb.Hello(switch_id=0, peers=[nodes[0].address]))
    later = [pb.Batch(messages=[hello]), pb.Batch(messages=[pb.Envelope()])]
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Drive(iter(later)))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a runtime message" in (caught.value.details() or "")
    with pytest.raises(grpc.RpcError) as caught:
        stub.ReadMap(pb.MapRequest(map="nope"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert stub.Stats(pb.NodeStatsRequest()).epochs == 0  # still serving, nothing applied
    channel.close()
    assert nodes[0].running()


def test_over_tls_only_members_drive_nodes(tmp_path: Path) -> None:
    tls_dir = tmp_path / "tls"
    certs.make_certs(tls_dir)
    program = _program("seed002_ex1")
    servers = start_node_processes(program, 2, tmp_path / "nodes", tls_dir=tls_dir)
    try:
        from aggview.security import TlsDir

        tls = TlsDir.load(tls_dir)
        stream = random_stream(program, random.Random(5), 300)
        runtime = GrpcRuntime(program, [s.address for s in servers], tls=tls)
        try:
            runtime.feed(stream)
            runtime.finish()
            assert runtime.snapshot()[1] == interpreted(program, stream)
        finally:
            runtime.close()
        stranger = grpc.secure_channel(
            servers[0].address, grpc.ssl_channel_credentials(tls.ca), options=GRPC_OPTIONS
        )
        with pytest.raises(grpc.RpcError):
            pb_grpc.DwNodeStub(stranger).Stats(pb.NodeStatsRequest(), timeout=5)
        stranger.close()
    finally:
        for server in servers:
            server.stop()
