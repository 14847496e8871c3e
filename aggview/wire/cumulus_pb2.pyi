from aggview.wire import client_pb2 as _client_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Ts(_message.Message):
    __slots__ = ("counter", "switch_id")
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    SWITCH_ID_FIELD_NUMBER: _ClassVar[int]
    counter: int
    switch_id: int
    def __init__(self, counter: _Optional[int] = ..., switch_id: _Optional[int] = ...) -> None: ...

class Key(_message.Message):
    __slots__ = ("parts",)
    PARTS_FIELD_NUMBER: _ClassVar[int]
    parts: _containers.RepeatedCompositeFieldContainer[_client_pb2.Value]
    def __init__(self, parts: _Optional[_Iterable[_Union[_client_pb2.Value, _Mapping]]] = ...) -> None: ...

class Entry(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: Key
    value: _client_pb2.Value
    def __init__(self, key: _Optional[_Union[Key, _Mapping]] = ..., value: _Optional[_Union[_client_pb2.Value, _Mapping]] = ...) -> None: ...

class Pattern(_message.Message):
    __slots__ = ("parts", "open")
    PARTS_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    parts: _containers.RepeatedCompositeFieldContainer[_client_pb2.Value]
    open: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, parts: _Optional[_Iterable[_Union[_client_pb2.Value, _Mapping]]] = ..., open: _Optional[_Iterable[bool]] = ...) -> None: ...

class Fetch(_message.Message):
    __slots__ = ("statement", "factors", "writers")
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    FACTORS_FIELD_NUMBER: _ClassVar[int]
    WRITERS_FIELD_NUMBER: _ClassVar[int]
    statement: int
    factors: _containers.RepeatedScalarFieldContainer[int]
    writers: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, statement: _Optional[int] = ..., factors: _Optional[_Iterable[int]] = ..., writers: _Optional[_Iterable[int]] = ...) -> None: ...

class PutCount(_message.Message):
    __slots__ = ("statement", "pushes")
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    PUSHES_FIELD_NUMBER: _ClassVar[int]
    statement: int
    pushes: int
    def __init__(self, statement: _Optional[int] = ..., pushes: _Optional[int] = ...) -> None: ...

class Dispatch(_message.Message):
    __slots__ = ("ts", "trigger", "args", "puts", "fetches", "puts_before")
    TS_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    PUTS_FIELD_NUMBER: _ClassVar[int]
    FETCHES_FIELD_NUMBER: _ClassVar[int]
    PUTS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    ts: Ts
    trigger: int
    args: _containers.RepeatedCompositeFieldContainer[_client_pb2.Value]
    puts: _containers.RepeatedCompositeFieldContainer[PutCount]
    fetches: _containers.RepeatedCompositeFieldContainer[Fetch]
    puts_before: int
    def __init__(self, ts: _Optional[_Union[Ts, _Mapping]] = ..., trigger: _Optional[int] = ..., args: _Optional[_Iterable[_Union[_client_pb2.Value, _Mapping]]] = ..., puts: _Optional[_Iterable[_Union[PutCount, _Mapping]]] = ..., fetches: _Optional[_Iterable[_Union[Fetch, _Mapping]]] = ..., puts_before: _Optional[int] = ...) -> None: ...

class Slice(_message.Message):
    __slots__ = ("statement", "factor", "entries")
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    FACTOR_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    statement: int
    factor: int
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    def __init__(self, statement: _Optional[int] = ..., factor: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ...) -> None: ...

class Push(_message.Message):
    __slots__ = ("ts", "source", "statements", "slices")
    TS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STATEMENTS_FIELD_NUMBER: _ClassVar[int]
    SLICES_FIELD_NUMBER: _ClassVar[int]
    ts: Ts
    source: int
    statements: _containers.RepeatedScalarFieldContainer[int]
    slices: _containers.RepeatedCompositeFieldContainer[Slice]
    def __init__(self, ts: _Optional[_Union[Ts, _Mapping]] = ..., source: _Optional[int] = ..., statements: _Optional[_Iterable[int]] = ..., slices: _Optional[_Iterable[_Union[Slice, _Mapping]]] = ...) -> None: ...

