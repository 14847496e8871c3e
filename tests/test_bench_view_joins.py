"""``python -m bench.view_joins`` (the cost table of issue #41): every construct runs on a small
table, and both incremental paths it times end equal to duckdb's recomputation (the command
stops otherwise), so its figures are of views that are right."""

from __future__ import annotations

import pytest

from bench import view_joins


def test_every_construct_is_measured_and_both_paths_equal_duckdb(
    capsys: pytest.CaptureFixture[str],
) -> None:
    view_joins.main(["--rows", "300", "--updates", "60"])
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split(" | ")[0]: line.split(" | ") for line in lines[3:]}
    assert set(rows) == set(view_joins.VIEWS)
    assert all(cells[1] == "yes" for cells in rows.values()), rows  # sync/async take them all
    # and cumulus too (its program over DECIMAL columns: an uncorrelated scalar's inline CASE
    # once failed to build there, "unknown predicate")
    assert all(cells[2] == "yes" for cells in rows.values()), rows
    assert float(rows["inner join"][6]) > 0


def test_a_path_that_drifts_stops_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = view_joins.Memory.view
    monkeypatch.setattr(view_joins.Memory, "view", lambda self, name: wrong(self, name)[1:])
    with pytest.raises(SystemExit, match="refresh operator's view differs"):
        view_joins.measure("inner join", view_joins.VIEWS["inner join"], 300, 20)
