"""Members on separate hosts (network namespaces on a bridge) under a nemesis: every fault kind of
bench.nemesis once, while transfers, snapshot scans and a sync view run. The safety checks are
asserted (nothing acknowledged lost, nothing half applied, every snapshot consistent, the view
exact, real-time order kept); the unavailability per fault is printed, not asserted. The checker
itself is tested on made-up histories first, so a clean run means something."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from profiles import PROFILE

from bench import nemesis, nemesis_checker, nemesis_faults, nemesis_workload
from bench.nemesis_faults import Fault
from bench.nemesis_workload import Commit, Scan
from bench.netns import PREFIX, Network, listening_socket_in, unavailable
from loadgen import transfers


def test_realtime_order_flags_a_timestamp_below_an_acknowledged_one() -> None:
    """The symptom of two members granting timestamps: a transaction that started after another
    was acknowledged gets a smaller timestamp; a snapshot misses an acknowledged timestamp."""
    commits = [Commit(0.0, 1.0, 100, "a"), Commit(0.5, 1.5, 90, "overlaps a: fine")]
    assert nemesis_checker.realtime_violations(commits, []) == []
    commits.append(Commit(2.0, 3.0, 95, "after a, below it"))
    scans = [Scan(4.0, 4.5, 99, False, False, False, 0), Scan(4.0, 4.5, 100, *[False] * 3, 0)]
    found = nemesis_checker.realtime_violations(commits, scans)
    assert [text.split()[0] for _, text in found] == ["transfer", "snapshot"], found


def test_the_others_gap_counts_only_the_partitions_the_faulted_member_did_not_serve() -> None:
    """Keys 0 and 1 were served by member 2 (cut off at 10 s), key 2 by member 0: only key 2's
    writes measure how long the rest of the cluster stopped; a fault of two members has none."""
    probes = [(0, 9.0, 2), (1, 9.5, 2), (2, 9.8, 0)]
    probes += [(2, 10.0 + 0.1 * i, 0) for i in range(1, 11)] + [(2, 12.5, 0), (0, 16.0, 2)]
    cut = Fault("follower-cut", 10.0, detail="follower member 2 cut off 6.0s")
    assert nemesis_checker.others_gap(probes, cut, stop=13.0) == pytest.approx(1.5)
    two = Fault("two-lost", 10.0, detail="members 1 and 2 killed 0.5s apart, restarted")
    assert nemesis_checker.others_gap(probes, two, stop=13.0) is None
    nobody_else = Fault("kill", 10.0, detail="member 0 killed, restarted after 1.0s")
    assert nemesis_checker.others_gap([(0, 9.0, 0)], nobody_else, stop=13.0) is None


def test_the_worst_other_gap_sees_one_member_stalled_while_another_goes_on() -> None:
    """Member 2 cut off at 10 s; member 0's key (3) stalls 1.2 s waiting for its copy on
    member 2 while member 1's key (2) goes on: the union of the others' writes shows no gap,
    the worst other member's own writes do."""
    probes = [(0, 9.0, 2), (2, 9.8, 1), (3, 9.9, 0)]
    probes += [(2, 10.0 + 0.1 * i, 1) for i in range(1, 31)]
    probes += [(3, 11.2 + 0.1 * i, 0) for i in range(19)]
    cut = Fault("follower-cut", 10.0, detail="follower member 2 cut off 6.0s")
    assert nemesis_checker.others_gap(probes, cut, stop=13.0) == pytest.approx(0.1)
    assert nemesis_checker.member_gap(probes, cut, stop=13.0) == pytest.approx(1.2)


def _steady(begin: float, end: float, per_s: float) -> list[float]:
    """Acknowledgements at ``per_s`` a second from ``begin`` up to ``end``."""
    return [begin + i / per_s for i in range(round((end - begin) * per_s))]


def test_recovered_is_the_time_from_the_heal_until_the_rate_is_back() -> None:
    """20 a second in the calm before a fault at 10 s, nothing while it lasts, healed at 16 s,
    next fault at 25 s: back at once (0 s), after 3 s, or not before the next fault (said so,
    never 0), and a fault with no calm rate is said to have none."""
    calm = _steady(5.0, 10.0, 20)
    rate = nemesis_checker.calm_rate(calm, 7.0, 10.0)
    assert rate == pytest.approx(20.0)  # the last 2 s of the calm (from 8 s) only
    at_once = calm + _steady(16.0, 25.0, 20)
    assert nemesis_checker.recovered(at_once, rate, 16.0, 25.0) == pytest.approx(0.0)
    after_3 = calm + _steady(16.0, 19.0, 2) + _steady(19.0, 25.0, 20)  # a trickle, then back
    assert nemesis_checker.recovered(after_3, rate, 16.0, 25.0) == pytest.approx(3.0)
    # 12 a second is under 80% of 20: not back before the next fault at 25 s; had it come
    # later, a window from about 24.5 s (half at 12, half at 20 a second) would have been
    never = calm + _steady(16.0, 25.0, 12) + _steady(25.0, 31.0, 20)
    assert nemesis_checker.recovered(never, rate, 16.0, 25.0) == nemesis_checker.NOT_RECOVERED
    assert nemesis_checker.recovered(never, rate, 16.0, 31.0) == pytest.approx(8.5, abs=0.1)
    assert nemesis_checker.per_second(after_3, 16.0, 25.0) == [2, 2, 2, 20, 20, 20, 20, 20, 20]
    assert nemesis_checker.calm_rate(at_once[100:], 7.0, 10.0) == 0.0
    assert nemesis_checker.recovered(at_once, 0.0, 16.0, 25.0) == nemesis_checker.NO_CALM_RATE


