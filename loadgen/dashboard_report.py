"""The dashboard benchmark's report: throughput ratios, plots, and the README.md that says how to
read them (and why Cumulus's tentative reads were or were not fresher in a run).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadgen.report import RunReport, line_figure, save_figure

if TYPE_CHECKING:  # matplotlib is imported only where a plot is drawn
    from matplotlib.figure import Figure


def ratios(report: RunReport) -> list[dict[str, Any]]:
    """Throughput of each mode over no view, per update size (measured in this run)."""
    base = {r["k"]: r["tx_per_s"] for r in report.rows if r["mode"] == "none"}
    out = []
    for row in report.rows:
        if row["mode"] != "none" and base.get(row["k"]):
            out.append(
                {"mode": row["mode"], "k": row["k"], "ratio": row["tx_per_s"] / base[row["k"]]}
            )
    return out


# a plot per column, a line per mode (modes without the column left out)
PER_MODE_PLOTS = (
    ("fresh_p50_ms", "Freshness: from a commit to the first read holding it (p50)", "ms"),
    ("cpu_ms_per_event", "Server CPU per event", "ms"),
    ("messages_per_1k", "Cumulus runtime messages per 1,000 updates", "messages"),
    ("corrective_per_1k", "Cumulus corrective updates per 1,000 updates", "corrective updates"),
)
TENTATIVE_PLOT = "dashboard_tentative_fresh_p50_ms.png"
ASYNC_PLOT = "dashboard_async_interval.png"
MIN_INTERVALS = 3  # fewer async intervals draw no curve worth a plot

# What each file shows and how to read it, for the report's README.md (a file's entry is
# written when the run wrote the file).
GUIDE = {
    "dashboard.json": "Every measured point (one row per mode and update size) with the "
    "run's settings and machine. `dashboard.csv`: the same rows as a table.",
    "dashboard_throughput_vs_update_size.png": "Committed transactions per second (y) for "
    "each update size, the events one transaction inserts (x), one line per mode: `none` "
    "(no view), `sync` (the view updated in each transaction), `async N ms` (refreshed every "
    "N ms), `cumulus ...` (maintained by a Cumulus runtime in epochs). Higher is better; the "
    "gap between `none` and a mode is what maintaining that view costs writers.",
    ASYNC_PLOT: "Throughput of async views (y) against their refresh interval (x), one line "
    "per update size: how much a longer interval (staler reads) gives back to writers. Drawn "
    f"only when {MIN_INTERVALS} or more intervals were measured.",
    "dashboard_fresh_p50_ms.png": "Freshness (y, median ms): from a probe transaction's "
    "acknowledgment to the first read of the view that holds it, per update size (x). Lower "
    "is fresher: sync is fresh at once, an async view waits for its next refresh, a Cumulus "
    "view for its next committed epoch.",
    TENTATIVE_PLOT: "For each Cumulus view fed between epochs: the freshness (median ms) of "
    "its tentative reads (which hold a commit once its change is fed to the runtime) beside "
    "that of its committed reads (once the epoch holding it commits). The tentative line "
    "should lie below the committed one; see the note below on this run.",
    "dashboard_cpu_ms_per_event.png": "CPU of every server process (ms) per event committed; "
    "only for local clusters (`aggview demo` runs on one cluster of its own, whose "
    "processes also serve its other steps, so it draws none).",
    "dashboard_messages_per_1k.png": "Messages the Cumulus runtime sent per 1,000 updates it "
    "was fed (y from 0): its network cost per update, per update size (x).",
    "dashboard_corrective_per_1k.png": "Corrective updates per 1,000 updates: speculation "
    "that had to be undone. 0 means every speculative update held.",
    "dashboard_latency_p99.png": "The 99th percentile of a transaction's latency (ms), from "
    "its start to its acknowledgment, per update size (x), one line per mode.",
}


def _per_mode(
    rows: list[dict[str, Any]], column: str, suffix: str = ""
) -> dict[str, list[tuple[float, float]]]:
    """A line per mode of ``column`` against the update size (modes without it left out)."""
    series: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        if row.get(column) is not None:
            series.setdefault(row["mode"] + suffix, []).append((row["k"], row[column]))
    return series


def plots(report: RunReport) -> dict[str, Figure]:
    """Every plot the report's rows make, by the file name it is written to."""
    drawn = {
        "dashboard_throughput_vs_update_size.png": line_figure(
            "Throughput vs update size",
            "events per transaction",
            "transactions/s",
            _per_mode(report.rows, "tx_per_s"),
            logx=True,
        )
    }
    intervals: dict[str, list[tuple[float, float]]] = {}
    for row in report.rows:
        if row["mode"].startswith("async"):
            interval = float(row["mode"].split()[1])
            intervals.setdefault(f"k={row['k']}", []).append((interval, row["tx_per_s"]))
    if len({x for points in intervals.values() for x, _ in points}) >= MIN_INTERVALS:
        drawn[ASYNC_PLOT] = line_figure(
            "Async throughput vs refresh interval",
            "refresh interval (ms)",
            "transactions/s",
            intervals,
            logx=True,
        )
    for column, title, unit in PER_MODE_PLOTS:
        if series := _per_mode(report.rows, column):
            drawn[f"dashboard_{column}.png"] = line_figure(
                title, "events per transaction", unit, series, logx=True
            )
    fed = [row for row in report.rows if row.get("tentative_fresh_p50_ms") is not None]
    if fed:
        series = {
            **_per_mode(fed, "tentative_fresh_p50_ms", " tentative"),
            **_per_mode(fed, "fresh_p50_ms", " committed"),
        }
        drawn[TENTATIVE_PLOT] = line_figure(
            "Cumulus freshness: tentative against committed reads (p50)",
            "events per transaction",
            "ms",
            dict(sorted(series.items())),
            logx=True,
        )
    drawn["dashboard_latency_p99.png"] = line_figure(
        "p99 latency vs update size",
        "events per transaction",
        "ms",
        _per_mode(report.rows, "p99_ms", " p99"),
        logx=True,
    )
    return drawn


