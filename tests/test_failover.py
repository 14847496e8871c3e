"""Replicated logs: permanent loss of a member under load, failover to the member holding its
copies, a killed old primary rejoining as a copy (fenced by the epoch, never a second primary),
a second failover onto the member that was the first victim, a partition without an in-sync copy
waiting for its member. Nothing a client saw committed may be lost."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from pausing import paused
from polling import wait_for

from aggclient import Client
from aggclient.status import cluster_status
from agglauncher.cluster import LocalCluster
from aggview import errors
from aggview.partition_map import decision_log_id
from aggview.rowcodec import decode_row
from aggview.status import add_service
from aggview.wal import WriteAheadLog
from aggview.wire import ltm_pb2 as pb
from aggview.wire import ltm_pb2_grpc as pb_grpc
from coordinator.decision_log import DecisionLog
from loadgen import transfers
from ltm import replication
from ltm.participant import Participant, Settings
from ltm.replication import LogShipper, Mirror
from ltm.server import Hosting, LtmConfig, LtmServicer
from ltm.store import open_store, ownership
from ltm.store.base import Store
from tests.test_crash import wait_until_serving
from tests.test_participant import TABLE, commit, insert, stored, update

ACCOUNTS = 30
VIEW = (
    "CREATE MATERIALIZED VIEW moved AS SELECT dst, COUNT(*) AS n, SUM(amount) AS total "
    "FROM ledger GROUP BY dst"
)


@contextlib.contextmanager
def replicated_cluster(data: Path, failover_after: float = 1.5) -> Iterator[LocalCluster]:
    """Three members, a partition each, every log copied to the next member."""
    cluster = LocalCluster(
        data,
        ltms=3,
        processes=3,
        checkpoint_interval=0.5,
        replicate=True,
        failover_after=failover_after,
        verbose=True,
    )
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        cluster.kill()


def status(cluster: LocalCluster, ltm: int, partition: int | None = None) -> pb.StatusReply:
    metadata = () if partition is None else ((ownership.PARTITION_HEADER, str(partition)),)
    with grpc.insecure_channel(cluster.member(ltm).address) as channel:
        return pb_grpc.LtmStub(channel).Status(pb.StatusRequest(), timeout=5, metadata=metadata)


def exchange_refused(cluster: LocalCluster, ltm: int, partition: int, epoch: int) -> str:
    """Opens the coordinator's stream to ``ltm`` for ``partition`` at ``epoch``; the refusal."""
    with grpc.insecure_channel(cluster.member(ltm).address) as channel:
        call = pb_grpc.LtmStub(channel).Exchange(
            iter([pb.LtmRequests()]),
            metadata=ownership.partition_metadata(partition, epoch),
            timeout=5,
        )
        with pytest.raises(grpc.RpcError) as caught:
            list(call)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION, caught.value
    return caught.value.details()


@contextlib.contextmanager
def transfers_running(
    cluster: LocalCluster, clients: int, view: str | None = None
) -> Iterator[transfers.Outcomes]:
    """Accounts and a ledger (and ``view``), every log in sync, then ``clients`` transferring
    until the block ends."""
    with Client(cluster.address) as client:
        transfers.create(client, "accounts", "ledger", ACCOUNTS)
        if view:
            client.sql(view)
    wait_for("every log to reach its copy", lambda: member_logs_copied(cluster, [0, 1, 2]))
    with transfers.running(
        cluster.address, "accounts", "ledger", ACCOUNTS, clients=clients, join_timeout=60
    ) as outcomes:
        yield outcomes


def test_permanent_loss_of_members_fails_over_twice_and_loses_nothing(
    replicated_members: LocalCluster,
) -> None:
    cluster = replicated_members
    with transfers_running(cluster, clients=6, view=VIEW) as outcomes:
        time.sleep(1.0)
        # 1. member 1 dies for good: member 2, which holds its copies, takes partition 1 over
        cluster.member(1).kill()
        killed = time.monotonic()
        wait_for("member 2 to serve partition 1", lambda: 1 in status(cluster, 2).serving, 30)
        wait_until_serving(cluster.address, "accounts")
        pause = time.monotonic() - killed
        assert pause < 15, f"service resumed only after {pause:.1f}s"
        assert sorted(status(cluster, 2).serving) == [1, 2]
        before = len(outcomes.committed)
        wait_for("commits after the failover", lambda: len(outcomes.committed) > before + 20)

        # 2. the old primary comes back as a copy of its old partition (its old epoch refused);
        # once that copy is in sync, member 2 hands partition 1 back to it (going home, a
        # planned move: the test once polled member 2 for the copy and lost the race with it)
        cluster.member(1).start()
        assert list(status(cluster, 1).serving) == []
        assert "epoch 1, not 0" in exchange_refused(cluster, 2, 1, 0)
        wait_for("partition 1 back at member 1", lambda: 1 in status(cluster, 1).serving, 30)
        wait_for(
            "member 0's log to reach member 1 again",
            lambda: status(cluster, 0, partition=0).replicated,
        )

        # 3. member 2 dies too: partition 2 goes to member 0. Its logs must have their copies at
        # the kill: on a loaded machine a copy that answers nothing for 0.3 s is dropped
        # (serving without it), and a partition whose only copy is out of sync rightly waits
        # for its member (the next test) instead of failing over.
        wait_for("member 2's logs to reach their copies", lambda: served_logs_copied(cluster, 2))
        cluster.member(2).kill()
        wait_for("member 0 to serve partition 2", lambda: 2 in status(cluster, 0).serving, 30)
        wait_until_serving(cluster.address, "accounts")
        assert sorted(status(cluster, 0).serving) == [0, 2]
        assert sorted(status(cluster, 1).serving) == [1]
        before = len(outcomes.committed)
        wait_for("commits after the second failover", lambda: len(outcomes.committed) > before + 20)
    assert len(outcomes.committed) > 100, outcomes
    check_transfers_and_view(cluster, outcomes)


