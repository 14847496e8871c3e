"""The packages are the layers (docs/DECISIONS.md, Layout): each layer imports only the layers
below it, found by walking every import statement of the project's modules (inside functions
too). No module is exempt: the ``aggview`` command is the top layer (``aggcli``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent

# Layers, lowest first (each after everything it may import); a module belongs to the longest
# prefix that names it. A layer may import itself and what is listed for it, nothing else of the
# project. The table in docs/ARCHITECTURE.md says the same, with why for the edges that are not
# obvious.
ALLOWED: dict[str, set[str]] = {
    # the wire, codecs and what every role shares, and ``processes`` (starting ``aggview``
    # processes: a command line, not an import)
    "aggview": set(),
    "ltm.store": {"aggview"},  # store adapters, the ownership record
    "ltm": {"aggview", "ltm.store"},  # the participant, its log replication and gRPC face
    "cumulus": {"aggview"},  # the view compiler, M3, the Cumulus runtime
    "coordinator": {"aggview", "ltm.store", "ltm", "cumulus"},  # a member's coordinating side
    "aggclient": {"aggview"},  # the client library: the wire, nothing of a server
    "agglauncher": {"aggview"},  # LocalCluster: member processes over one data directory
    # a client of the cluster; ltm.store for the staging tables bulk loads write into the store
    "aggspark": {"aggview", "ltm.store", "cumulus", "aggclient"},
    "loadgen": {"aggview", "aggclient", "agglauncher", "aggspark"},  # load, benchmarks, demo
    # the ``aggview`` command: wires every role together
    "aggcli": {
        "aggview",
        "ltm.store",
        "ltm",
        "cumulus",
        "coordinator",
        "aggclient",
        "agglauncher",
        "aggspark",
        "loadgen",
    },
}
OUTSIDE = {"tests", "bench", "docker", "proto", "docs"}  # no package of the layering


def layer_of(module: str) -> str | None:
    best = None
    for layer in ALLOWED:
        if (module == layer or module.startswith(layer + ".")) and (
            best is None or len(layer) > len(best)
        ):
            best = layer
    return best


def packages(root: Path) -> list[str]:
    """The top-level packages under ``root``: every directory with an ``__init__.py``."""
    return sorted(
        p.name for p in root.iterdir() if (p / "__init__.py").is_file() and p.name not in OUTSIDE
    )


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    modules = {}
    for package in packages(root):
        for path in (root / package).rglob("*.py"):
            if "wire" in path.relative_to(root).parts:
                continue  # generated gRPC modules
            name = ".".join(path.relative_to(root).with_suffix("").parts)
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


def edges(root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(module, line, imported module) for every import of another layer's module."""
    modules = project_modules(root)
    found = []
    for module, path in sorted(modules.items()):
        own = layer_of(module)
        for line, target in imports_of(path, module):
            if target in modules and layer_of(target) != own:
                found.append((module, line, target))
    return found


def violations(root: Path = ROOT) -> list[str]:
    modules = project_modules(root)
    found = []
    for module, line, target in edges(root):
        own, other = layer_of(module), layer_of(target)
        assert own is not None and other is not None, (module, target)
        if other not in ALLOWED[own]:
            path = modules[module].relative_to(root)
            found.append(f"{path}:{line} ({own}) imports {target} ({other})")
    return found


def test_every_import_follows_the_layering() -> None:
    assert violations() == []


def test_every_module_belongs_to_a_layer() -> None:
    """A new package, or a module outside the layers, fails here rather than going unchecked;
    and what pyproject.toml ships and the image copies is exactly the layered packages."""
    assert set(packages(ROOT)) == {layer.split(".")[0] for layer in ALLOWED}
    unplaced = [m for m in project_modules() if layer_of(m) is None]
    assert unplaced == []
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = config["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {p.rstrip("*") for p in shipped} == set(packages(ROOT))
    assert config["project"]["scripts"]["aggview"] == "aggcli.cli:main"
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert [p for p in packages(ROOT) if f"COPY {p} ./{p}\n" not in dockerfile] == []


def test_the_layers_are_ordered() -> None:
    """Each layer may import only layers listed before it: no cycle, no exemption."""
    seen: set[str] = set()
    for layer, allowed in ALLOWED.items():
        assert allowed <= seen, (layer, allowed - seen)
        seen.add(layer)


def test_the_client_imports_only_the_wire() -> None:
    """An application installs the client library and runs nothing of a server's."""
    assert ALLOWED["aggclient"] == {"aggview"}
    found = [(m, t) for m, _, t in edges() if layer_of(m) == "aggclient"]
    assert found and all(layer_of(t) == "aggview" for _, t in found)


def test_the_spark_layer_is_a_client_of_the_cluster() -> None:
    """No coordinator and no LTM: the Spark layer reaches the cluster through the client (and
    the store adapters for bulk loads' staging tables)."""
    found = [(m, t) for m, _, t in edges() if layer_of(m) == "aggspark"]
    assert any(layer_of(t) == "aggclient" for _, t in found)
    assert not [t for _, t in found if layer_of(t) in {"coordinator", "ltm"}]
    assert not {"coordinator", "ltm"} & ALLOWED["aggspark"]


def _plant(root: Path, layer: str, text: str = "x = 1\n") -> None:
    directory = root.joinpath(*layer.split("."))
    for i in range(len(layer.split("."))):
        package = root.joinpath(*layer.split(".")[: i + 1])
        package.mkdir(exist_ok=True)
        (package / "__init__.py").touch()
    (directory / "m.py").write_text(text)


@pytest.mark.parametrize("layer", list(ALLOWED))
def test_the_walk_finds_a_planted_violation(tmp_path: Path, layer: str) -> None:
    """For each layer, an import of every layer it may not import (inside a function, relative
    or absolute) is found, and an import of each layer it may import is not."""
    for other in ALLOWED:
        _plant(tmp_path, other)
    forbidden = [o for o in ALLOWED if o != layer and o not in ALLOWED[layer]]
    lines = ["def f():"]
    lines += [f"    from {other}.m import x  # noqa" for other in forbidden]
    lines += [f"    import {other}.m" for other in sorted(ALLOWED[layer])]
    lines += ["    from . import m", "    return x"]
    _plant(tmp_path, layer, "\n".join(lines) + "\n")
    found = violations(tmp_path)
    assert len(found) == len(forbidden), found
    for other, violation in zip(forbidden, found, strict=True):
        assert f"({layer}) imports {other}.m ({other})" in violation
    if layer == "aggcli":
        assert forbidden == []  # the top: nothing above it


def test_a_layer_is_its_longest_prefix() -> None:
    assert layer_of("ltm.store.sqlite") == "ltm.store"
    assert layer_of("ltm.participant") == "ltm"
    assert layer_of("aggspark.jobs") == "aggspark"
    assert layer_of("aggclientx") is None  # a prefix of a name is not its package
