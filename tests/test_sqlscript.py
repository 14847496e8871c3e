"""``aggview sql``'s text handling alone: scripts cut into calls, results rendered, the shell."""

from __future__ import annotations

import builtins
import datetime
import json
from decimal import Decimal
from pathlib import Path

import pytest

from aggview import errors, sqlscript
from aggview.sqlscript import calls, complete, render


def test_a_script_is_cut_at_semicolons_outside_quotes_and_comments() -> None:
    script = """-- setup; with a semicolon in a comment
CREATE TABLE t (id INT PRIMARY KEY, s TEXT);
INSERT INTO t VALUES (1, 'a;b'), (2, 'it''s; fine');
begin; UPDATE t SET s = "x" WHERE id = 1;
 /* c; */ DELETE FROM t WHERE id = 2; COMMIT;
;;
SELECT * FROM t"""
    assert list(calls(script)) == [
        "-- setup; with a semicolon in a comment\nCREATE TABLE t (id INT PRIMARY KEY, s TEXT)",
        "INSERT INTO t VALUES (1, 'a;b'), (2, 'it''s; fine')",
        'begin; UPDATE t SET s = "x" WHERE id = 1; /* c; */ DELETE FROM t WHERE id = 2; COMMIT;',
        "SELECT * FROM t",
    ]
    assert list(calls("BEGIN; INSERT INTO t VALUES (1)")) == ["BEGIN; INSERT INTO t VALUES (1);"]
    assert not complete("BEGIN; INSERT INTO t VALUES (1);")
    assert complete("BEGIN; INSERT INTO t VALUES (1);\nROLLBACK;")
    assert not complete("SELECT 1")


def test_results_render_as_table_csv_and_json() -> None:
    columns = ["id", "amount", "day", "ok", "note"]
    rows = [
        [1, Decimal("1.50"), datetime.date(2026, 1, 2), True, None],
        [2, None, None, False, "a,b"],
    ]
    assert render(columns, rows, "table").splitlines() == [
        "id\tamount\tday\tok\tnote",
        "1\t1.50\t2026-01-02\ttrue\tNULL",
        "2\tNULL\tNULL\tfalse\ta,b",
    ]
    assert render(columns, rows, "csv").splitlines()[2] == '2,,,false,"a,b"'
    assert json.loads(render(columns, rows, "json"))[0] == {
        "id": 1,
        "amount": "1.50",
        "day": "2026-01-02",
        "ok": True,
        "note": None,
    }
    assert render([], [], "table") == "" and render([], [], "json") == "[]"


def test_the_shell_runs_whole_statements_and_survives_errors(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = iter(["SELECT *", "FROM t;", "BEGIN; INSERT INTO t VALUES (1);", "COMMIT;", "bad;"])

    def typed(prompt: str) -> str:
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    ran: list[str] = []

    def run(call: str) -> None:
        if call.startswith("bad"):
            raise errors.InvalidArgument("cannot parse SQL")
        ran.append(call)

    monkeypatch.setattr(builtins, "input", typed)
    monkeypatch.setattr(sqlscript, "HISTORY", tmp_path / "history")
    sqlscript.shell(run)
    assert ran == ["SELECT *\nFROM t", "BEGIN; INSERT INTO t VALUES (1); COMMIT;"]
    assert "error: cannot parse SQL" in capsys.readouterr().out


@pytest.mark.parametrize("leave", ["\\q", "exit", "QUIT;"])
def test_the_shell_greets_helps_and_leaves(
    leave: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = iter(["help", leave, "SELECT 1;"])  # nothing after the exit runs
    monkeypatch.setattr(builtins, "input", lambda prompt: next(lines))
    monkeypatch.setattr(sqlscript, "HISTORY", tmp_path / "history")
    ran: list[str] = []
    sqlscript.shell(ran.append, "127.0.0.1:7070")
    out = capsys.readouterr().out
    assert out.startswith("aggview SQL shell connected to 127.0.0.1:7070")
    assert "\\q quits" in out
    for statement in ("CREATE MATERIALIZED VIEW", "ALTER MATERIALIZED VIEW", "DROP MATERIALIZED"):
        assert f"\n  {statement}" in out
    assert ran == []
