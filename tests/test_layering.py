"""The packages' layering (docs/DECISIONS.md, Layout): each layer imports only the layers below
it, found by walking every import statement of the project's modules (inside functions too)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Layers, lowest first; a module belongs to the longest prefix that names it. A layer may import
# itself and what is listed for it, nothing else of the project.
ALLOWED: dict[str, set[str]] = {
    "aggview": set(),
    "ltm.store": {"aggview"},
    "cumulus": {"aggview"},  # the view compiler: SQL -> plan, deltas, aggregate state
    "ltm": {"aggview", "ltm.store"},
    "coordinator": {"aggview", "ltm.store", "ltm", "cumulus"},
    "cumulus.spark": {"aggview", "ltm.store", "cumulus", "coordinator"},
    "loadgen": {"aggview", "ltm.store", "cumulus", "coordinator", "cumulus.spark"},
}
# Entry points wire every role together and may import anything.
ENTRY_POINTS = {"aggview.cli", "aggview.__main__"}


def layer_of(module: str) -> str | None:
    best = None
    for layer in ALLOWED:
        if (module == layer or module.startswith(layer + ".")) and (
            best is None or len(layer) > len(best)
        ):
            best = layer
    return best


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in ("aggview", "ltm", "coordinator", "cumulus", "loadgen"):
        for path in (ROOT / package).rglob("*.py"):
            if "wire" in path.relative_to(ROOT).parts:
                continue  # generated gRPC modules
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    found = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            # `from pkg import mod` imports pkg.mod when mod is a module
            found.extend((node.lineno, f"{target}.{alias.name}") for alias in node.names)
            found.append((node.lineno, target))
    return found


def violations() -> list[str]:
    modules = project_modules()
    found = []
    for module, path in sorted(modules.items()):
        if module in ENTRY_POINTS:
            continue
        own = layer_of(module)
        assert own is not None, module
        for line, target in imports_of(path, module):
            if target not in modules:
                continue  # a name inside a module, or not the project's
            other = layer_of(target)
            if other is None or other == own or other in ALLOWED[own]:
                continue
            found.append(f"{path.relative_to(ROOT)}:{line} ({own}) imports {target} ({other})")
    return found


def test_every_import_follows_the_layering() -> None:
    assert violations() == []


def test_the_walk_sees_an_upward_import(tmp_path: Path) -> None:
    """The check itself can fail: an import of the coordinator from the ground floor is found."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from coordinator.client import Client\n")
    targets = [t for _, t in imports_of(module, "aggview.m")]
    assert "coordinator.client" in targets
    assert layer_of("coordinator.client") == "coordinator"
    assert "coordinator" not in ALLOWED[layer_of("aggview.m") or ""]
    assert layer_of("cumulus.spark.jobs") == "cumulus.spark"