class ReadRef(_message.Message):
    __slots__ = ("ts", "statement", "factor")
    TS_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    FACTOR_FIELD_NUMBER: _ClassVar[int]
    ts: Ts
    statement: int
    factor: int
    def __init__(self, ts: _Optional[_Union[Ts, _Mapping]] = ..., statement: _Optional[int] = ..., factor: _Optional[int] = ...) -> None: ...

class Corrective(_message.Message):
    __slots__ = ("source", "write_ts", "map", "key", "delta", "reads", "depth", "seq")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    WRITE_TS_FIELD_NUMBER: _ClassVar[int]
    MAP_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    READS_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    source: int
    write_ts: Ts
    map: str
    key: Key
    delta: _client_pb2.Value
    reads: _containers.RepeatedCompositeFieldContainer[ReadRef]
    depth: int
    seq: int
    def __init__(self, source: _Optional[int] = ..., write_ts: _Optional[_Union[Ts, _Mapping]] = ..., map: _Optional[str] = ..., key: _Optional[_Union[Key, _Mapping]] = ..., delta: _Optional[_Union[_client_pb2.Value, _Mapping]] = ..., reads: _Optional[_Iterable[_Union[ReadRef, _Mapping]]] = ..., depth: _Optional[int] = ..., seq: _Optional[int] = ...) -> None: ...