def test_partition_without_in_sync_copy_waits_for_its_member(
    replicated_members: LocalCluster,
) -> None:
    """The holder of partition 1's copy (member 2) dies first, so member 1 goes on alone;
    when member 1 dies too, moving partition 1 would lose what only member 1 logged: it waits
    for member 1 instead."""
    cluster = replicated_members
    with transfers_running(cluster, clients=4) as outcomes:
        time.sleep(0.5)
        cluster.member(2).kill()
        wait_for("member 0 to serve partition 2", lambda: 2 in status(cluster, 0).serving, 30)
        wait_until_serving(cluster.address, "accounts")
        wait_for(
            "member 1 to go on without its copy",
            lambda: not status(cluster, 1, partition=1).replicated,
        )
        before = len(outcomes.committed)
        wait_for("commits logged by member 1 alone", lambda: len(outcomes.committed) > before + 20)
        cluster.member(1).kill()
        time.sleep(3 * cluster.failover_after)
        with open_store(cluster.store_url) as store:
            record = ownership.read(store, 1)
        assert (record.owner, record.epoch, record.in_sync) == (1, 0, False), record
        cluster.member(1).start()  # serves its partition again, from its own log
        wait_until_serving(cluster.address, "accounts")
        cluster.member(2).start()  # holds copies now: partition 2 stays with member 0
        assert list(status(cluster, 2).serving) == []
        before = len(outcomes.committed)
        wait_for("commits after the restarts", lambda: len(outcomes.committed) > before + 20)
    with Client(cluster.address) as client:
        transfers.check(client, "accounts", "ledger", ACCOUNTS, outcomes.committed)


def test_mirror_takes_appends_only_after_a_resync_and_refuses_older_epochs(
    tmp_path: Path,
) -> None:
    mirror = Mirror(tmp_path, 3, fsync=False)

    def request(epoch: int, *chunks: tuple[int, bytes], **fields: object) -> pb.ReplicateRequest:
        logged = [pb.LogChunk(segment=s, data=d) for s, d in chunks]
        return pb.ReplicateRequest(partition=3, epoch=epoch, chunks=logged, **fields)

    with pytest.raises(errors.FailedPrecondition, match="resync first"):
        mirror.apply(request(0, (1, b"x")))
    (tmp_path / "000000000009.wal").write_bytes(b"stale")
    mirror.apply(request(2, (1, b"ab"), (2, b"c"), reset=True))
    mirror.apply(request(2, (2, b"d"), drop_before=2))
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.wal")} == {"000000000002.wal": b"cd"}
    with pytest.raises(ownership.Superseded):
        mirror.apply(request(1, (2, b"e")))


class _InProcessShipper:
    """Ships to a Mirror in this process: what the backup's files hold after each flush."""

    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror

    async def ship(self, segment: int, data: bytes, drop_before: int) -> None:
        chunk = pb.LogChunk(segment=segment, data=data)
        self.mirror.apply(pb.ReplicateRequest(epoch=0, chunks=[chunk], drop_before=drop_before))


def test_a_mirror_replays_the_same_records_as_the_log(tmp_path: Path) -> None:
    async def scenario() -> None:
        wal = WriteAheadLog(tmp_path / "primary", fsync=False)
        mirror = Mirror(tmp_path / "backup", 0, fsync=False)
        mirror.apply(pb.ReplicateRequest(epoch=0, reset=True))
        wal.shipper = _InProcessShipper(mirror)
        for i in range(30):
            await wal.append({"kind": "prepared", "ts": i, "after": {}})
            if i % 7 == 6:
                segment = wal.switch([])
                await wal.flush()
                wal.drop_before(segment - 1)
        await wal.flush()
        primary = list(WriteAheadLog(tmp_path / "primary", fsync=False).replay())
        backup = list(WriteAheadLog(tmp_path / "backup", fsync=False).replay())
        assert [r["lsn"] for r in primary] == [r["lsn"] for r in backup[-len(primary) :]]
        assert backup[-len(primary) :] == primary
        await wal.close()

    asyncio.run(scenario())


def test_a_superseded_primary_never_writes_the_store_again(tmp_path: Path) -> None:
    """The fence moves to another LTM (a failover the old primary did not see): its next
    checkpoint is refused by the store, its rows there stay as they were, and it stops
    serving the partition."""

    async def scenario() -> None:
        with open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
            store.create_table(TABLE)
            record = ownership.Ownership(0, 0, 0)
            p = Participant(store, tmp_path / "log", Settings(), ownership=record)
            await p.start()
            await commit(p, 10, insert(b"k", {"v": 1}))
            await p.checkpoint()
            assert stored(store, b"k")[1] == {"v": 1}
            ownership.write(store, ownership.Ownership(0, 1, 1))  # the coordinator moved it
            await commit(p, 20, update(b"k", {"v": 2}))
            with pytest.raises(ownership.Superseded, match="served by LTM 1 at epoch 1"):
                await p.checkpoint()
            assert stored(store, b"k")[1] == {"v": 1}
            assert p.fenced
            with pytest.raises(errors.FailedPrecondition):
                await commit(p, 30, update(b"k", {"v": 3}))
            # a decision it never saw may be one its successor holds prepared: no ack
            with pytest.raises(errors.FailedPrecondition, match="epoch 1"):
                await p.decide(40, True)
            await p.stop()  # no final checkpoint either
            assert stored(store, b"k")[1] == {"v": 1}

    asyncio.run(scenario())


