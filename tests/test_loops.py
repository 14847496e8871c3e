"""The servers' event loop (aggview.loops): uvloop where installed, the standard one on
request."""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

from aggview import loops


async def loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_servers_run_on_uvloop_where_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("uvloop")  # a runtime dependency: installed wherever aggview is
    monkeypatch.delenv("AGGVIEW_LOOP", raising=False)
    assert loops.chosen() == "uvloop"
    assert loops.run(loop_module()).startswith("uvloop")


def test_the_standard_loop_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGGVIEW_LOOP", "asyncio")
    assert loops.chosen() == "asyncio"
    assert loops.run(loop_module()).startswith("asyncio")


def test_servers_collect_young_objects_less_often() -> None:
    """A server's loop runs with the collector's young generation at ``YOUNG_GENERATION``
    allocations (a cumulus runtime's heaps made the default cost two fifths of its CPU)."""
    saved = gc.get_threshold()
    try:

        async def threshold() -> tuple[int, ...]:
            return gc.get_threshold()

        gc.set_threshold(700, 10, 10)
        assert loops.run(threshold())[0] == loops.YOUNG_GENERATION > 700
    finally:
        gc.set_threshold(*saved)


def test_stop_ends_a_task_whose_first_cancellation_is_lost() -> None:
    """As Python 3.11's ``asyncio.wait_for`` does when its future completes at the moment it is
    cancelled: the cancellation is dropped and the task goes on (a refresher did, and an ALTER
    waited for it until the client gave up)."""

    async def swallows_one() -> int:
        rounds = 0
        while True:
            rounds += 1
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if rounds > 1000:
                    raise
                rounds = 1000  # lost once; a second cancellation ends it

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(swallows_one())
        await asyncio.sleep(0.02)
        await asyncio.wait_for(loops.stop(task), 5)
        assert task.cancelled()

    asyncio.run(main())


def test_done_within_answers_as_asyncio_wait_does_and_leaves_nothing_behind() -> None:
    """A future done in time: True at once, its timer cancelled; one not done: False after the
    time, the future neither cancelled nor holding the waiter's callback; a future that fails
    or is cancelled counts as done (its caller reads why)."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        late: asyncio.Future[int] = loop.create_future()
        assert not await loops.done_within(late, 0.01)
        assert not late.cancelled() and not late.done()
        late.set_result(1)  # no callback of the wait left to run
        soon: asyncio.Future[int] = loop.create_future()
        loop.call_later(0.01, soon.set_result, 2)
        started = loop.time()
        assert await loops.done_within(soon, 30.0)
        assert loop.time() - started < 5.0  # woken by the answer, not the timer
        failed: asyncio.Future[int] = loop.create_future()
        loop.call_soon(failed.set_exception, ValueError("why"))
        assert await loops.done_within(failed, 30.0)
        gone: asyncio.Future[int] = loop.create_future()
        loop.call_soon(gone.cancel)
        assert await loops.done_within(gone, 30.0)
        assert await loops.done_within(soon, 0.0)  # done already
        timers = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        assert timers == [], timers

    asyncio.run(run())


def test_in_thread_to_the_end_raises_a_cancel_only_once_the_thread_returned() -> None:
    """A cancelled call's thread runs on; the caller hears of the cancel only once it is
    done, however often it is cancelled, and results and failures come back otherwise."""

    def slow(release: threading.Event, done: list[str]) -> str:
        release.wait(5)
        done.append("written")
        return "ok"

    def fail() -> None:
        raise ValueError("store refused")

    async def main() -> None:
        assert await loops.in_thread_to_the_end(str.upper, "x") == "X"
        with pytest.raises(ValueError, match="store refused"):
            await loops.in_thread_to_the_end(fail)
        release, done = threading.Event(), []
        call = asyncio.ensure_future(loops.in_thread_to_the_end(slow, release, done))
        await asyncio.sleep(0.02)
        for _ in range(3):
            call.cancel()
            await asyncio.sleep(0.02)
            assert not call.done()  # the thread still writes
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert done == ["written"]

    asyncio.run(main())
