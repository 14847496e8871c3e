"""``aggview demo``, the main job, end to end at a reduced size.

CI runs ``aggview demo --quick`` from a fresh install before the suite (``.ci/run``) and names
its directory in ``AGGVIEW_DEMO_RAN`` (its stdout in ``demo-output.txt``, its report in
``aggview-report/``): the test then checks that run, the user's own, instead of running the same
demo again. Anywhere else it runs the demo here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loadgen.demo import quick_size, run_demo


@pytest.fixture
def demo_run(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    """The quick demo's output and report directory: CI's run from the user's install, or one
    run now (on the session's Spark)."""
    ran = os.environ.get("AGGVIEW_DEMO_RAN")
    if ran:
        return (Path(ran) / "demo-output.txt").read_text(), Path(ran) / "aggview-report"
    request.getfixturevalue("spark")
    capsys = request.getfixturevalue("capsys")
    run_demo(tmp_path / "data", out=tmp_path / "report", size=quick_size())
    return capsys.readouterr().out, tmp_path / "report"


def test_demo_runs_end_to_end_and_writes_its_report(demo_run: tuple[str, Path]) -> None:
    output, report = demo_run
    assert "loaded 3000 events" in output
    assert output.count("verified") >= 3  # transfers, views, benchmark modes
    assert "…" not in output  # captured, not a terminal: every table cell whole
    written = {p.name for p in report.iterdir()}
    assert {"dashboard.json", "dashboard_throughput_vs_update_size.png", "README.md"} <= written
    assert "dashboard_async_interval.png" not in written  # one interval is no curve
    readme = (report / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in written if name.endswith(".png"))
    assert "tentative reads" in readme  # fresher than committed ones, or why not
