"""The suite's own layout: every test file that starts one of the session's JVMs (Spark, the
real HBase) is in a ``SPARK_GROUPS`` group, so that JVM starts once per group and not once per
worker that happens to run the file (each start costs 10-15 CPU-s on two cores); the real
HBase's users run one after the other, so it stops after them (``HBASE_FILES``)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import HBASE_FILES, LONGEST_FIRST, SPARK_GROUPS

JVM_FIXTURES = {"spark", "real_hbase"}
TESTS = Path(__file__).parent


def jvm_fixtures_used(source: str) -> set[str]:
    """The JVM fixtures a test module asks for: as an argument of a function or by name
    (``request.getfixturevalue("real_hbase")``, ``usefixtures("spark")``); not a fixture of
    the module's own by that name."""
    used, tree = set(), ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            used |= {a.arg for a in node.args.args} & JVM_FIXTURES
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") in (
            "getfixturevalue",
            "usefixtures",
        ):
            used |= {
                a.value
                for a in node.args
                if isinstance(a, ast.Constant) and a.value in JVM_FIXTURES
            }
    own = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    return used - own


def test_the_detector_sees_each_spelling() -> None:
    assert jvm_fixtures_used("def test_a(spark, tmp_path): pass") == {"spark"}
    assert jvm_fixtures_used("def f(r):\n    r.getfixturevalue('real_hbase')") == {"real_hbase"}
    assert jvm_fixtures_used("import pytest\n@pytest.mark.usefixtures('spark')\ndef t(): pass")
    assert not jvm_fixtures_used("def test_b(client, sparkle): pass")
    assert not jvm_fixtures_used("def real_hbase(): pass\ndef test_c(real_hbase): pass")


def test_every_file_that_starts_a_jvm_is_in_a_group() -> None:
    own = {"conftest.py", Path(__file__).name}
    starting = {
        path.name
        for path in TESTS.glob("test_*.py")
        if path.name not in own and jvm_fixtures_used(path.read_text())
    }
    assert starting, "no test file uses the JVM fixtures: the detector is broken"
    assert starting - SPARK_GROUPS.keys() == set(), "add these files to conftest.SPARK_GROUPS"


def test_the_real_hbase_users_are_named_and_run_one_after_the_other() -> None:
    users = {
        path.name
        for path in TESTS.glob("test_*.py")
        if path.name != Path(__file__).name and "real_hbase" in jvm_fixtures_used(path.read_text())
    }
    assert users == set(HBASE_FILES), "conftest.HBASE_FILES names the files that use real_hbase"
    ranks = sorted(LONGEST_FIRST.index(name) for name in HBASE_FILES)
    assert ranks == list(range(ranks[0], ranks[0] + len(ranks))), "next to each other"
    assert len({SPARK_GROUPS[name] for name in HBASE_FILES}) == 1, "in one group"
