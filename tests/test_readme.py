"""The README's client example runs verbatim against a real cluster (only the address differs)."""

from __future__ import annotations

import re
from pathlib import Path

from aggview.cluster import LocalCluster

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_client_example_runs(cluster: LocalCluster, capsys) -> None:  # type: ignore[no-untyped-def]
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README has no python example"
    code = blocks[0].replace("127.0.0.1:7070", cluster.address)
    exec(compile(code, str(README), "exec"), {})
    out = capsys.readouterr().out
    assert "committed at timestamp" in out
    assert "condition failed" in out and "accounts" in out
    assert "120.50 at" in out  # 70.00 + 50.50 after the transfer


def test_generated_wire_modules_match_the_protos(tmp_path: Path) -> None:
    from aggview.wire.generate import ROOT, generate

    generate(tmp_path)
    for fresh in (tmp_path / "aggview" / "wire").glob("*_pb2*.py*"):
        checked_in = ROOT / "aggview" / "wire" / fresh.name
        assert checked_in.read_text() == fresh.read_text(), (
            f"{fresh.name} is stale: run python -m aggview.wire.generate"
        )