def test_a_move_is_a_compare_and_set_on_the_record_it_read(tmp_path: Path) -> None:
    """Two members that read one record can never both move the partition, and a move
    decided on "the copy is in sync" fails once the owner recorded it out of sync (it went
    on alone: the copy lacks what it committed since)."""
    with open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
        start = ownership.read(store, 0)
        owner = start.evolve(standby=1, standby_address="b:1", in_sync=True)
        ownership.write_standby(store, owner)
        seen_by_a, seen_by_b = ownership.read(store, 0), ownership.read(store, 0)
        assert seen_by_a.failover_target == 1
        moved = ownership.Ownership(0, 1, 1, standby=0, standby_address="a:1")
        ownership.move(store, seen_by_a, moved)
        with pytest.raises(ownership.Moved, match="now epoch 1, owner 1"):
            ownership.move(store, seen_by_b, ownership.Ownership(0, 1, 2))
        assert ownership.read(store, 0).owner == 1

        # the new owner records its copy in sync, a mover reads that, then the owner drops it
        current = ownership.read(store, 0).evolve(in_sync=True)
        ownership.write_standby(store, current)
        stale = ownership.read(store, 0)
        assert stale.failover_target == 0
        ownership.write_standby(store, current.evolve(in_sync=False))
        with pytest.raises(ownership.Moved, match="in sync: False"):
            ownership.move(store, stale, ownership.Ownership(0, 2, 0, standby=1))
        assert ownership.read(store, 0).epoch == 1


def test_resync_copies_a_log_bigger_than_a_message_in_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real LTM server (in this process) as the backup; the primary's log has sealed
    segments and a current one, and is sent in chunks far smaller than it. The flushes after
    go on the flush stream; once the backup is gone, a flush counts it out of sync."""
    monkeypatch.setattr(replication, "CHUNK_BYTES", 700)

    async def scenario() -> None:
        with open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
            config = LtmConfig(tmp_path / "backup", 1, 2)
            server = grpc.aio.server()
            add_service(
                server, pb.DESCRIPTOR.services_by_name["Ltm"], LtmServicer(Hosting(config, store))
            )
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            wal = WriteAheadLog(tmp_path / "primary", fsync=False)
            for i in range(40):
                await wal.append({"kind": "prepared", "ts": i, "after": {"pad": "x" * 100}})
                if i % 10 == 9:
                    wal.switch([])
            shipper = LogShipper(
                store, wal, ownership.Ownership(0, 0, 0), 1, f"127.0.0.1:{port}", None
            )
            await shipper.resync()
            assert shipper.in_sync and ownership.read(store, 0).in_sync
            wal.shipper = shipper
            for i in range(40, 50):  # flushes on the flush stream, in chunks
                await wal.append({"kind": "prepared", "ts": i, "after": {"pad": "y" * 2000}})
            await server.stop(None)  # the backup goes: the next flush counts it out of sync
            await wal.append({"kind": "prepared", "ts": 50, "after": {}})
            assert not shipper.in_sync and not ownership.read(store, 0).in_sync
            await shipper.close()
            await wal.close()
        primary = list(WriteAheadLog(tmp_path / "primary", fsync=False).replay())
        backup = list(WriteAheadLog(tmp_path / "backup" / "replica-0", fsync=False).replay())
        assert [r["ts"] for r in backup if r["kind"] == "prepared"] == list(range(50))
        assert backup == primary[:-1]  # all but the flush after the backup went

    asyncio.run(scenario())


async def shipping_to_a_backup(
    tmp_path: Path,
    store: Store,
    may_drop: Callable[[], bool],
    silent: Callable[[int], bool] = lambda backup: False,
    hearing: replication.Hearing | None = None,
) -> tuple[grpc.aio.Server, LtmServicer, WriteAheadLog, LogShipper]:
    """A backup LTM server (partition 1, in this process) and partition 0's shipper to it,
    started (its first resync runs in the background)."""
    server = grpc.aio.server()
    servicer = LtmServicer(Hosting(LtmConfig(tmp_path / "backup", 1, 2), store))
    add_service(server, pb.DESCRIPTOR.services_by_name["Ltm"], servicer)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    wal = WriteAheadLog(tmp_path / "primary", fsync=False)
    shipper = LogShipper(
        store,
        wal,
        ownership.Ownership(0, 0, 0),
        1,
        f"127.0.0.1:{port}",
        None,
        may_drop,
        silent,
        hearing,
    )
    await shipper.start()
    return server, servicer, wal, shipper


def test_a_member_without_a_majority_keeps_its_silent_copy_and_its_flushes_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cut off from its copy and from most members, a primary may not record the copy out of
    sync and go on alone (the majority may be failing the partition over to that copy): its
    flush waits and the record keeps naming the copy in sync. Once a majority answers again
    it drops the copy as before and the flush counts (failing it would leave a commit decision
    logged here yet unknown)."""
    monkeypatch.setattr(replication, "HOLD_BACK_POLL", 0.02)

    async def scenario() -> None:
        with open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
            majority = False
            server, _, wal, shipper = await shipping_to_a_backup(tmp_path, store, lambda: majority)
            await wait_async(lambda: shipper.in_sync)
            await wal.append({"kind": "prepared", "ts": 1, "after": {}})
            await server.stop(None)  # the copy goes silent, and so does the majority
            waiting = asyncio.ensure_future(wal.append({"kind": "prepared", "ts": 2, "after": {}}))
            await wait_async(lambda: shipper.held_back is not None)
            await asyncio.sleep(0.3)
            assert not waiting.done()
            assert ownership.read(store, 0).failover_target == 1  # still a valid target
            majority = True  # the others answer again (the copy still does not)
            await asyncio.wait_for(waiting, 10)  # counts now: alone
            assert not ownership.read(store, 0).in_sync and shipper.held_back is None
            await wal.append({"kind": "prepared", "ts": 3, "after": {}})
            await shipper.close()
            await wal.close()

    asyncio.run(scenario())