class Settled(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...

class EpochEnd(_message.Message):
    __slots__ = ("cut", "switch_id")
    CUT_FIELD_NUMBER: _ClassVar[int]
    SWITCH_ID_FIELD_NUMBER: _ClassVar[int]
    cut: int
    switch_id: int
    def __init__(self, cut: _Optional[int] = ..., switch_id: _Optional[int] = ...) -> None: ...

class EpochReady(_message.Message):
    __slots__ = ("cut", "source")
    CUT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    cut: int
    source: int
    def __init__(self, cut: _Optional[int] = ..., source: _Optional[int] = ...) -> None: ...

class EpochCommit(_message.Message):
    __slots__ = ("cut",)
    CUT_FIELD_NUMBER: _ClassVar[int]
    cut: int
    def __init__(self, cut: _Optional[int] = ...) -> None: ...

class EpochEndRequest(_message.Message):
    __slots__ = ("source",)
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    source: int
    def __init__(self, source: _Optional[int] = ...) -> None: ...

class Completed(_message.Message):
    __slots__ = ("ts",)
    TS_FIELD_NUMBER: _ClassVar[int]
    ts: _containers.RepeatedCompositeFieldContainer[Ts]
    def __init__(self, ts: _Optional[_Iterable[_Union[Ts, _Mapping]]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("switch_id", "peers")
    SWITCH_ID_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    switch_id: int
    peers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, switch_id: _Optional[int] = ..., peers: _Optional[_Iterable[str]] = ...) -> None: ...

class Envelope(_message.Message):
    __slots__ = ("dispatch", "push", "corrective", "settled", "epoch_end", "epoch_ready", "epoch_commit", "epoch_end_request", "completed", "hello", "batch")
    DISPATCH_FIELD_NUMBER: _ClassVar[int]
    PUSH_FIELD_NUMBER: _ClassVar[int]
    CORRECTIVE_FIELD_NUMBER: _ClassVar[int]
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_END_FIELD_NUMBER: _ClassVar[int]
    EPOCH_READY_FIELD_NUMBER: _ClassVar[int]
    EPOCH_COMMIT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_END_REQUEST_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    dispatch: Dispatch
    push: Push
    corrective: Corrective
    settled: Settled
    epoch_end: EpochEnd
    epoch_ready: EpochReady
    epoch_commit: EpochCommit
    epoch_end_request: EpochEndRequest
    completed: Completed
    hello: Hello
    batch: Batch
    def __init__(self, dispatch: _Optional[_Union[Dispatch, _Mapping]] = ..., push: _Optional[_Union[Push, _Mapping]] = ..., corrective: _Optional[_Union[Corrective, _Mapping]] = ..., settled: _Optional[_Union[Settled, _Mapping]] = ..., epoch_end: _Optional[_Union[EpochEnd, _Mapping]] = ..., epoch_ready: _Optional[_Union[EpochReady, _Mapping]] = ..., epoch_commit: _Optional[_Union[EpochCommit, _Mapping]] = ..., epoch_end_request: _Optional[_Union[EpochEndRequest, _Mapping]] = ..., completed: _Optional[_Union[Completed, _Mapping]] = ..., hello: _Optional[_Union[Hello, _Mapping]] = ..., batch: _Optional[_Union[Batch, _Mapping]] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("source", "messages")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    source: int
    messages: _containers.RepeatedCompositeFieldContainer[Envelope]
    def __init__(self, source: _Optional[int] = ..., messages: _Optional[_Iterable[_Union[Envelope, _Mapping]]] = ...) -> None: ...

class LinkReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MapRequest(_message.Message):
    __slots__ = ("map", "committed", "cut")
    MAP_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    CUT_FIELD_NUMBER: _ClassVar[int]
    map: str
    committed: bool
    cut: int
    def __init__(self, map: _Optional[str] = ..., committed: _Optional[bool] = ..., cut: _Optional[int] = ...) -> None: ...

class MapReply(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    def __init__(self, entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ...) -> None: ...

class PreloadRequest(_message.Message):
    __slots__ = ("map", "entries")
    MAP_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    map: str
    entries: _containers.RepeatedCompositeFieldContainer[Entry]
    def __init__(self, map: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[Entry, _Mapping]]] = ...) -> None: ...

class PreloadReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatsReply(_message.Message):
    __slots__ = ("corrective_sent", "corrective_received", "max_depth", "deferred_fetches", "epochs", "write_log_entries", "read_log_entries", "operations", "messages_sent", "bytes_sent", "committed")
    class MessagesSentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class BytesSentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CORRECTIVE_SENT_FIELD_NUMBER: _ClassVar[int]
    CORRECTIVE_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    MAX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_FETCHES_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    WRITE_LOG_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    READ_LOG_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_SENT_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    corrective_sent: int
    corrective_received: int
    max_depth: int
    deferred_fetches: int
    epochs: int
    write_log_entries: int
    read_log_entries: int
    operations: int
    messages_sent: _containers.ScalarMap[str, int]
    bytes_sent: _containers.ScalarMap[str, int]
    committed: int
    def __init__(self, corrective_sent: _Optional[int] = ..., corrective_received: _Optional[int] = ..., max_depth: _Optional[int] = ..., deferred_fetches: _Optional[int] = ..., epochs: _Optional[int] = ..., write_log_entries: _Optional[int] = ..., read_log_entries: _Optional[int] = ..., operations: _Optional[int] = ..., messages_sent: _Optional[_Mapping[str, int]] = ..., bytes_sent: _Optional[_Mapping[str, int]] = ..., committed: _Optional[int] = ...) -> None: ...

class AssignRequest(_message.Message):
    __slots__ = ("view", "run", "program", "number", "nodes", "switches", "mode", "per_switch")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    SWITCHES_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PER_SWITCH_FIELD_NUMBER: _ClassVar[int]
    view: str
    run: str
    program: str
    number: int
    nodes: int
    switches: int
    mode: str
    per_switch: bool
    def __init__(self, view: _Optional[str] = ..., run: _Optional[str] = ..., program: _Optional[str] = ..., number: _Optional[int] = ..., nodes: _Optional[int] = ..., switches: _Optional[int] = ..., mode: _Optional[str] = ..., per_switch: _Optional[bool] = ...) -> None: ...

class AssignReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