def test_a_kind_whose_faults_did_not_recover_says_so_in_its_p50_and_max() -> None:
    never, none = nemesis_checker.NOT_RECOVERED, nemesis_checker.NO_CALM_RATE
    summary = nemesis_checker.recovery_summary([1.0, 3.0, never, none])
    assert summary == {
        "recovered p50 s": 3.0,
        "recovered max s": never,
        "not recovered": 1,
        "no calm rate": 1,
    }
    assert nemesis_checker.recovery_summary([1.0, never])["recovered p50 s"] == never
    assert nemesis_checker.recovery_summary([none])["recovered p50 s"] is None


def test_a_snapshot_check_sees_a_half_applied_or_missing_transfer() -> None:
    start = transfers.INITIAL
    balances = [{"id": i, "balance": start} for i in range(nemesis_workload.ACCOUNT_COUNT)]
    ledger = [{"id": "t1", "src": 0, "dst": 1, "amount": 5}]
    view = [{"dst": 1, "n": 1, "total": 5}]
    balances[0]["balance"] -= 5
    balances[1]["balance"] += 5
    assert nemesis_workload.check_scan(balances, ledger, view, ["t1"]) == (False, False, False, 0)
    assert nemesis_workload.check_scan(balances, [], [], ["t1"]) == (
        False,
        True,
        False,
        1,
    )  # row lost
    balances[1]["balance"] -= 5  # only the debit applied
    assert nemesis_workload.check_scan(balances, ledger, [], []) == (True, True, True, 0)


needs_hosts = pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "")


def _ours() -> list[str]:
    """This process's namespaces: others on the machine (and the stale ones a new network
    sweeps away) come and go on their own."""
    mine = f"{PREFIX}{os.getpid()}"
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(mine)]


@needs_hosts
def test_hosts_reach_each_other_on_their_own_addresses_and_are_removed() -> None:
    network = Network(2).create()
    try:
        listening = listening_socket_in(network.host_ns(1), network.ip_of(1), 9000)
        connect = f"import socket; socket.create_connection(('{network.ip_of(1)}', 9000), 2)"
        command = ["ip", "netns", "exec", network.host_ns(0), sys.executable, "-c", connect]
        assert subprocess.run(command, capture_output=True).returncode == 0
        network.cut(1)
        assert subprocess.run(command, capture_output=True).returncode != 0
        network.heal(1)
        assert subprocess.run(command, capture_output=True).returncode == 0
        listening.close()
    finally:
        network.destroy()
    assert not _ours()


# The faults the ``ci`` profile leaves to tests of their own, where they are the point (a kill
# under load: test_failover.py and test_members.py; a paused leader: test_leader_failover.py;
# two members lost for good: test_failover.py); ``thorough`` runs every kind here too.
ELSEWHERE = {"kill", "pause", "two-lost"}
IN_THIS_PROFILE = [k for k in nemesis_faults.KINDS if PROFILE == "thorough" or k not in ELSEWHERE]


@needs_hosts
def test_every_fault_kind_once_keeps_every_safety_check(tmp_path: Path) -> None:
    # two transfer threads, not the command's four: every check runs the same, at about two
    # thirds of the CPU (the suite's budget; the long run is the command's)
    config = nemesis.Config(
        faults=len(IN_THIS_PROFILE),
        kinds=list(IN_THIS_PROFILE),
        seed=45,
        warmup=2.0,
        calm=0.5,
        settle_timeout=8.0,
        clients=2,
        after_heal=0.0,  # the recovery's window: the command's, not the suite's time
    )
    try:
        report = nemesis.run(config, tmp_path / "data")
    finally:
        assert not _ours(), "namespaces left behind"
    (tmp_path / "nemesis.json").write_text(json.dumps(report, indent=1, default=str))
    print(nemesis_checker.table(report))  # the availability figures: reported, not asserted
    assert "recovered p50 s" in nemesis_checker.table(report).splitlines()[0]
    for row in report["kinds"]:
        assert {"recovered p50 s", "recovered max s", "not recovered"} <= row.keys()
    assert all("recovered s" in row for row in report["faults"])
    print("liveness failures (every member restarted to read):", report["liveness_failures"])
    failures = report["safety_failures"]
    evidence = report["final"]["evidence"]
    assert not failures, "\n".join([*failures, "member logs:", *evidence])