def test_a_flush_stops_waiting_for_a_copy_whose_member_the_prober_hears_silent(
    tmp_path: Path,
) -> None:
    """The copy's member is silent to this member's prober (a second without an answer) and
    this member has a majority: a flush the copy leaves unanswered drops it within a poll,
    instead of waiting out ``SHIP_TIMEOUT`` (2 s). A copy that answers probes keeps the full
    timeout, and one without a majority here is held back as before (``_gone``)."""

    async def scenario() -> None:
        with open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
            silent, majority = False, True
            server, servicer, wal, shipper = await shipping_to_a_backup(
                tmp_path, store, lambda: majority, lambda backup: silent and backup == 1
            )
            await wait_async(lambda: shipper.in_sync)
            await wal.append({"kind": "prepared", "ts": 1, "after": {}})
            assert not shipper._gone()  # answers probes: the full timeout
            silent, majority = True, False
            assert not shipper._gone()  # no majority here: held back, never dropped

            async def hang(request: pb.ReplicateRequest) -> None:
                await asyncio.Event().wait()  # connected, never answering: a cut host

            servicer._replicate = hang  # type: ignore[method-assign]
            silent, majority = True, True
            started = time.monotonic()
            await asyncio.wait_for(wal.append({"kind": "prepared", "ts": 2, "after": {}}), 10)
            waited = time.monotonic() - started
            assert waited < 1.0, f"a flush waited {waited:.1f}s for a silent copy"
            assert not shipper.in_sync and not ownership.read(store, 0).in_sync
            await shipper.close()
            await wal.close()
            await server.stop(None)

    asyncio.run(scenario())


def test_a_flush_drops_a_copy_unanswered_briefly_while_the_rest_answer_probes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45's follower cut: the copy's member (1) answers nothing, the third member (2)
    answers every probe. A flush waits ``DROP_AFTER`` (0.3 s) for the copy, not until the
    prober calls its member silent (a second and more; before: ``SHIP_TIMEOUT``), and the
    copy is not resynced until its member answers again (a resync under the log's lock
    would hold every flush); then it is, and in sync once more."""
    from coordinator.quorum import Reachability

    monkeypatch.setattr(replication, "RESYNC_EVERY", 0.05)

    async def scenario() -> None:
        with open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
            reach = Reachability(3, me=0)
            answering = {1: True, 2: True}

            async def probes() -> None:
                while True:
                    for member, answers in answering.items():
                        if answers:
                            reach.heard(member)
                        else:
                            reach.failed(member)
                    await asyncio.sleep(0.05)

            prober = asyncio.ensure_future(probes())
            server, servicer, wal, shipper = await shipping_to_a_backup(
                tmp_path, store, lambda: True, hearing=reach
            )
            await wait_async(lambda: shipper.in_sync)
            await wal.append({"kind": "prepared", "ts": 1, "after": {}})
            replicate = servicer._replicate
            resyncs = 0

            async def hang(request: pb.ReplicateRequest) -> None:
                nonlocal resyncs
                resyncs += request.reset
                await asyncio.Event().wait()  # connected, never answering: a cut host

            servicer._replicate = hang  # type: ignore[method-assign]
            answering[1] = False
            started = time.monotonic()
            await asyncio.wait_for(wal.append({"kind": "prepared", "ts": 2, "after": {}}), 10)
            waited = time.monotonic() - started
            assert waited < 0.8, f"a flush waited {waited:.1f}s for a copy its member's silence"
            assert not shipper.in_sync and not ownership.read(store, 0).in_sync
            for ts in range(3, 13):  # no resync meanwhile: every flush goes at once
                started = time.monotonic()
                await asyncio.wait_for(wal.append({"kind": "prepared", "ts": ts, "after": {}}), 10)
                assert time.monotonic() - started < 0.3
            assert resyncs == 0
            servicer._replicate = replicate  # type: ignore[method-assign]
            answering[1] = True
            await wait_async(lambda: shipper.in_sync)
            assert ownership.read(store, 0).in_sync
            assert shipper.drop_rule is not None
            assert shipper.drop_rule.wait(time.monotonic()) == replication.DROP_AFTER
            prober.cancel()
            await shipper.close()
            await wal.close()
            await server.stop(None)

    asyncio.run(scenario())


def test_a_resync_to_a_copy_that_stops_answering_holds_the_flushes_back_briefly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy dropped as silent is not resynced while it stays silent, and a resync that
    meets a copy not yet heard silent gives up on the part it sends under the log's flush
    lock after ``LOCKED_TIMEOUT``: in a nemesis's follower cut, the leader's decision-log
    resync to the cut member held every flush of that log (so every commit it coordinated)
    until the cut healed, 4 s."""
    monkeypatch.setattr(replication, "RESYNC_EVERY", 0.05)
    monkeypatch.setattr(replication, "LOCKED_TIMEOUT", 0.5)

    async def timed_append(wal: WriteAheadLog, ts: int) -> float:
        started = time.monotonic()
        await asyncio.wait_for(wal.append({"kind": "prepared", "ts": ts, "after": {}}), 10)
        return time.monotonic() - started

    async def scenario() -> None:
        with open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
            silent = False
            server, servicer, wal, shipper = await shipping_to_a_backup(
                tmp_path, store, lambda: True, lambda backup: silent and backup == 1
            )
            await wait_async(lambda: shipper.in_sync)

            async def hang(request: pb.ReplicateRequest) -> None:
                await asyncio.Event().wait()  # connected, never answering: a cut host

            servicer._replicate = hang  # type: ignore[method-assign]
            silent = True
            await timed_append(wal, 1)  # drops the copy
            assert not shipper.in_sync
            # silent: no resync starts, every flush goes at once
            slowest = max([await timed_append(wal, ts) for ts in range(2, 12)])
            assert slowest < 0.3, f"a flush waited {slowest:.1f}s beside a silent copy"
            silent = False  # not heard silent (yet): a resync starts and meets no answer
            await asyncio.sleep(0.2)
            slowest = max([await timed_append(wal, ts) for ts in range(12, 16)])
            assert slowest < 1.5, f"a flush waited {slowest:.1f}s behind a resync"
            await shipper.close()
            await wal.close()
            await server.stop(None)

    asyncio.run(scenario())


