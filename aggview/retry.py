"""The one retry policy: what is retried, how long to wait between tries, when to give up.

One backoff formula for every caller: the n-th wait (n from 0) is
``min(max_delay, first_delay * multiplier**n)`` scaled by a uniform random factor in
``spread``; (0, 1) is full jitter (the default), (1, 1) none, (0.5, 1.5) jitter around the
value. Each call site keeps its own parameters (docs/DECISIONS.md, "One retry policy").
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from aggview import errors

T = TypeVar("T")

# Told of each retry before its wait: the failure, how many tries failed so far, the wait.
OnRetry = Callable[[BaseException, int, float], None]


def retry_on(*classes: type[BaseException]) -> Callable[[BaseException], bool]:
    """A ``retryable`` test: the failure is of one of ``classes``."""
    return lambda exc: isinstance(exc, classes)


@dataclass(frozen=True)
class RetryPolicy:
    """Tries ``fn`` until it returns, retrying the failures ``retryable`` accepts: at most
    ``attempts`` tries (None: no limit), and no retry once ``deadline`` seconds have passed
    since the first try (None: no limit). The first ``immediate`` retries go at once, and
    are neither limited nor counted in the backoff. Any other failure is raised at once; the
    last retryable one is raised when the policy gives up."""

    attempts: int | None = 20
    first_delay: float = 0.001
    max_delay: float = 0.1
    multiplier: float = 2.0
    spread: tuple[float, float] = (0.0, 1.0)
    deadline: float | None = None
    immediate: int = 0
    retryable: Callable[[BaseException], bool] = retry_on(errors.TooLate)

    def delay(self, n: int) -> float:
        """The wait before the try after the n-th backed-off failure (n from 0)."""
        low, high = self.spread
        wait = min(self.max_delay, self.first_delay * self.multiplier**n)
        return wait * (low if low == high else random.uniform(low, high))

    def _backoff(self, on_retry: OnRetry | None) -> Callable[[Exception], float]:
        """Told each failure, gives the wait before the next try, or raises the failure when
        the policy gives up on it (not retryable, attempts spent, deadline passed)."""
        started = time.monotonic()
        failed = 0

        def after(exc: Exception) -> float:
            nonlocal failed
            failed += 1
            if not self.retryable(exc):
                raise exc
            if failed <= self.immediate:
                wait = 0.0
            elif (self.attempts is not None and failed >= self.attempts) or (
                self.deadline is not None and time.monotonic() - started >= self.deadline
            ):
                raise exc
            else:
                wait = self.delay(failed - self.immediate - 1)
            if on_retry is not None:
                on_retry(exc, failed, wait)
            return wait

        return after

    def run(self, fn: Callable[[], T], on_retry: OnRetry | None = None) -> T:
        after = self._backoff(on_retry)
        while True:
            try:
                return fn()
            except Exception as exc:
                time.sleep(after(exc))

    async def arun(self, fn: Callable[[], Awaitable[T]], on_retry: OnRetry | None = None) -> T:
        after = self._backoff(on_retry)
        while True:
            try:
                return await fn()
            except Exception as exc:
                await asyncio.sleep(after(exc))
