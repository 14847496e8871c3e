"""The test session's Docker: an engine found or started (root, Linux; Debian's docker.io
installed when missing), the images built (cached by Docker: seconds when nothing changed), or
a skip that says exactly why. ``.ci/run`` starts the engine and builds the images before the
suite (and says so: ``AGGVIEW_DOCKER_IMAGES_BUILT=1``), so that the suite's time holds no build.

Several pytest-xdist workers may use the engine at once: each holds a shared lock on
:data:`USERS` while its session lasts; the session that started dockerd stops it at its end,
after taking that lock exclusively (once every other session is done). Setting up is one at a
time (:data:`SETUP`): one dockerd start, one build of each image.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from aggcli import docker_images

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = Path(tempfile.gettempdir())
SETUP = RUNTIME / "aggview-docker-setup.lock"
USERS = RUNTIME / "aggview-docker-users.lock"
# No image registry here: testcontainers' reaper (Ryuk) is an image it would pull. The tests
# remove what they start themselves.
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")


@dataclass
class DockerImages:
    """A Docker engine that answers, with the aggview and HBase images built."""

    aggview: str
    hbase: str
    setup_seconds: float
    compose: list[str] | None  # the compose CLI (Debian's docker-compose installed if missing)
    compose_problem: str  # why there is none


class DockerSkip(Exception):
    """Why the Docker tests cannot run here (the skip reason)."""


@contextmanager
def docker_session() -> Iterator[DockerImages]:
    """The engine and the images for one test session; raises DockerSkip saying why not."""
    if os.environ.get("AGGVIEW_DOCKER_TESTS", "1") == "0":
        raise DockerSkip("the Docker tests are off (AGGVIEW_DOCKER_TESTS=0)")
    started = time.monotonic()
    with USERS.open("a") as users:
        fcntl.flock(users, fcntl.LOCK_SH)
        engine = docker_images.Engine()
        try:
            with SETUP.open("a") as setup:
                fcntl.flock(setup, fcntl.LOCK_EX)
                try:
                    log = docker_images.DOCKERD_LOG
                    engine = docker_images.ensure_engine(log=log, install=True)
                    images = (docker_images.AGGVIEW_IMAGE, docker_images.HBASE_IMAGE)
                    built = os.environ.get("AGGVIEW_DOCKER_IMAGES_BUILT") == "1"
                    if not (built and all(map(docker_images.image_exists, images))):
                        docker_images.build_images(ROOT, install=True)
                except docker_images.DockerUnavailable as exc:
                    raise DockerSkip(str(exc)) from None
                try:  # only the compose tests need it: they skip saying why where it is missing
                    compose, compose_problem = docker_images.ensure_compose(install=True), ""
                except docker_images.DockerUnavailable as exc:
                    compose, compose_problem = None, str(exc)
            yield DockerImages(
                docker_images.AGGVIEW_IMAGE,
                docker_images.HBASE_IMAGE,
                time.monotonic() - started,
                compose,
                compose_problem,
            )
        finally:
            if engine.started is not None:  # ours: once no other session uses it
                fcntl.flock(users, fcntl.LOCK_UN)
                fcntl.flock(users, fcntl.LOCK_EX)
                engine.stop()