def silent_ltm_failover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, silent_for: float | None = None
) -> tuple[float, list[str]]:
    """A ``Failover`` (delay 2 s) of one LTM whose every probe times out (a cut host: each
    costs its timeout): how long it took to fail it over, and the probes sent ("kept" on
    the kept connection, "new" on a fresh one, "short" a fresh one given less than a full
    timeout). ``silent_for``: the LTM was silent that long already (a leader that took over
    from it said so)."""
    from coordinator import failover as failover_module
    from coordinator.failover import Failover

    probes: list[str] = []

    async def times_out(kind: str, timeout: float = failover_module.PROBE_TIMEOUT) -> bool:
        probes.append(kind if timeout >= failover_module.PROBE_TIMEOUT else "short")
        await asyncio.sleep(timeout)
        return False

    async def scenario() -> float:
        with open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
            channel = type("Channel", (), {"index": 0, "owner": 0, "epoch": 0})()
            watcher = Failover([channel], store, ["127.0.0.1:1"], None, 2.0)  # type: ignore[list-item]
            watcher._heard.add(0)  # it answered once: not a process still starting
            if silent_for is not None:
                watcher._down_since[0] = time.monotonic() - silent_for
            monkeypatch.setattr(watcher, "_answers", lambda stub: times_out("kept"))
            monkeypatch.setattr(
                watcher, "_answers_afresh", lambda ltm, timeout: times_out("new", timeout)
            )
            moved = asyncio.get_running_loop().create_future()

            async def fail_over(channel: object) -> bool:
                moved.set_result(time.monotonic())
                return True

            monkeypatch.setattr(watcher, "fail_over", fail_over)
            started = time.monotonic()
            watcher.start()
            try:
                return await asyncio.wait_for(moved, 10) - started
            finally:
                await watcher.stop()

    return asyncio.run(scenario()), probes


def test_a_silent_ltm_fails_over_after_the_delay_counted_from_its_first_unanswered_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its failover comes one probe after ``after`` seconds counted from the first
    unanswered probe's send, that probe on a new connection: about 2.4 s with ``after`` 2.
    It came at 4.5 s in the nemesis's follower cuts: the silence was counted from the first
    probe's timeout (a second late) and a last probe on a new connection came after the
    delay (one more)."""
    took, probes = silent_ltm_failover(tmp_path, monkeypatch)
    assert probes[-1] in ("new", "short")  # the probe that found it silent was a fresh one
    assert took < 3.2, f"failed over {took:.1f}s into the silence (delay 2 s)"


def test_an_ltm_silent_for_the_whole_delay_already_fails_over_after_one_short_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader that took over from a silent member starts its failover with the silence
    it saw (2.5 s here): the one last probe on a new connection is a short one, so the
    partitions move about half a second after the takeover, not a whole probe timeout (1 s)
    later (the nemesis's leader cuts: the moves came 1.1 s after the new leader led)."""
    took, probes = silent_ltm_failover(tmp_path, monkeypatch, silent_for=2.5)
    assert probes == ["short"]
    assert took < 0.9, f"failed over {took:.1f}s after the takeover"


