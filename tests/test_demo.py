"""``aggview demo``, the main job, end to end at a reduced size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loadgen.demo import quick_size, run_demo


def test_demo_runs_end_to_end_and_writes_its_report(
    spark: Any, tmp_path: Path, capsys: Any
) -> None:
    size = quick_size()
    run_demo(tmp_path / "data", out=tmp_path / "report", size=size)
    output = capsys.readouterr().out
    assert "loaded 3000 events" in output
    assert output.count("verified") >= 3  # transfers, views, benchmark modes
    assert "…" not in output  # captured, not a terminal: every table cell whole
    written = {p.name for p in (tmp_path / "report").iterdir()}
    assert {"dashboard.json", "dashboard_throughput_vs_update_size.png", "README.md"} <= written
    assert "dashboard_async_interval.png" not in written  # one interval is no curve
    readme = (tmp_path / "report" / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in written if name.endswith(".png"))
    assert "tentative reads" in readme  # fresher than committed ones, or why not
