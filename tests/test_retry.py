"""The one retry policy (``aggview.retry``): its delays, its limits, what it does not retry."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from aggview import errors
from aggview.retry import RetryPolicy, retry_on


def failing(times: int, exc: Callable[[], BaseException] = lambda: errors.TooLate("x")) -> Any:
    calls = []

    def fn() -> str:
        calls.append(time.monotonic())
        if len(calls) <= times:
            raise exc()
        return "done"

    fn.calls = calls  # type: ignore[attr-defined]
    return fn


def test_delays_are_capped_exponential_with_the_spread() -> None:
    exact = RetryPolicy(first_delay=0.001, max_delay=0.1, spread=(1.0, 1.0))
    assert [exact.delay(n) for n in range(9)] == [
        0.001,
        0.002,
        0.004,
        0.008,
        0.016,
        0.032,
        0.064,
        0.1,
        0.1,
    ]
    full = RetryPolicy(first_delay=0.01, max_delay=0.05)
    for n in range(6):
        assert 0 <= full.delay(n) <= min(0.05, 0.01 * 2**n)
    around = RetryPolicy(first_delay=0.1, spread=(0.5, 1.5), max_delay=1.0)
    assert all(0.05 <= around.delay(0) <= 0.15 for _ in range(100))
    fixed = RetryPolicy(first_delay=0.05, max_delay=0.05, multiplier=1, spread=(1.0, 1.0))
    assert {fixed.delay(n) for n in range(5)} == {0.05}


def test_retries_until_it_succeeds_and_tells_each_retry() -> None:
    told: list[tuple[int, float]] = []
    fn = failing(3)
    policy = RetryPolicy(first_delay=0.001, spread=(1.0, 1.0))
    assert policy.run(fn, lambda exc, failed, wait: told.append((failed, wait))) == "done"
    assert told == [(1, 0.001), (2, 0.002), (3, 0.004)]
    assert len(fn.calls) == 4


def test_the_attempt_limit_raises_the_last_failure() -> None:
    fn = failing(100)
    with pytest.raises(errors.TooLate):
        RetryPolicy(attempts=5, first_delay=0.0001).run(fn)
    assert len(fn.calls) == 5


def test_a_non_retryable_failure_stops_at_once() -> None:
    fn = failing(1, lambda: errors.Unavailable("down"))
    with pytest.raises(errors.Unavailable):
        RetryPolicy().run(fn)
    assert len(fn.calls) == 1
    fn = failing(1, lambda: errors.ConditionFailed("no"))
    with pytest.raises(errors.ConditionFailed):
        asyncio.run(RetryPolicy().arun(_async(fn)))
    assert len(fn.calls) == 1


def test_the_deadline_ends_the_retries() -> None:
    fn = failing(10_000, lambda: ConnectionRefusedError())
    policy = RetryPolicy(
        attempts=None,
        first_delay=0.02,
        max_delay=0.02,
        spread=(1.0, 1.0),
        deadline=0.2,
        retryable=retry_on(ConnectionRefusedError),
    )
    started = time.monotonic()
    with pytest.raises(ConnectionRefusedError):
        policy.run(fn)
    took = time.monotonic() - started
    assert 0.2 <= took < 0.6
    assert 8 <= len(fn.calls) <= 12


def test_immediate_retries_go_at_once_and_do_not_count_in_the_backoff() -> None:
    told: list[tuple[int, float]] = []
    policy = RetryPolicy(attempts=None, first_delay=0.001, spread=(1.0, 1.0), immediate=3)
    policy.run(failing(5), lambda exc, failed, wait: told.append((failed, wait)))
    assert told == [(1, 0.0), (2, 0.0), (3, 0.0), (4, 0.001), (5, 0.002)]


def test_arun_retries_like_run() -> None:
    told: list[float] = []
    fn = failing(2)
    policy = RetryPolicy(first_delay=0.001, spread=(1.0, 1.0))
    assert asyncio.run(policy.arun(_async(fn), lambda e, f, w: told.append(w))) == "done"
    assert told == [0.001, 0.002] and len(fn.calls) == 3


def _async(fn: Callable[[], Any]) -> Callable[[], Any]:
    async def call() -> Any:
        return fn()

    return call
