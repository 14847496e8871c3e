"""What ``pip install .`` installs is enough to run every module it ships.

A server importing a test-only library (duckdb once was) passes every test in a dev venv and fails
on a user's fresh install; CI's fresh-venv demo (``.ci/run``) catches the main job, this test
catches every other module, quickly, in the dev venv: it imports each shipped module in a child
interpreter where every distribution outside the runtime dependencies' closure is hidden.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]

_HIDE = r"""
import importlib, importlib.abc, json, sys
hidden = set(json.loads(sys.argv[1]))
modules = json.loads(sys.argv[2])

class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in hidden:
            raise ModuleNotFoundError(f"No module named {name!r} (not a runtime dependency)")
        return None

sys.meta_path.insert(0, Hide())
failed = {}
for module in modules:
    try:
        importlib.import_module(module)
    except Exception as exc:
        failed[module] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failed))
"""


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def runtime_closure(requirements: list[str]) -> set[str]:
    """The distributions the runtime requirements pull in, transitively (extras' and
    environment-marked requirements left out: pip would not install them either)."""
    seen: set[str] = set()
    todo = [_name(r) for r in requirements]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo += [_name(r) for r in requires if ";" not in r]
    return seen


def shipped_modules() -> list[str]:
    """Every module of the packages pyproject.toml ships."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["packages"]["find"]["include"]
    tops = sorted({p.rstrip("*") for p in patterns})
    modules = []
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def test_every_shipped_module_imports_with_only_the_runtime_dependencies() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    allowed = runtime_closure(config["project"]["dependencies"]) | {config["project"]["name"]}
    provided = importlib.metadata.packages_distributions()
    hidden = sorted(
        top
        for top, dists in provided.items()
        if not any(_name(d) in allowed for d in dists) and not top.startswith("_")
    )
    assert "pytest" in hidden and "hypothesis" in hidden  # the test extras are what is hidden
    modules = shipped_modules()
    assert len(modules) > 50
    result = subprocess.run(
        [sys.executable, "-c", _HIDE, json.dumps(hidden), json.dumps(modules)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    failed = json.loads(result.stdout.strip().splitlines()[-1])
    assert failed == {}, "modules that need a library outside [project] dependencies: " + str(
        failed
    )
