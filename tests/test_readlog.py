"""A DW node's read log (``cumulus/runtime/readlog.py``) against the scan it replaces: every
read served after a write's timestamp whose pattern matches the write's key, in the order
served, with reads pruned at committed cuts on the way."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cumulus.runtime.messages import WILD
from cumulus.runtime.readlog import ReadEntry, ReadLog

WIDTH = 3


def matches(pattern: tuple[Any, ...], key: tuple[Any, ...]) -> bool:
    """Whether ``key`` fits ``pattern`` (WILD fits anything)."""
    return all(p is WILD or p == k for p, k in zip(pattern, key, strict=True))


values = st.integers(0, 3)
patterns = st.tuples(*[st.one_of(st.just(WILD), values)] * WIDTH)
timestamps = st.tuples(st.integers(1, 8), st.integers(0, 1))  # often equal
steps = st.lists(
    st.one_of(
        st.tuples(st.just("read"), timestamps, patterns, st.integers(0, 2)),
        st.tuples(st.just("write"), timestamps, st.tuples(*[values] * WIDTH)),
        st.tuples(st.just("commit"), st.integers(0, 8)),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_a_late_write_finds_exactly_the_reads_a_scan_finds(steps: list[tuple[Any, ...]]) -> None:
    log, scanned = ReadLog(), []  # scanned: every kept read, in the order served
    for step in steps:
        if step[0] == "read":
            _, ts, pattern, writer = step
            entry = ReadEntry(ts, pattern, writer, ((0, 0),))
            log.add(entry, tuple(i for i, p in enumerate(pattern) if p is not WILD))
            scanned.append(entry)
        elif step[0] == "write":
            _, ts, key = step
            late = [e for e in sorted(scanned, key=lambda e: e.ts) if e.ts > ts]
            expected = [e for e in late if matches(e.pattern, key)]
            assert list(log.late(key, ts)) == expected
        else:
            cut = step[1]
            log.prune(cut)
            scanned = [e for e in scanned if e.ts[0] > cut]
        assert len(log) == len(scanned)
        assert log.newest == max((e.ts for e in scanned), default=None)


def test_reads_at_one_timestamp_come_back_in_the_order_served() -> None:
    log = ReadLog()
    first = ReadEntry((5, 0), (1, WILD), writer=0, uses=((0, 0),))
    second = ReadEntry((5, 0), (WILD, 2), writer=1, uses=((1, 0),))
    earlier = ReadEntry((4, 1), (1, 2), writer=2, uses=((2, 1),))
    log.add(first, (0,))
    log.add(second, (1,))
    log.add(earlier, (0, 1))
    assert list(log.late((1, 2), (3, 0))) == [earlier, first, second]
    assert list(log.late((1, 2), (4, 1))) == [first, second]
    assert list(log.late((1, 3), (4, 1))) == [first]
    assert list(log.late((1, 2), (5, 0))) == []
    later = ReadEntry((6, 0), (1, WILD), writer=0, uses=((3, 0),))
    log.add(later, (0,))
    assert list(log.late((1, 2), (5, 0))) == [later]  # not the reads at the write's own ts
