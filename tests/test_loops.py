"""The servers' event loop (aggview.loops): uvloop where installed, the standard one on
request."""

from __future__ import annotations

import asyncio

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
