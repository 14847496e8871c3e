"""Named failpoints: places in the commit path where a test makes a server fail for real.

A server process reads ``AGGVIEW_FAILPOINTS`` once, at import, e.g.::

    AGGVIEW_FAILPOINTS="ltm.after_prepare_logged=crash@3"
    AGGVIEW_FAILPOINTS="coordinator.after_decision_logged=crash@5;ltm.mid_checkpoint=sleep:0.5"

Each entry is ``name=action[@n]``: the action fires on the n-th hit of that point only
(default the first). Actions:

- ``crash``: ``os._exit(CRASH_EXIT)`` at once: no ``finally``, no buffered log record written,
  no checkpoint, like a kill -9 at exactly that line;
- ``raise``: raises :class:`FailpointError` (at an LTM point the request fails: its message is
  lost and the coordinator hears an error instead of a vote or an acknowledgement);
- ``sleep:SECONDS``: stalls the process's event loop (a slow disk, a stopped process);
- ``wait:SECONDS``: at a point hit with ``await pause(name)``, the task waits while the loop
  runs on (other transactions go on meanwhile); where hit with ``hit``, as ``sleep``.

A call site costs one module attribute load and a truth test when nothing is armed::

    if failpoints.ARMED:
        failpoints.hit("ltm.after_prepare_logged")

A *scope* narrows a point to one kind of work: inside ``async with failpoints.scope("refresh")``
a hit of ``X`` also counts as a hit of ``refresh:X`` (see :data:`MID_REFRESH`).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import time
from dataclasses import dataclass
from types import TracebackType

ENV = "AGGVIEW_FAILPOINTS"
CRASH_EXIT = 86  # a crashed process's exit status, so a test can tell a failpoint from a bug

# The points the servers have (what tests arm), in commit order.
LTM_AFTER_PREPARE_LOGGED = "ltm.after_prepare_logged"  # PREPARED durable, vote not yet sent
LTM_AFTER_COMMIT_APPLIED = "ltm.after_commit_applied"  # commit logged and applied, not acked
LTM_MID_CHECKPOINT = "ltm.mid_checkpoint"  # store written, old log segments not yet dropped
COORDINATOR_BEFORE_DECISION_LOGGED = "coordinator.before_decision_logged"  # all votes yes
COORDINATOR_AFTER_DECISION_LOGGED = "coordinator.after_decision_logged"  # before phase two
# a participant acknowledged the commit (each one counts), others may not have it yet
COORDINATOR_MID_COMMIT_FANOUT = "coordinator.mid_commit_fanout"
# Participants in this process voted yes (not yet durable); their prepares are being flushed.
# Hit only where partitions are hosted in process: tests/test_one_process.py arms it.
COORDINATOR_LOCAL_FLUSH = "coordinator.local_flush"
# An async view's drain transaction prepared everywhere, its decision not yet logged.
MID_REFRESH = f"refresh:{COORDINATOR_BEFORE_DECISION_LOGGED}"
# The member found its decision log taken over by another, and is about to stop.
COORDINATOR_SUPERSEDED = "coordinator.superseded"
# A sync view is maintained by every new transaction; the changes captured before are not
# drained yet (a new view's, or one switching from async).
COORDINATOR_BEFORE_DRAIN = "coordinator.before_drain"

POINTS = (
    LTM_AFTER_PREPARE_LOGGED,
    LTM_AFTER_COMMIT_APPLIED,
    LTM_MID_CHECKPOINT,
    COORDINATOR_BEFORE_DECISION_LOGGED,
    COORDINATOR_AFTER_DECISION_LOGGED,
    COORDINATOR_MID_COMMIT_FANOUT,
    COORDINATOR_LOCAL_FLUSH,
    MID_REFRESH,
    COORDINATOR_SUPERSEDED,
    COORDINATOR_BEFORE_DRAIN,
)


class FailpointError(RuntimeError):
    """Raised by a failpoint armed with ``raise``."""


@dataclass
class Failpoint:
    name: str
    action: str  # crash | raise | sleep | wait
    at: int = 1  # fires on this hit
    seconds: float = 0.0
    hits: int = 0


def parse(spec: str) -> dict[str, Failpoint]:
    """``name=action[@n];...`` to armed points; a malformed entry is an error at start, not a
    failpoint that silently never fires."""
    armed: dict[str, Failpoint] = {}
    for entry in filter(None, (part.strip() for part in spec.split(";"))):
        name, sep, rest = entry.partition("=")
        action, _, at = rest.partition("@")
        kind, _, argument = action.partition(":")
        if not sep or not name or kind not in ("crash", "raise", "sleep", "wait"):
            raise ValueError(
                f"{ENV}: bad entry {entry!r}; want name=crash|raise|sleep:S|wait:S[@n]"
            )
        if name.strip() not in POINTS:
            raise ValueError(f"{ENV}: unknown failpoint {name!r}; known: {', '.join(POINTS)}")
        point = Failpoint(name.strip(), kind, int(at) if at else 1)
        if kind in ("sleep", "wait"):
            point.seconds = float(argument)
        if point.at < 1:
            raise ValueError(f"{ENV}: {entry!r}: the hit number counts from 1")
        armed[point.name] = point
    return armed


# Empty (falsy) unless the environment arms something: the call sites test this first.
ARMED: dict[str, Failpoint] = parse(os.environ.get(ENV, ""))
_scope: contextvars.ContextVar[str | None] = contextvars.ContextVar("failpoint_scope", default=None)


def hit(name: str) -> None:
    """Counts a hit of ``name`` (and of ``scope:name`` inside a scope) and fires what is armed."""
    scope = _scope.get()
    for point in (name,) if scope is None else (name, f"{scope}:{name}"):
        if seconds := _fire(point):
            time.sleep(seconds)


async def pause(name: str) -> None:
    """``hit`` at an await point: a ``wait`` action lets the event loop run on meanwhile."""
    if seconds := _fire(name):
        await asyncio.sleep(seconds)


def _fire(name: str) -> float:
    """Fires ``name`` if armed; the seconds to wait or sleep, if that is its action."""
    point = ARMED.get(name)
    if point is None:
        return 0.0
    point.hits += 1
    if point.hits != point.at:
        return 0.0
    # One raw write, no flush of anything buffered: the log line tells the test it was us.
    os.write(2, f"failpoint {name}: {point.action} (hit {point.hits})\n".encode())
    if point.action == "crash":
        os._exit(CRASH_EXIT)
    if point.action == "raise":
        raise FailpointError(f"failpoint {name} (hit {point.hits})")
    return point.seconds


class scope:
    """Marks the work inside (this task and the tasks it starts) as one kind, for scoped points."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._token: contextvars.Token[str | None] | None = None

    def __enter__(self) -> scope:
        self._token = _scope.set(self.name)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._token is not None
        _scope.reset(self._token)

    async def __aenter__(self) -> scope:
        return self.__enter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(kind, exc, tb)


def arm(spec: str) -> None:
    """Arms points in this process (in-process tests); ``""`` disarms everything."""
    ARMED.clear()
    ARMED.update(parse(spec))
