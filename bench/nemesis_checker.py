"""The nemesis's checker: judges a History against the final state and the members' logs, per
fault and per kind of fault (what was lost, half applied, seen out of order, how long the
cluster was unavailable), and the table and failures reported.
"""

from __future__ import annotations

import bisect
import datetime
import math
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from aggclient import Client
from aggview import errors
from bench.nemesis_faults import Fault
from bench.nemesis_workload import (
    ACCOUNT_COUNT,
    ACCOUNTS,
    LEDGER,
    VIEW,
    Commit,
    History,
    Scan,
    recompute,
)
from bench.netns import HostCluster
from loadgen import transfers

_FAULTED = re.compile(r"member (\d+)")
# log lines worth quoting: who leads, who is declared dead, what moved, what was forgotten
NOTABLE = re.compile(
    r"leads \(term|declared dead|takes over|forgot|fell out of sync|no in-sync standby|"
    r"deposed|no longer leads|exited|Traceback|ERROR|CRITICAL|clock stream"
)
_LEADS = re.compile(r"member (\d+) leads \(term (\d+)\)")
_TERM = re.compile(r"(?:leads|takes the lead|took the lead) \(term (\d+)\)")
_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
# "recovered s": back to this share of the calm rate over a window this long; the calm rate
# over at most the last CALM_WINDOW s before the fault
RECOVERED_SHARE, RATE_WINDOW, CALM_WINDOW = 0.8, 1.0, 2.0
NOT_RECOVERED, NO_CALM_RATE = "not recovered", "no calm rate"


def realtime_violations(commits: list[Commit], scans: list[Scan]) -> list[tuple[float, str]]:
    """Operations whose timestamp is not above (a scan: not at least) that of every transfer
    acknowledged before they started; (start, description) each."""
    ended = sorted(commits, key=lambda c: c.end)
    ends = [c.end for c in ended]
    highest: list[int] = []
    for c in ended:
        highest.append(max(highest[-1], c.timestamp) if highest else c.timestamp)

    def before(start: float) -> int:
        i = bisect.bisect_left(ends, start)
        return highest[i - 1] if i else -1

    found = [
        (c.start, f"transfer {c.ref} got {c.timestamp} after {before(c.start)} was acknowledged")
        for c in commits
        if c.timestamp <= before(c.start)
    ]
    found += [
        (s.start, f"snapshot at {s.timestamp} after {before(s.start)} was acknowledged")
        for s in scans
        if s.timestamp < before(s.start)
    ]
    return sorted(found)


def read_logs(cluster: HostCluster) -> list[tuple[float, int, str]]:
    """The members' notable log lines as (time.monotonic() equivalent, member, line)."""
    offset = time.time() - time.monotonic()
    found = []
    for m in range(cluster.members):
        path = cluster.log_path(m)
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            match = _LOG_TIME.match(line)
            if match and NOTABLE.search(line):
                stamp = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
                found.append((stamp.timestamp() - offset, m, line))
    return sorted(found)


