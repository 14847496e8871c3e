"""A load run's report reads without us: plots ticked at the measured sizes with y from 0, no
plot of too few points, a README.md saying how to read each file, tables whole in a pipe."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest
from rich.console import Console

from loadgen import dashboard_report
from loadgen.report import RunReport

SIZES = (1, 10, 50)


def row(mode: str, k: int, **values: Any) -> dict[str, Any]:
    base = {
        "mode": mode,
        "k": k,
        "tx_per_s": 400.0 / k,
        "p99_ms": 20.0 + k,
        "fresh_p50_ms": None if mode == "none" else 5.0 * k,
        "tentative_fresh_p50_ms": None,
        "messages_per_1k": None,
        "cpu_ms_per_event": None,
        "corrective_per_1k": None,
    }
    return {**base, **values}


def report(*modes: str, **cumulus: Any) -> RunReport:
    """A run's rows as ``run_benchmark`` records them (its cumulus mode with ``cumulus``)."""
    rows = [row(mode, k) for mode in modes for k in SIZES]
    if cumulus:
        rows += [row("cumulus spec 500 ms x2 feed 50 ms", k, **cumulus) for k in SIZES]
    settings = {"modes": [*modes], "sizes": list(SIZES), "clients": 8, "seconds": 1.5}
    return RunReport("dashboard", settings=settings, rows=rows)


@pytest.fixture
def drawn() -> Iterator[dict[str, Any]]:
    figures = dashboard_report.plots(
        report(
            "none",
            "sync",
            "async 500 ms",
            messages_per_1k=1040.0,
            tentative_fresh_p50_ms=30.0,
            fresh_p50_ms=400.0,
        )
    )
    yield figures
    for figure in figures.values():
        plt.close(figure)


def test_every_plot_ticks_exactly_the_measured_sizes_from_a_y_of_zero(
    drawn: dict[str, Any],
) -> None:
    for name, figure in drawn.items():
        axes = figure.axes[0]
        assert list(axes.get_xticks()) == list(SIZES), name
        assert [t.get_text() for t in axes.get_xticklabels()] == ["1", "10", "50"], name
        assert axes.get_xticks(minor=True).size == 0, name
        assert axes.get_ylim()[0] == 0, name  # messages: about 1,040 each, from 0 still
        assert "Figure" not in axes.get_title(), name


def test_the_tentative_plot_sets_tentative_reads_beside_committed_ones(
    drawn: dict[str, Any],
) -> None:
    axes = drawn[dashboard_report.TENTATIVE_PLOT].axes[0]
    lines = {line.get_label(): list(line.get_ydata()) for line in axes.get_lines()}
    mode = "cumulus spec 500 ms x2 feed 50 ms"
    assert lines == {f"{mode} committed": [400.0] * 3, f"{mode} tentative": [30.0] * 3}


def test_async_intervals_are_plotted_from_three_on() -> None:
    one = dashboard_report.plots(report("none", "async 500 ms"))
    three = dashboard_report.plots(report("async 50 ms", "async 500 ms", "async 5000 ms"))
    assert dashboard_report.ASYNC_PLOT not in one
    axes = three[dashboard_report.ASYNC_PLOT].axes[0]
    assert list(axes.get_xticks()) == [50, 500, 5000]
    for figure in [*one.values(), *three.values()]:
        plt.close(figure)


def test_the_readme_says_how_to_read_each_file_written(tmp_path: Path) -> None:
    run = report("none", "sync", "async 500 ms", tentative_fresh_p50_ms=30.0, fresh_p50_ms=400.0)
    written = dashboard_report.write_outputs(run, tmp_path)
    readme = (tmp_path / "README.md").read_text()
    assert tmp_path / "README.md" in written
    for path in written:
        if path.suffix == ".png":
            assert f"`{path.name}`" in readme, path.name
    assert dashboard_report.ASYNC_PLOT not in readme  # not drawn: one interval
    assert "tentative reads held a commit at least 2 times sooner" in readme


def test_the_readme_says_why_tentative_reads_were_not_fresher() -> None:
    behind = report(
        tentative_fresh_p50_ms=1800.0, fresh_p50_ms=1900.0, interval_ms=500, feed_ms=50, probes=3
    )
    note = "\n".join(dashboard_report.tentative_note(behind))
    assert "were not clearly fresher in this run" in note
    assert "1 event: 1800 ms against 1900 ms; 10 events: 1800 ms" in note
    assert "over twice the 500 ms epoch: the runtime was behind the load of 8 clients" in note
    assert "only 3 probe(s)" in note
    assert "feed interval" not in note.split("Here:")[1]  # 50 ms is far below the epoch


def test_a_table_printed_to_a_pipe_keeps_every_cell_whole() -> None:
    wide = {f"column_number_{i}": 123456.789 + i for i in range(12)}
    run = RunReport("wide", rows=[{"mode": "cumulus spec 500 ms x2 feed 50 ms", **wide}])
    piped = io.StringIO()
    run.print(["mode", *wide], Console(file=piped))  # not a terminal: 80 columns assumed
    printed = piped.getvalue()
    assert "…" not in printed
    assert "cumulus spec 500 ms x2 feed 50 ms" in printed
    assert all(name in printed for name in wide)
