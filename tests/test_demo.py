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
    written = {p.name for p in (tmp_path / "report").iterdir()}
    assert {"dashboard.json", "dashboard_throughput_vs_update_size.png"} <= written