def final_state(address: str, timeout: float = 90.0) -> dict[str, Any]:
    """Accounts, ledger and view from one snapshot, once the cluster answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with Client(address, timeout=10) as client, client.snapshot() as snap:
                return {
                    "balances": snap.scan(ACCOUNTS),
                    "ledger": snap.scan(LEDGER),
                    "view": snap.view(VIEW),
                }
        except errors.AggviewError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def evidence(
    logs: list[tuple[float, int, str]], at: float | None, starts: list[float]
) -> list[str]:
    """The notable log lines from 15 s before to 3 s after the first violation seen."""
    if at is None:
        return []
    zero = starts[0] if starts else 0.0
    return [
        f"+{when - zero:.2f}s m{member} {line}"
        for when, member, line in logs
        if at - 15 <= when <= at + 3
    ]


@dataclass
class _Windows:
    """A row of counts per fault's window (its start to the next one's), and one for what
    came before the first fault."""

    starts: list[float]
    rows: list[dict[str, Any]]
    before: dict[str, Any]

    @classmethod
    def of(cls, faults: list[Fault]) -> _Windows:
        starts = [f.start for f in faults]
        rows: list[dict[str, Any]] = [
            {
                "kind": f.kind,
                "detail": f.detail,
                "at s": f.start - starts[0],
                **dict.fromkeys(COUNTS, 0),
            }
            for f in faults
        ]
        before = {"kind": "(before faults)", "detail": "", **dict.fromkeys(COUNTS, 0)}
        return cls(starts, rows, before)

    def row(self, at: float) -> dict[str, Any]:
        """The row of the window that holds ``at``."""
        i = bisect.bisect_right(self.starts, at) - 1
        return self.rows[i] if i >= 0 else self.before


def _count_scans(windows: _Windows, scans: list[Scan]) -> None:
    for scan in scans:
        target = windows.row(scan.start)
        target["inconsistent"] += scan.inconsistent
        target["partial"] += scan.partial
        target["view wrong"] += scan.view_wrong
        target["stale"] += scan.stale > 0


def _count_unknown(
    windows: _Windows, unknown: list[tuple[float, str]], ledger: dict[str, Any]
) -> Counter[str]:
    """Counts each unknown outcome in its window; how they resolved (the ledger row there or
    not)."""
    resolved: Counter[str] = Counter()
    for start, ref in unknown:
        windows.row(start)["unknown"] += 1
        resolved["committed" if ref in ledger else "not committed"] += 1
    return resolved


def _count_lead_changes(windows: _Windows, logs: list[tuple[float, int, str]]) -> None:
    terms: dict[int, float] = {}  # each term the logs name, when first named
    for at, _, line in logs:
        if found := _TERM.search(line):
            terms.setdefault(int(found.group(1)), at)
    for at in terms.values():
        windows.row(at)["lead changes"] += 1


def _terms_led_by_two(logs: list[tuple[float, int, str]]) -> dict[int, list[int]]:
    leaders: dict[int, set[int]] = {}
    for _, _, line in logs:
        if found := _LEADS.search(line):
            leaders.setdefault(int(found.group(2)), set()).add(int(found.group(1)))
    return {t: sorted(m) for t, m in leaders.items() if len(m) > 1}


def _measure_windows(windows: _Windows, faults: list[Fault], history: History, end: float) -> None:
    """Each fault's unavailability (all transfers, and other members' partitions) and how
    long the cluster took to settle after the heal."""
    acks = sorted(c.end for c in history.commits)
    starts, rows = windows.starts, windows.rows
    for i, fault in enumerate(faults):
        stop = starts[i + 1] if i + 1 < len(faults) else end
        rows[i]["unavailable s"] = longest_gap(fault.start, acks, stop)
        rows[i]["others s"] = others_gap(history.probes, fault, stop)
        rows[i]["worst other s"] = member_gap(history.probes, fault, stop)
        rows[i]["settled s"] = None if fault.settled is None else fault.settled - fault.healed
        calm_from = fault.start - CALM_WINDOW if fault.calm_from is None else fault.calm_from
        rate = calm_rate(acks, calm_from, fault.start)
        rows[i]["calm rate /s"] = rate
        rows[i]["recovered s"] = recovered(acks, rate, fault.healed, stop)
        rows[i]["healed at s"] = fault.healed - starts[0]
        rows[i]["per s after heal"] = per_second(acks, fault.healed, stop)


def calm_rate(acks: list[float], calm_from: float, start: float) -> float:
    """Acknowledged transfers per second in the calm before a fault: from ``calm_from`` (the
    previous fault settled, or the wait for it was given up) to the fault's start, at most
    its last CALM_WINDOW s (the harness's wait after a heal holds the previous recovery;
    ``acks`` sorted)."""
    begin = max(calm_from, start - CALM_WINDOW)
    if start <= begin:
        return 0.0
    return (bisect.bisect_left(acks, start) - bisect.bisect_left(acks, begin)) / (start - begin)


def recovered(acks: list[float], rate: float, healed: float, stop: float) -> float | str:
    """Seconds from the heal to the first acknowledgement from which the next RATE_WINDOW s
    (it included) hold at least RECOVERED_SHARE of ``rate`` (the calm rate) times the window:
    when full throughput was back, at once (0.0) if it never left. The window must end by
    ``stop`` (the next fault, or the run's end); if none does, NOT_RECOVERED, never a number;
    NO_CALM_RATE if the calm rate was 0 (nothing to be back to). ``acks`` sorted."""
    if rate <= 0:
        return NO_CALM_RATE
    need = RECOVERED_SHARE * rate * RATE_WINDOW
    for i in range(bisect.bisect_left(acks, healed), len(acks)):
        begin = acks[i]
        if begin + RATE_WINDOW > stop:
            break
        if bisect.bisect_left(acks, begin + RATE_WINDOW) - i >= need:
            return begin - healed
    return NOT_RECOVERED


def per_second(acks: list[float], begin: float, stop: float) -> list[int]:
    """Acknowledgements in each whole second from ``begin`` to ``stop``: what "recovered s"
    does not say (a dip after the rate was first back) stays visible in the JSON."""
    edges = [begin + k for k in range(int(stop - begin) + 1)]
    return [
        bisect.bisect_left(acks, b) - bisect.bisect_left(acks, a)
        for a, b in zip(edges, edges[1:], strict=False)
    ]


def recovery_summary(values: list[float | str]) -> dict[str, Any]:
    """p50 and max of a kind's "recovered s" (NOT_RECOVERED counts as infinite, so a p50 or
    max it reaches is said as such; faults without a calm rate are left out), and how many did
    not recover."""
    ranked = sorted(math.inf if isinstance(v, str) else v for v in values if v != NO_CALM_RATE)

    def said(value: float | None) -> float | str | None:
        return NOT_RECOVERED if value == math.inf else value

    return {
        "recovered p50 s": said(statistics.median(ranked)) if ranked else None,
        "recovered max s": said(ranked[-1]) if ranked else None,
        "not recovered": values.count(NOT_RECOVERED),
        "no calm rate": values.count(NO_CALM_RATE),
    }


def _bad_times(
    lost: list[Commit], violations: list[tuple[float, str]], scans: list[Scan]
) -> list[float]:
    """When each safety violation was seen: lost transfers, real-time order, bad snapshots."""
    bad_times = [c.end for c in lost] + [at for at, _ in violations]
    bad_times += [s.start for s in scans if s.inconsistent or s.partial or s.stale]
    bad_times += [s.start for s in scans if s.view_wrong]
    return bad_times


def _final_checks(final: dict[str, Any]) -> tuple[dict[int, int], int, bool]:
    """The final snapshot against its ledger: accounts off by how much, the total, and whether
    the view equals its recomputation."""
    balances = {r["id"]: r["balance"] for r in final["balances"]}
    expected, groups = recompute(final["ledger"])
    off = {i: balances.get(i, 0) - expected[i] for i in expected if balances.get(i) != expected[i]}
    view = {r["dst"]: (r["n"], r["total"]) for r in final["view"]}
    return off, sum(balances.values()), view == groups


def analyse(
    history: History,
    faults: list[Fault],
    final: dict[str, Any],
    logs: list[tuple[float, int, str]],
    end: float,
) -> dict[str, Any]:
    """Per fault and per kind: injected, lost, partial, bad snapshots, real-time violations,
    unknown outcomes, exits, leader changes and the unavailability window."""
    windows = _Windows.of(faults)
    starts = windows.starts
    ledger = {row["id"]: row for row in final["ledger"]}
    lost = [c for c in history.commits if c.ref not in ledger]
    for c in lost:
        windows.row(c.end)["lost"] += 1
    _count_scans(windows, history.scans)
    violations = realtime_violations(history.commits, history.scans)
    for at, _ in violations:
        windows.row(at)["realtime"] += 1
    resolved = _count_unknown(windows, history.unknown, ledger)
    for at, _, _ in history.exits:
        windows.row(at)["exits"] += 1
    _count_lead_changes(windows, logs)
    bad_times = _bad_times(lost, violations, history.scans)
    _measure_windows(windows, faults, history, end)
    off, total, view_exact = _final_checks(final)
    return {
        "faults": windows.rows,
        "before_faults": windows.before,
        "kinds": summarise(windows.rows),
        "final": {
            "acknowledged": len(history.commits),
            "lost": len(lost),
            "lost_examples": [c.ref for c in lost[:5]],
            "accounts_off_by_ledger": off,
            "total": total,
            "invariant": transfers.INITIAL * ACCOUNT_COUNT,
            "view_exact": view_exact,
            "unknown": len(history.unknown),
            "unknown_resolved": dict(resolved),
            "refused": history.refused,
            "scans": len(history.scans),
            "scan_errors": dict(history.scan_errors),
            "client_errors": dict(history.client_errors),
            "realtime_violations": [text for _, text in violations[:20]],
            "terms_led_by_two": _terms_led_by_two(logs),
            "first_violation": min(bad_times) - starts[0] if bad_times and starts else None,
            "evidence": evidence(logs, min(bad_times) if bad_times else None, starts),
            "exits": [
                (round(at - starts[0], 1) if starts else at, m, code)
                for at, m, code in history.exits
            ],
        },
    }


COUNTS = (
    "lost",
    "partial",
    "inconsistent",
    "view wrong",
    "stale",
    "realtime",
    "unknown",
    "exits",
    "lead changes",
)


def _others_keys(
    probes: list[tuple[int, float, int | None]], fault: Fault
) -> dict[int, set[int]] | None:
    """For a fault of one member: the probe keys of each other member (their home before
    the fault); None for faults of several members or a link."""
    found = _FAULTED.search(fault.detail)
    if found is None or "members" in fault.detail:
        return None
    faulted = int(found.group(1))
    served: dict[int, int | None] = {}  # each key's home member
    for key, at, member in probes:
        if at < fault.start:
            served[key] = member
    homes: dict[int, set[int]] = {}
    for key, member in served.items():
        if member is not None and member != faulted:
            homes.setdefault(member, set()).add(key)
    return homes


def others_gap(
    probes: list[tuple[int, float, int | None]], fault: Fault, stop: float
) -> float | None:
    """For a fault of one member: the longest gap, from the fault's start to ``stop``, between
    acknowledged one-row writes on the partitions whose home is another member (None for
    faults of several members or a link)."""
    homes = _others_keys(probes, fault)
    keys = set().union(*homes.values()) if homes else set()
    if not keys:
        return None
    return longest_gap(fault.start, sorted(at for key, at, _ in probes if key in keys), stop)


def member_gap(
    probes: list[tuple[int, float, int | None]], fault: Fault, stop: float
) -> float | None:
    """As ``others_gap``, but each other member's own keys apart, the worst member's gap:
    the union of the others' writes hides one member stalled while another goes on (a
    member whose log copies are on the cut one waits for them; the other does not)."""
    homes = _others_keys(probes, fault)
    if not homes:
        return None
    return max(
        longest_gap(fault.start, sorted(at for key, at, _ in probes if key in keys), stop)
        for keys in homes.values()
    )


def longest_gap(start: float, acks: list[float], stop: float) -> float:
    """The longest time from ``start`` to ``stop`` without an acknowledgement (``acks``
    sorted; those outside the window are ignored)."""
    inside = acks[bisect.bisect_right(acks, start) : bisect.bisect_left(acks, stop)]
    points = [start, *inside, stop]
    return max(b - a for a, b in zip(points, points[1:], strict=False))


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per kind: sums of the counts, the unavailability's p50 and max, and the time
    back to full throughput after the heal (p50, max, how many never came back)."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        kinds.setdefault(row["kind"], []).append(row)
    summary = []
    for kind, group in kinds.items():
        gaps = [r["unavailable s"] for r in group]
        others = [r["others s"] for r in group if r.get("others s") is not None]
        worst = [r["worst other s"] for r in group if r.get("worst other s") is not None]
        summary.append(
            {
                "kind": kind,
                "injected": len(group),
                **{name: sum(r[name] for r in group) for name in COUNTS},
                "unavailable p50 s": statistics.median(gaps),
                "unavailable max s": max(gaps),
                "others p50 s": statistics.median(others) if others else None,
                "others max s": max(others) if others else None,
                "worst other p50 s": statistics.median(worst) if worst else None,
                "worst other max s": max(worst) if worst else None,
                **recovery_summary([r["recovered s"] for r in group]),
            }
        )
    return summary


def safety_failures(report: dict[str, Any]) -> list[str]:
    """What broke the safety checks (empty: none): the things a test asserts."""
    final, failures = report["final"], []
    if final["lost"]:
        failures.append(f"{final['lost']} acknowledged transfers lost")
    if final["accounts_off_by_ledger"]:
        failures.append(f"balances disagree with the ledger: {final['accounts_off_by_ledger']}")
    if final["total"] != final["invariant"]:
        failures.append(f"total {final['total']} instead of {final['invariant']}")
    if final["terms_led_by_two"]:
        failures.append(f"two members led one term: {final['terms_led_by_two']}")
    if not final["view_exact"]:
        failures.append("the view differs from its recomputation from the ledger")
    rows = [report["before_faults"], *report["faults"]]
    for name in ("inconsistent", "partial", "view wrong", "stale", "realtime"):
        count = sum(r[name] for r in rows)
        if count:
            failures.append(f"{count} snapshots/transactions: {name}")
    return failures


def _said(value: float | str | None) -> str:
    """A table cell: "-" for nothing, "never" for not recovered, else one decimal."""
    if value is None:
        return "-"
    return "never" if isinstance(value, str) else f"{value:.1f}"


def table(report: dict[str, Any]) -> str:
    """The per-kind table, as text."""
    header = [
        "kind",
        "injected",
        *COUNTS,
        "unavail p50 s",
        "unavail max s",
        "others p50 s",
        "others max s",
        "worst other p50 s",
        "worst other max s",
        "recovered p50 s",
        "recovered max s",
        "not recovered",
    ]
    lines = [header]
    for row in report["kinds"]:
        lines.append(
            [
                row["kind"],
                str(row["injected"]),
                *(str(row[name]) for name in COUNTS),
                f"{row['unavailable p50 s']:.1f}",
                f"{row['unavailable max s']:.1f}",
                *(
                    "-" if row.get(name) is None else f"{row[name]:.1f}"
                    for name in (
                        "others p50 s",
                        "others max s",
                        "worst other p50 s",
                        "worst other max s",
                    )
                ),
                *(_said(row.get(name)) for name in ("recovered p50 s", "recovered max s")),
                str(row.get("not recovered", 0)),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines
    )