def write_outputs(report: RunReport, out: Path) -> list[Path]:
    """The report's JSON and CSV, its plots, and a README.md saying how to read them."""
    written = report.write(out)
    written += [save_figure(figure, out / name) for name, figure in plots(report).items()]
    written.append(write_guide(report, out, written))
    return written


def write_guide(report: RunReport, out: Path, written: list[Path]) -> Path:
    """``README.md`` beside the plots: what the run measured, what each file shows and how
    to read it, and whether Cumulus's tentative reads were fresher (and if not, why)."""
    settings = report.settings
    lines = [
        "# The dashboard benchmark",
        "",
        f"Modes {', '.join(settings.get('modes', []))}; update sizes (events per "
        f"transaction) {', '.join(map(str, settings.get('sizes', [])))}; "
        f"{settings.get('clients')} clients committing for {settings.get('seconds')} s per "
        "point, while one more client probes the view's freshness and another reads it whole "
        "(`consistent`: the share of those reads that were exact at their timestamp).",
        "",
    ]
    if report.interrupted:
        lines += ["**Interrupted**: the files hold what was measured until then.", ""]
    names = {path.name for path in written}
    for name, text in GUIDE.items():
        if name in names:
            lines += [f"- `{name}`: {text}", ""]
    lines += tentative_note(report)
    path = out / "README.md"
    path.write_text("\n".join(lines))
    return path


FRESHER = 2.0  # how many times sooner tentative reads must hold a commit to look fresher


def tentative_note(report: RunReport) -> list[str]:
    """Per Cumulus mode fed between epochs: its tentative and committed freshness, and when
    the tentative reads were not clearly fresher, what in this run kept them close."""
    rows = report.rows
    modes = list(dict.fromkeys(r["mode"] for r in rows if r.get("tentative_fresh_p50_ms")))
    lines = ["## Cumulus: tentative against committed reads", ""] if modes else []
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode and r.get("fresh_p50_ms")]
        measured = "; ".join(
            f"{r['k']} event{'' if r['k'] == 1 else 's'}: {r['tentative_fresh_p50_ms']:.0f} ms "
            f"against {r['fresh_p50_ms']:.0f} ms"
            for r in mine
        )
        if all(r["fresh_p50_ms"] >= FRESHER * r["tentative_fresh_p50_ms"] for r in mine):
            lines += [
                f"**{mode}**: tentative reads held a commit at least {FRESHER:g} times sooner "
                f"than committed reads (p50, tentative against committed: {measured}).",
                "",
            ]
            continue
        lines += [
            f"**{mode}**: tentative reads were not clearly fresher in this run (p50, tentative "
            f"against committed: {measured}). A tentative read holds a commit once its change "
            "is fed to the runtime (every feed interval) and applied by the DW nodes; a "
            "committed read once the epoch that holds it commits. Here:",
            "",
            *(f"- {reason}" for reason in _close_because(report, mine)),
            "",
            "With fewer writers and a longer run they come apart, e.g. `aggview bench "
            "dashboard --modes cumulus:500:2:feed50 --clients 1 --seconds 5`.",
            "",
        ]
    return lines


def _close_because(report: RunReport, rows: list[dict[str, Any]]) -> list[str]:
    """What in a run keeps a Cumulus view's tentative reads about as stale as committed ones."""
    epoch, feed = rows[0].get("interval_ms"), rows[0].get("feed_ms")
    slowest = max(r["fresh_p50_ms"] for r in rows)
    probes = min(r["probes"] for r in rows)
    reasons = []
    if epoch and slowest > 2 * epoch:
        reasons.append(
            f"committed reads waited up to {slowest:.0f} ms, over twice the {epoch} ms epoch: "
            f"the runtime was behind the load of {report.settings.get('clients')} clients, "
            "and a tentative read waits for that same runtime to apply what it is fed, so "
            "both waited for it to catch up;"
        )
    if epoch and feed and 2 * feed > epoch:
        reasons.append(f"the feed interval ({feed} ms) is close to the epoch ({epoch} ms);")
    if probes < 10:
        reasons.append(
            f"a point had only {probes} probe(s) (each waits for its commit to be read), so "
            "the medians are rough;"
        )
    return reasons or ["an epoch often closed soon after the probe's commit;"]
