"""What a load run writes: its measurements as JSON and CSV, PNG plots, and a summary table.

Every generator records one row per measured point (a mode, an update size, a mix...) into a
:class:`RunReport`; the files are written even when a run is interrupted, with what it measured.
"""

from __future__ import annotations

import csv
import json
import math
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, RenderableType
from rich.table import Table

if TYPE_CHECKING:  # matplotlib is imported only where a plot is drawn
    from matplotlib.figure import Figure


def percentiles(latencies: Sequence[float]) -> dict[str, float | None]:
    """p50, p95, p99 and max of latencies (in the unit given), None when there are none."""
    if not latencies:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    ordered = sorted(latencies)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": ordered[-1]}


@dataclass
class RunReport:
    """Settings and measured rows of one run."""

    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    interrupted: bool = False

    def add(self, **row: Any) -> dict[str, Any]:
        self.rows.append(row)
        return row

    def write(self, out_dir: Path) -> list[Path]:
        """``<name>.json`` (settings, machine, rows) and ``<name>.csv`` (rows)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        json_path = out_dir / f"{self.name}.json"
        json_path.write_text(
            json.dumps(
                {
                    "name": self.name,
                    "started": self.started,
                    "interrupted": self.interrupted,
                    "machine": {"python": platform.python_version(), "cpus": _cpus()},
                    "settings": self.settings,
                    "rows": self.rows,
                },
                indent=2,
                default=str,
            )
        )
        csv_path = out_dir / f"{self.name}.csv"
        columns = list(dict.fromkeys(k for row in self.rows for k in row))
        with csv_path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(self.rows)
        return [json_path, csv_path]

    def table(self, columns: Sequence[str], title: str | None = None) -> Table:
        table = Table(title=title or self.name)
        for column in columns:
            table.add_column(column, justify="right")
        for row in self.rows:
            table.add_row(*(_cell(row.get(c)) for c in columns))
        return table

    def print(self, columns: Sequence[str], console: Console | None = None) -> None:
        print_whole(console or Console(), self.table(columns))


def print_whole(console: Console, renderable: RenderableType) -> None:
    """Prints a table with every cell whole. Rich fits a table to the console's width, and
    where that is not a terminal's (a pipe, a file) it assumes 80 columns and cuts cells to
    '…': there the console is widened to the table's natural width for this print."""
    if console.is_terminal:
        console.print(renderable)
        return
    natural = console.measure(renderable, options=console.options.update_width(10_000)).maximum
    width = console.width
    console.width = max(width, natural)
    try:
        console.print(renderable)
    finally:
        console.width = width


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


def line_figure(
    title: str,
    xlabel: str,
    ylabel: str,
    series: dict[str, list[tuple[float, float]]],
    *,
    logx: bool = False,
) -> Figure:
    """One line per series of (x, y) points. The x axis is ticked at exactly the measured x
    values (a log axis ticks only powers of ten, so 50 was a point without a label) and the
    y axis starts at 0, so that a difference looks as large as it is."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for label, points in series.items():
        ordered = sorted(points)
        axes.plot([x for x, _ in ordered], [y for _, y in ordered], marker="o", label=label)
    if logx:
        axes.set_xscale("log")
    measured = sorted({x for points in series.values() for x, _ in points})
    axes.xaxis.set_major_locator(FixedLocator(measured))
    axes.xaxis.set_major_formatter(FixedFormatter([f"{x:g}" for x in measured]))
    axes.xaxis.set_minor_locator(NullLocator())
    axes.set_ylim(bottom=0)
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    if series:  # below the axes: inside, it hid a line at the top (messages: a flat one)
        axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize="small")
    figure.tight_layout()
    return figure


def save_figure(figure: Figure, path: Path) -> Path:
    """A figure as a PNG at ``path`` (its folder made), and closed."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def bar_plot(path: Path, title: str, ylabel: str, bars: dict[str, float]) -> Path:
    """One bar per label, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    axes.bar(list(bars), list(bars.values()))
    axes.set_title(title)
    axes.set_ylabel(ylabel)
    axes.tick_params(axis="x", rotation=30)
    figure.tight_layout()
    return save_figure(figure, path)