async def wait_async(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_a_fenced_copy_gives_its_directory_to_the_mirror_and_can_take_over_again(
    tmp_path: Path,
) -> None:
    """LTM 0 stays alive while its partition moves away (a false failover): once fenced, the
    new owner's resync replaces it by a mirror in the same directory, and a later failover
    back makes it serve the partition again, from the store plus that mirror."""

    async def scenario() -> None:
        with open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
            hosting, old = await hosting_with_a_row(store, tmp_path)
            await old.checkpoint()
            ownership.write(store, ownership.Ownership(0, 1, 1))
            with pytest.raises(ownership.Superseded):
                await hosting.replicate(pb.ReplicateRequest(partition=0, epoch=1, reset=True))
            await commit(old, 20, update(b"k", {"v": 2}))  # no coordinator would send this
            with pytest.raises(ownership.Superseded):
                await old.checkpoint()
            await hosting.replicate(pb.ReplicateRequest(partition=0, epoch=1, reset=True))
            assert hosting.participants == {} and list(hosting.mirrors) == [0]
            ownership.write(store, ownership.Ownership(0, 2, 0))
            await hosting.take_over(pb.TakeOverRequest(partition=0, epoch=2, backup=-1))
            new = hosting.participants[0]
            assert new is not old and hosting.records[0].epoch == 2
            rows = await new.read(pb.ReadRequest(ts=30, table=TABLE, keys=[b"k"]))
            assert decode_row(rows[0][1]) == {"v": 1}
            await commit(new, 40, update(b"k", {"v": 5}))
            await hosting.stop()
            assert stored(store, b"k")[1] == {"v": 5}

    asyncio.run(scenario())


async def hosting_with_a_row(store: Store, tmp_path: Path) -> tuple[Hosting, Participant]:
    """LTM 0 of 2 serving its partition over ``store``, row k = {"v": 1} committed at 10."""
    store.create_table(TABLE)
    hosting = Hosting(LtmConfig(tmp_path / "ltm-0", 0, 2), store)
    await hosting.start()
    participant = hosting.participants[0]
    await commit(participant, 10, insert(b"k", {"v": 1}))
    return hosting, participant


def test_a_handover_is_refused_without_loss_unless_the_copy_is_at_the_new_owner(
    tmp_path: Path,
) -> None:
    """A handover asked at a stale epoch, or to an LTM that holds no copy of the log, is
    refused with an error naming why, and the partition goes on serving here, its rows intact."""

    async def scenario() -> None:
        with open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
            hosting, participant = await hosting_with_a_row(store, tmp_path)
            epoch = hosting.records[0].epoch
            stale = pb.HandOverRequest(partition=0, epoch=epoch + 1, to=1, from_address="x")
            with pytest.raises(ownership.Superseded, match="epoch"):
                await hosting.hand_over(stale)
            uncopied = pb.HandOverRequest(partition=0, epoch=epoch, to=1, from_address="x")
            with pytest.raises(errors.FailedPrecondition, match="not copied to LTM 1"):
                await hosting.hand_over(uncopied)
            assert not participant.fenced and not participant.wal.closed_to_writes
            await commit(participant, 20, update(b"k", {"v": 2}))
            await hosting.stop()
            assert stored(store, b"k")[1] == {"v": 2}
            assert ownership.read(store, 0).owner == 0

    asyncio.run(scenario())


def test_a_partition_handed_over_is_refused_as_not_served_on_every_path(tmp_path: Path) -> None:
    """A read of a partition handed over meanwhile is refused as ``NotServed`` (which a read
    retries where the partition went), not as unavailable or a plain precondition: on a
    stream opened before the handover, on a stream opened after it, and in process. A CI run's
    check after restarts failed on each of the last two."""
    from coordinator.local_ltm import LocalLtm
    from coordinator.ltm_channel import LtmChannel

    async def scenario() -> None:
        with open_store(f"sqlite:///{tmp_path / 'store.db'}") as store:
            hosting, participant = await hosting_with_a_row(store, tmp_path)
            server = grpc.aio.server()
            add_service(server, pb.DESCRIPTOR.services_by_name["Ltm"], LtmServicer(hosting))
            address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
            await server.start()
            request = pb.ReadRequest(ts=30, table=TABLE, keys=[b"k"])
            opened_before = LtmChannel(0, address, lambda: (0, 0))
            local = LocalLtm(0, hosting, lambda: (0, 0))
            assert len((await opened_before.read(request)).rows) == 1
            assert len((await local.read(request)).rows) == 1
            participant.fenced = "partition 0 is handed over to LTM 1"
            opened_after = LtmChannel(0, address, lambda: (0, 0))
            for channel in (opened_before, opened_after, local):
                with pytest.raises(errors.NotServed, match="handed over to LTM 1"):
                    await channel.read(request)
            for channel in (opened_before, opened_after):
                await channel.close()
            await server.stop(None)
            participant.fenced = None
            await hosting.stop()

    asyncio.run(scenario())


def test_a_log_closed_to_writes_refuses_records(tmp_path: Path) -> None:
    """Once a handover's final flush starts, a record written late would never reach the
    new owner: the log refuses it instead of losing it silently."""

    async def scenario() -> None:
        wal = WriteAheadLog(tmp_path / "log", fsync=False)
        await wal.append({"kind": "prepared", "ts": 1, "after": {}})
        wal.closed_to_writes = "partition 0 is handed over to LTM 1"
        with pytest.raises(errors.FailedPrecondition, match="handed over"):
            await wal.append({"kind": "prepared", "ts": 2, "after": {}})
        await wal.close()
        assert [r["ts"] for r in WriteAheadLog(tmp_path / "log", fsync=False).replay()] == [1]

    asyncio.run(scenario())


# ------------------------------------------------------------------ coordinating members


@pytest.fixture
def replicated_members(tmp_path: Path) -> Iterator[LocalCluster]:
    with replicated_cluster(tmp_path / "data") as cluster:
        yield cluster


def decision_log(cluster: LocalCluster, member: int) -> ownership.Ownership:
    store = open_store(cluster.store_url)
    try:
        return ownership.read(store, decision_log_id(member, cluster.ltms))
    finally:
        store.close()


def member_logs_copied(cluster: LocalCluster, members: list[int]) -> bool:
    """Every partition's log and every member's decision log in sync with its copy."""
    partitions = all(status(cluster, m, partition=m).replicated for m in members)
    return partitions and all(decision_log(cluster, m).in_sync for m in members)


def served_logs_copied(cluster: LocalCluster, member: int) -> bool:
    """Every partition ``member`` serves, and its decision log, in sync with its copy."""
    serving = status(cluster, member).serving
    partitions = all(status(cluster, member, partition=p).replicated for p in serving)
    return partitions and decision_log(cluster, member).in_sync


def check_transfers_and_view(cluster: LocalCluster, outcomes: transfers.Outcomes) -> None:
    """Nothing acknowledged lost, nothing half applied, and the view equals the ledger. A read
    that meets a partition mid-hand-back (UNAVAILABLE: the old owner fenced it, the channels
    not moved yet) is read again."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return _check_transfers_and_view(cluster, outcomes)
        except errors.Unavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _check_transfers_and_view(cluster: LocalCluster, outcomes: transfers.Outcomes) -> None:
    with Client(cluster.address) as client:
        transfers.check(client, "accounts", "ledger", ACCOUNTS, outcomes.committed)
        expected: dict[int, tuple[int, int]] = {}
        for row in client.scan("ledger"):
            n, total = expected.get(row["dst"], (0, 0))
            expected[row["dst"]] = (n + 1, total + row["amount"])
        assert {r["dst"]: (r["n"], r["total"]) for r in client.view("moved")} == expected


def answered(call: Callable[[], object]) -> bool:
    """Whether ``call`` is answered rather than refused as unavailable."""
    try:
        call()
    except errors.Unavailable:
        return False
    return True


def serving_members(cluster: LocalCluster) -> dict[int, int]:
    """Partition -> the member serving it, as the records say (a restarted member gets its
    partitions handed back, so this changes while a test waits)."""
    store = open_store(cluster.store_url)
    try:
        return {p: ownership.read(store, p).owner % 3 for p in range(cluster.ltms)}
    finally:
        store.close()


def nothing_prepared(cluster: LocalCluster) -> bool:
    """No partition holds a prepared transaction, where each is served now (one moving
    meanwhile is asked again)."""
    serving = serving_members(cluster)
    try:
        return all(status(cluster, m, partition=p).prepared == 0 for p, m in serving.items())
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:  # type: ignore[attr-defined]
            raise
        return False


def test_a_dead_member_hands_over_its_partitions_and_decisions(
    replicated_members: LocalCluster,
) -> None:
    """Three members, each hosting a partition and coordinating transfers (two partitions
    each, so most commits go through a decision log). Member 1 dies by kill -9: member 2 (its
    copy's holder) takes its partition and its decision log, member 0 stops waiting for it,
    and every member follows the move. Then member 1 comes back (coordinating only) armed to
    crash right after logging a commit decision: that commit reaches every participant from
    member 2's adopted copy. Nothing acknowledged is lost, nothing is half applied, nothing
    stays prepared, and the view matches the ledger."""
    cluster = replicated_members
    with transfers_running(cluster, clients=6, view=VIEW) as outcomes:
        wait_for("transfers", lambda: len(outcomes.committed) > 50)
        cluster.member(1).kill()
        wait_for("member 2 to serve partition 1", lambda: 1 in status(cluster, 2).serving, 30)
        assert decision_log(cluster, 1).owner == 2  # partition 2's hosting: member 2
        # ``aggview status`` shows it: member 1 down, its partition at member 2
        shown = {m.member: m for m in cluster_status(cluster.member(0).address).members}
        assert not shown[1].up and shown[0].up and shown[2].up
        assert shown[2].partitions is not None and 1 in shown[2].partitions
        before = len(outcomes.committed)
        wait_for("commits after the failover", lambda: len(outcomes.committed) > before + 50)

        # Back, serving nothing (its partition stays with member 2), coordinating; it dies
        # again right after logging its 150th commit decision.
        cluster.member(1).start(
            env={"AGGVIEW_FAILPOINTS": "coordinator.after_decision_logged=crash@150"}
        )
        wait_for("member 1's decision log copied again", lambda: decision_log(cluster, 1).in_sync)
        # 150 decisions take seconds on a quiet machine, over a minute on an overloaded one
        wait_for("member 1 to crash", lambda: not cluster.member(1).running(), 180)
        assert cluster.member(1).process is not None
        assert cluster.member(1).process.returncode == 86
        wait_for(
            "member 2 to adopt member 1's log again",
            lambda: decision_log(cluster, 1).epoch >= 4 and decision_log(cluster, 1).owner == 2,
            30,
        )
        before = len(outcomes.committed)
        wait_for("commits after the second failover", lambda: len(outcomes.committed) > before + 50)
    wait_for("every transaction decided", lambda: nothing_prepared(cluster), 30)
    check_transfers_and_view(cluster, outcomes)


def test_a_commit_logged_after_the_log_was_taken_over_is_forgotten(
    replicated_members: LocalCluster, tmp_path: Path
) -> None:
    """Member 1, back after a kill -9 and coordinating only (its partition stays with member
    2), stalls just before logging a transfer's commit decision, long enough to be declared
    dead: member 2 adopts its decision log from the copy. Member 1 then logs the commit on its
    own disk, the copy refuses it, the transfer fails and member 1 stops. Member 2 answers
    "aborted" for it (the participants have aborted it already), so member 1, started again,
    must forget that commit rather than deliver it or answer "committed": a participant that
    had not asked yet would commit its part of a transaction the others aborted."""
    cluster = replicated_members
    with Client(cluster.address) as client:
        transfers.create(client, "accounts", "ledger", ACCOUNTS)
    wait_for("every log to reach its copy", lambda: member_logs_copied(cluster, [0, 1, 2]))
    cluster.member(1).kill()
    wait_for("member 2 to hold member 1's log", lambda: decision_log(cluster, 1).owner == 2, 30)
    cluster.member(1).start(env={"AGGVIEW_FAILPOINTS": STALL_BEFORE_DECISION})
    wait_for("member 1's log back and copied", lambda: log_back(cluster, 1), 30)
    with (
        Client(cluster.member(1).address, route=False) as client,
        pytest.raises(errors.AggviewError),
    ):
        transfers.transfer(client, "accounts", "ledger", 1, 2, 5, "stalled")
    wait_for("member 1 to stop", lambda: not cluster.member(1).running(), 30)
    assert cluster.member(1).process is not None
    assert cluster.member(1).process.returncode == 88, cluster.member(1).tail()
    store = open_store(cluster.store_url)
    try:
        adopted = ownership.read_adopted(store, decision_log_id(1, cluster.ltms))
    finally:
        store.close()
    assert adopted is not None
    copied = adopted[1]
    stalled = committed_in(cluster.data / "member-1", tmp_path / "member-1-log") - copied
    assert len(stalled) == 1, "the stalled commit is on member 1's disk only"
    assert answered_for(cluster, 2) == [1]  # member 2 holds member 1's log

    # Back, it must deliver no commit at all (armed to crash at the first acknowledgement).
    cluster.member(1).start(env={"AGGVIEW_FAILPOINTS": "coordinator.mid_commit_fanout=crash"})
    wait_for("member 1's log back and copied", lambda: log_back(cluster, 1), 30)
    for member in (0, 1, 2):
        assert outcomes_at(cluster, member, sorted(stalled)) == [pb.OutcomeReply.ABORTED]
    # member 1 answers for itself again: member 2 must not call its new transactions aborted
    assert answered_for(cluster, 2) == []
    assert cluster.member(1).running(), cluster.member(1).tail()
    assert "forgot 1 commits" in cluster.member(1).tail(400)
    wait_for("every transaction decided", lambda: nothing_prepared(cluster), 30)
    with Client(cluster.address) as client:
        transfers.check(client, "accounts", "ledger", ACCOUNTS, [])
        assert not [row for row in client.scan("ledger") if row["id"] == "stalled"]


# the second stall keeps member 1 from stopping on its own watch of its log's record before
# its log's thread wrote the stalled commit (what the test is about); both stall the loop
STALL_BEFORE_DECISION = "coordinator.before_decision_logged=sleep:6;coordinator.superseded=sleep:1"


def log_back(cluster: LocalCluster, member: int) -> bool:
    record = decision_log(cluster, member)
    return record.owner == member and record.in_sync


def committed_in(log_dir: Path, scratch: Path) -> set[int]:
    """The commits a member's decision log in ``log_dir`` holds (read from a copy of it)."""
    scratch.mkdir()
    for segment in log_dir.glob("*.wal"):
        shutil.copy(segment, scratch)

    async def read() -> set[int]:
        decisions = DecisionLog(scratch, fsync=False)
        await decisions.close()
        return set(decisions.committed)

    return asyncio.run(read())


def outcome_reply(cluster: LocalCluster, member: int, timestamps: list[int]) -> pb.OutcomeReply:
    with grpc.insecure_channel(cluster.member(member).address) as channel:
        return pb_grpc.TransactionOutcomeStub(channel).Query(
            pb.OutcomeRequest(ts=timestamps), timeout=10
        )


def outcomes_at(cluster: LocalCluster, member: int, timestamps: list[int]) -> list[int]:
    """What ``member`` answers an in-doubt participant about ``timestamps``."""
    return list(outcome_reply(cluster, member, timestamps).outcomes)


def answered_for(cluster: LocalCluster, member: int) -> list[int]:
    """The other members ``member`` answers for (it holds their decision logs)."""
    return list(outcome_reply(cluster, member, [1]).answers_for)


def test_a_member_declared_dead_while_alive_stops_and_rejoins(
    replicated_members: LocalCluster,
) -> None:
    """Member 1 is paused (SIGSTOP) until member 2 holds its partition and its decision log:
    it was declared dead while alive. Resumed, it can commit nothing any more, so it stops
    with status 88 instead of serving on as a zombie; started again (as ``aggview start
    --replicate`` does), it takes its decision log back and serves clients. Nothing
    acknowledged is lost, nothing is half applied, and the view matches the ledger."""
    cluster = replicated_members
    victim = cluster.member(1).process
    assert victim is not None
    with transfers_running(cluster, clients=6, view=VIEW) as outcomes:
        wait_for("transfers", lambda: len(outcomes.committed) > 50)
        with paused(victim, cluster=cluster):
            wait_for("member 2 to serve partition 1", lambda: 1 in status(cluster, 2).serving, 30)
            wait_for("member 2 to hold member 1's log", lambda: decision_log(cluster, 1).owner == 2)
        wait_for("member 1 to stop", lambda: victim.poll() is not None, 10)
        assert victim.returncode == 88, cluster.member(1).tail()
        assert "declared dead while alive" in cluster.member(1).tail(200)
        cluster.member(1).start()
        wait_for("member 1's decision log copied again", lambda: decision_log(cluster, 1).in_sync)
        assert decision_log(cluster, 1).owner == 1
        with Client(cluster.member(1).address) as client:  # it serves clients again
            # (retried: this process's channels to its address are in reconnect backoff)
            wait_for("a scan at member 1", lambda: answered(lambda: client.scan("accounts")))
            assert len(list(client.scan("accounts"))) == ACCOUNTS
        before = len(outcomes.committed)
        wait_for("commits after the rejoin", lambda: len(outcomes.committed) > before + 50)
    wait_for("every transaction decided", lambda: nothing_prepared(cluster), 30)
    check_transfers_and_view(cluster, outcomes)


def test_a_read_of_a_partition_that_moved_meanwhile_is_read_again_where_it_went() -> None:
    """A scan met a partition just handed back home ("LTM 0 does not serve partition 2", in
    a CI run's check after restarts): the read waits for the partition's channel to point to
    its new home and reads there. Any other refusal is the read's answer at once."""
    from coordinator.transactions import TransactionManager

    class Moved:
        async def read(self, request: pb.ReadRequest) -> pb.ReadReply:
            raise errors.NotServed("LTM 0 does not serve partition 2")

    class Refusing:
        async def read(self, request: pb.ReadRequest) -> pb.ReadReply:
            raise errors.FailedPrecondition("snapshot too old")

    class Home:
        async def read(self, request: pb.ReadRequest) -> pb.ReadReply:
            return pb.ReadReply(rows=[pb.KeyValue(key=b"k", row=b"r")])

    manager = object.__new__(TransactionManager)  # a read needs only its channels
    manager.channels = [Home(), Refusing(), Moved()]  # type: ignore[list-item]

    async def scenario() -> pb.ReadReply:
        asyncio.get_running_loop().call_later(0.2, manager.channels.__setitem__, 2, Home())
        return await manager._read(2, pb.ReadRequest())

    assert [kv.key for kv in asyncio.run(scenario()).rows] == [b"k"]
    with pytest.raises(errors.FailedPrecondition, match="too old"):
        asyncio.run(manager._read(1, pb.ReadRequest()))
