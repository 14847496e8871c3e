"""The runtime's messages <-> protobuf ``Envelope``s (proto/aggview/wire/cumulus.proto), so the
switches and DW nodes can run on separate hosts and talk over gRPC; values go through
``aggview.values``, which keeps their exact types."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aggview.values import from_value, to_value
from aggview.wire import cumulus_pb2 as pb
from cumulus.runtime.messages import (
    Batch,
    Corrective,
    Dispatch,
    EpochCommit,
    EpochEnd,
    EpochEndRequest,
    EpochReady,
    Fetch,
    Key,
    Message,
    Push,
    Read,
    Settled,
    Slice,
    Timestamp,
)


def encode_ts(ts: Timestamp) -> pb.Ts:
    counter, switch = ts
    return pb.Ts(counter=counter, switch_id=switch)


def decode_ts(ts: pb.Ts) -> Timestamp:
    return (ts.counter, ts.switch_id)


def _encode_key(key: Key) -> pb.Key:
    return pb.Key(parts=[to_value(part) for part in key])


def _decode_key(key: pb.Key) -> Key:
    return tuple(from_value(part) for part in key.parts)


def _encode_pairs(pairs: Iterable[tuple[Key, Any]]) -> list[pb.Entry]:
    return [pb.Entry(key=_encode_key(key), value=to_value(value)) for key, value in pairs]


def _decode_pairs(entries: Iterable[pb.Entry]) -> tuple[tuple[Key, Any], ...]:
    return tuple((_decode_key(e.key), from_value(e.value)) for e in entries)


def encode_entries(entries: Mapping[Key, Any]) -> list[pb.Entry]:
    """A map's contents (key -> value), e.g. for a ``MapReply``."""
    return _encode_pairs(entries.items())


def decode_entries(entries: Iterable[pb.Entry]) -> dict[Key, Any]:
    return dict(_decode_pairs(entries))


def _encode_dispatch(m: Dispatch) -> pb.Dispatch:
    return pb.Dispatch(
        ts=encode_ts(m.ts),
        trigger=m.trigger,
        args=[to_value(arg) for arg in m.args],
        puts=[pb.PutCount(statement=s, pushes=n) for s, n in m.puts],
        fetches=[
            pb.Fetch(statement=f.statement, factors=f.factors, writers=f.writers) for f in m.fetches
        ],
        puts_before=m.puts_before,
    )


def _decode_dispatch(m: pb.Dispatch) -> Dispatch:
    return Dispatch(
        ts=decode_ts(m.ts),
        trigger=m.trigger,
        args=tuple(from_value(arg) for arg in m.args),
        puts=tuple((p.statement, p.pushes) for p in m.puts),
        fetches=tuple(Fetch(f.statement, tuple(f.factors), tuple(f.writers)) for f in m.fetches),
        puts_before=m.puts_before,
    )


def _encode_push(m: Push) -> pb.Push:
    return pb.Push(
        ts=encode_ts(m.ts),
        source=m.source,
        statements=m.statements,
        slices=[
            pb.Slice(statement=s.statement, factor=s.factor, entries=_encode_pairs(s.entries))
            for s in m.slices
        ],
    )


def _decode_push(m: pb.Push) -> Push:
    return Push(
        ts=decode_ts(m.ts),
        source=m.source,
        statements=tuple(m.statements),
        slices=tuple(Slice(s.statement, s.factor, _decode_pairs(s.entries)) for s in m.slices),
    )


def _encode_corrective(m: Corrective) -> pb.Corrective:
    return pb.Corrective(
        source=m.source,
        write_ts=encode_ts(m.write_ts),
        map=m.map,
        key=_encode_key(m.key),
        delta=to_value(m.delta),
        reads=[
            pb.ReadRef(ts=encode_ts(r.ts), statement=r.statement, factor=r.factor) for r in m.reads
        ],
        depth=m.depth,
        seq=m.seq,
    )


def _decode_corrective(m: pb.Corrective) -> Corrective:
    return Corrective(
        source=m.source,
        write_ts=decode_ts(m.write_ts),
        map=m.map,
        key=_decode_key(m.key),
        delta=from_value(m.delta),
        reads=tuple(Read(decode_ts(r.ts), r.statement, r.factor) for r in m.reads),
        depth=m.depth,
        seq=m.seq,
    )


# message type -> (its field in the Envelope's oneof, encoder); the decoders by that field
_ENCODERS: dict[type, tuple[str, Callable[[Any], Any]]] = {
    Dispatch: ("dispatch", _encode_dispatch),
    Push: ("push", _encode_push),
    Corrective: ("corrective", _encode_corrective),
    Settled: ("settled", lambda m: pb.Settled(seq=m.seq)),
    EpochEnd: ("epoch_end", lambda m: pb.EpochEnd(cut=m.cut, switch_id=m.switch)),
    EpochReady: ("epoch_ready", lambda m: pb.EpochReady(cut=m.cut, source=m.source)),
    EpochCommit: ("epoch_commit", lambda m: pb.EpochCommit(cut=m.cut)),
    EpochEndRequest: ("epoch_end_request", lambda m: pb.EpochEndRequest(source=m.source)),
    Batch: ("batch", lambda m: pb.Batch(source=-1, messages=[encode(x) for x in m.messages])),
}
_DECODERS: dict[str, Callable[[Any], Message]] = {
    "dispatch": _decode_dispatch,
    "push": _decode_push,
    "corrective": _decode_corrective,
    "settled": lambda m: Settled(m.seq),
    "epoch_end": lambda m: EpochEnd(m.cut, m.switch_id),
    "epoch_ready": lambda m: EpochReady(m.cut, m.source),
    "epoch_commit": lambda m: EpochCommit(m.cut),
    "epoch_end_request": lambda m: EpochEndRequest(m.source),
    "batch": lambda m: Batch(tuple(decode(x) for x in m.messages)),
}


def encode(message: Message) -> pb.Envelope:
    if type(message) not in _ENCODERS:
        raise TypeError(f"cannot encode {type(message).__name__}: not a Cumulus runtime message")
    field, encoder = _ENCODERS[type(message)]
    return pb.Envelope(**{field: encoder(message)})


def decode(envelope: pb.Envelope) -> Message:
    if not isinstance(envelope, pb.Envelope):
        raise TypeError(f"cannot decode {type(envelope).__name__}: not an Envelope")
    kind = envelope.WhichOneof("kind")
    if kind not in _DECODERS:
        raise TypeError(f"cannot decode an envelope of kind {kind!r}: not a runtime message")
    return _DECODERS[kind](getattr(envelope, kind))
