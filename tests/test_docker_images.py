"""``aggcli.docker_images`` without a Docker engine: the mirror found in apt's sources, the
contexts staged, the HBase image's command made from ``aggview hbase start``'s own flags, and
the reason given when dockerd cannot start (what the Docker tests' skip says)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from aggcli import docker_images
from ltm.store.hbase_server import JVM_FLAGS, MASTER_CLASS, THRIFT_CLASS

ROOT = Path(__file__).resolve().parents[1]


def test_the_mirror_is_the_one_apt_uses_for_bookworm(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    assert docker_images.debian_mirror(tmp_path) == docker_images.DEFAULT_MIRROR
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\n"
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian/\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert docker_images.debian_mirror(tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list").write_text(
        "deb [arch=amd64] http://one-line.example/debian bookworm main\n"
    )
    assert docker_images.debian_mirror(tmp_path) == "http://one-line.example/debian"


def test_the_aggview_context_holds_what_the_dockerfile_copies_and_no_caches(
    tmp_path: Path,
) -> None:
    dockerfile = docker_images.stage_aggview_context(ROOT, tmp_path)
    assert dockerfile == tmp_path / "docker" / "Dockerfile"
    top = {p.name for p in tmp_path.iterdir()}
    assert {"pyproject.toml", "README.md", "aggview", "ltm", "aggcli", "docker"} <= top
    assert not {"tests", "bench", "docs", ".git"} & top
    assert not list(tmp_path.rglob("__pycache__")) and not list(tmp_path.rglob("*.pyc"))
    # the same modes whatever the umask (Docker's cache compares them)
    modes = {stat.S_IMODE(p.stat().st_mode) for p in tmp_path.rglob("*") if p.is_file()}
    assert modes == {0o644}
    assert sorted(p.name for p in (tmp_path / "docker").iterdir()) == [
        "Dockerfile",
        "healthcheck.py",
        "wait_for_hbase.py",
    ]


def test_the_hbase_image_runs_hbase_as_aggview_hbase_start_does(tmp_path: Path) -> None:
    jar = tmp_path / "jars" / "hbase-server-2.6.1.jar"
    jar.parent.mkdir()
    jar.write_bytes(b"jar")
    context = tmp_path / "context"
    dockerfile = docker_images.stage_hbase_context(ROOT, context, [jar])
    assert dockerfile.read_text() == (ROOT / "docker" / "hbase.Dockerfile").read_text()
    assert (context / "lib" / jar.name).read_bytes() == b"jar"
    site = (context / "conf" / "hbase-site.xml").read_text()
    assert "<value>file:///data/root</value>" in site and "<value>2181</value>" in site
    script = (context / "hbase-entrypoint.sh").read_text()
    assert os.stat(context / "hbase-entrypoint.sh").st_mode & stat.S_IXUSR
    assert all(flag in script for flag in JVM_FLAGS)
    assert f"{MASTER_CLASS} start &" in script
    assert f"{THRIFT_CLASS} -p 9090 --bind 0.0.0.0 start &" in script


def test_a_dockerd_that_fails_to_start_is_named_with_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    for name, body in (
        ("docker", "echo 'Cannot connect to the Docker daemon' >&2; exit 1"),
        ("dockerd", "echo 'failed to start daemon: no overlay2 here'; exit 3"),
    ):
        (fake / name).write_text(f"#!/bin/sh\n{body}\n")
        (fake / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(fake))
    monkeypatch.setattr(docker_images, "can_start_engine", lambda: None)
    log = tmp_path / "dockerd.log"
    with pytest.raises(docker_images.DockerUnavailable) as failed:
        docker_images.ensure_engine(log=log, timeout=20)
    said = str(failed.value)
    assert said.startswith("dockerd exited at start (status 3)")
    assert "no overlay2 here" in said and str(log) in said


def test_no_engine_and_no_right_to_start_one_says_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(docker_images, "can_start_engine", lambda: "starting one needs root")
    with pytest.raises(docker_images.DockerUnavailable, match="no docker command on PATH; start"):
        docker_images.ensure_engine(log=tmp_path / "log")
