"""A DW node's write log (``cumulus.runtime.maplog.MapLog``) against the plainest model of it:
every write kept, a value at a timestamp summed from scratch. Writes arrive out of timestamp
order and go to zero and back, cuts are committed between them, and slices are read through
indexes built before and after the writes they must see."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cumulus.runtime.maplog import MapLog
from cumulus.runtime.messages import WILD

KEYS = [(a, b) for a in range(3) for b in range(3)]

write = st.tuples(
    st.sampled_from(KEYS),
    st.integers(1, 12),  # the timestamp's counter
    st.integers(0, 1),  # its switch
    st.sampled_from([-2, -1, 1, 2, Decimal("0.5"), Decimal("-0.5")]),
)
step = st.one_of(
    st.tuples(st.just("write"), write),
    st.tuples(st.just("index"), st.sampled_from([(0,), (1,)])),
    st.tuples(st.just("fold"), st.integers(0, 12)),
    st.tuples(st.just("preload"), st.sampled_from(KEYS), st.integers(1, 3)),
)


def _model_value(writes: list[tuple[Any, ...]], preloaded: dict[Any, int], key: Any, ts: Any):
    value: Any = preloaded.get(key, 0)
    for k, at, delta in writes:
        if k == key and at < ts:
            value += delta
    return value


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=40), st.integers(0, 13), st.integers(0, 1))
def test_a_map_log_reads_what_every_write_below_a_timestamp_sums_to(steps, counter, switch):
    log, writes, preloaded, committed = MapLog(), [], {}, 0
    for kind, *rest in steps:
        if kind == "preload" and not writes and rest[0] not in preloaded:
            key, value = rest
            log.preloaded(key, value)
            preloaded[key] = value
        elif kind == "write":
            key, at, sw, delta = rest[0]
            if at <= committed:
                continue  # the protocol never writes at or below a committed cut
            log.write(key, delta, (at, sw))
            writes.append((key, (at, sw), delta))
        elif kind == "index":
            log.index(rest[0])
        elif kind == "fold" and rest[0] >= committed:
            # a cut is committed only once every write up to it is in
            committed = rest[0]
            log.fold(committed)
            at_cut = {k: _model_value(writes, preloaded, k, (committed + 1, -1)) for k in KEYS}
            assert log.at_cut() == {k: v for k, v in at_cut.items() if v != 0}
    ts = (max(counter, committed + 1), switch)
    expected = {k: _model_value(writes, preloaded, k, ts) for k in KEYS}
    for key in KEYS:
        assert log.value_before(key, ts) == expected[key]
    newest = {k: _model_value(writes, preloaded, k, (99, 0)) for k in KEYS}
    assert log.current == {k: v for k, v in newest.items() if v != 0}
    for pattern in [(a, WILD) for a in range(3)] + [(WILD, b) for b in range(3)] + [(WILD, WILD)]:
        want = {
            k: v
            for k, v in expected.items()
            if v != 0 and all(p is WILD or p == part for p, part in zip(pattern, k, strict=True))
        }
        assert log.slice_before(pattern, ts) == want, pattern
    assert set(log.keys()) >= {k for k, v in expected.items() if v != 0}
