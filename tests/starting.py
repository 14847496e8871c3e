"""Starting a member from a thread that outlives the start: a member's process dies with the
thread that started it (``PR_SET_PDEATHSIG``), so a start that blocks (waiting for a leader or
a majority) runs on a thread the test keeps until ``release()``."""

from __future__ import annotations

import threading
from typing import Any


class StartingThread:
    def __init__(self, server: Any, timeout: float = 60.0) -> None:
        self.outcome: list[BaseException | None] = []  # [None] once started, [exc] if not
        self._server, self._timeout = server, timeout
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            self._server.start(timeout=self._timeout)
            self.outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.outcome.append(exc)
        self._done.wait(120)  # its process dies with the thread that started it

    def start(self) -> None:
        self._thread.start()

    def release(self) -> None:
        self._done.set()
        if self._thread.ident is not None:  # started
            self._thread.join(70)
