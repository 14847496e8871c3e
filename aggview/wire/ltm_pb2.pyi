from aggview.wire import client_pb2 as _client_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RowOp(_message.Message):
    __slots__ = ("kind", "table", "key", "values", "require", "limits", "changes_tables", "guarded")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        INSERT: _ClassVar[RowOp.Kind]
        UPDATE: _ClassVar[RowOp.Kind]
        ADD: _ClassVar[RowOp.Kind]
        DELETE: _ClassVar[RowOp.Kind]
        PUT: _ClassVar[RowOp.Kind]
        MERGE: _ClassVar[RowOp.Kind]
        BACKFILL: _ClassVar[RowOp.Kind]
    INSERT: RowOp.Kind
    UPDATE: RowOp.Kind
    ADD: RowOp.Kind
    DELETE: RowOp.Kind
    PUT: RowOp.Kind
    MERGE: RowOp.Kind
    BACKFILL: RowOp.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    CHANGES_TABLES_FIELD_NUMBER: _ClassVar[int]
    GUARDED_FIELD_NUMBER: _ClassVar[int]
    kind: RowOp.Kind
    table: str
    key: bytes
    values: bytes
    require: bytes
    limits: bytes
    changes_tables: _containers.RepeatedScalarFieldContainer[str]
    guarded: bool
    def __init__(self, kind: _Optional[_Union[RowOp.Kind, str]] = ..., table: _Optional[str] = ..., key: _Optional[bytes] = ..., values: _Optional[bytes] = ..., require: _Optional[bytes] = ..., limits: _Optional[bytes] = ..., changes_tables: _Optional[_Iterable[str]] = ..., guarded: _Optional[bool] = ...) -> None: ...

class SubTransaction(_message.Message):
    __slots__ = ("ts", "ops", "want_images")
    TS_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    WANT_IMAGES_FIELD_NUMBER: _ClassVar[int]
    ts: int
    ops: _containers.RepeatedCompositeFieldContainer[RowOp]
    want_images: bool
    def __init__(self, ts: _Optional[int] = ..., ops: _Optional[_Iterable[_Union[RowOp, _Mapping]]] = ..., want_images: _Optional[bool] = ...) -> None: ...

class PrepareRequest(_message.Message):
    __slots__ = ("subs", "low_watermark", "issued")
    SUBS_FIELD_NUMBER: _ClassVar[int]
    LOW_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    ISSUED_FIELD_NUMBER: _ClassVar[int]
    subs: _containers.RepeatedCompositeFieldContainer[SubTransaction]
    low_watermark: int
    issued: int
    def __init__(self, subs: _Optional[_Iterable[_Union[SubTransaction, _Mapping]]] = ..., low_watermark: _Optional[int] = ..., issued: _Optional[int] = ...) -> None: ...

class RowImage(_message.Message):
    __slots__ = ("table", "key", "before", "after")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    table: str
    key: bytes
    before: bytes
    after: bytes
    def __init__(self, table: _Optional[str] = ..., key: _Optional[bytes] = ..., before: _Optional[bytes] = ..., after: _Optional[bytes] = ...) -> None: ...

class Vote(_message.Message):
    __slots__ = ("ts", "outcome", "message", "images", "table", "key")
    class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        YES: _ClassVar[Vote.Outcome]
        TOO_LATE: _ClassVar[Vote.Outcome]
        CONDITION_FAILED: _ClassVar[Vote.Outcome]
        NOT_FOUND: _ClassVar[Vote.Outcome]
        ALREADY_EXISTS: _ClassVar[Vote.Outcome]
        INVALID: _ClassVar[Vote.Outcome]
        UNAVAILABLE: _ClassVar[Vote.Outcome]
    YES: Vote.Outcome
    TOO_LATE: Vote.Outcome
    CONDITION_FAILED: Vote.Outcome
    NOT_FOUND: Vote.Outcome
    ALREADY_EXISTS: Vote.Outcome
    INVALID: Vote.Outcome
    UNAVAILABLE: Vote.Outcome
    TS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    ts: int
    outcome: Vote.Outcome
    message: str
    images: _containers.RepeatedCompositeFieldContainer[RowImage]
    table: str
    key: bytes
    def __init__(self, ts: _Optional[int] = ..., outcome: _Optional[_Union[Vote.Outcome, str]] = ..., message: _Optional[str] = ..., images: _Optional[_Iterable[_Union[RowImage, _Mapping]]] = ..., table: _Optional[str] = ..., key: _Optional[bytes] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("ts", "commit")
    TS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    ts: int
    commit: bool
    def __init__(self, ts: _Optional[int] = ..., commit: _Optional[bool] = ...) -> None: ...

class DecideRequest(_message.Message):
    __slots__ = ("decisions", "low_watermark")
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    LOW_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    low_watermark: int
    def __init__(self, decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ..., low_watermark: _Optional[int] = ...) -> None: ...

class DecideReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KeyValue(_message.Message):
    __slots__ = ("key", "row")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    row: bytes
    def __init__(self, key: _Optional[bytes] = ..., row: _Optional[bytes] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("ts", "table", "keys", "scan", "start", "stop", "limit", "register_read", "page")
    TS_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SCAN_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    REGISTER_READ_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    ts: int
    table: str
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    scan: bool
    start: bytes
    stop: bytes
    limit: int
    register_read: bool
    page: bool
    def __init__(self, ts: _Optional[int] = ..., table: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., scan: _Optional[bool] = ..., start: _Optional[bytes] = ..., stop: _Optional[bytes] = ..., limit: _Optional[int] = ..., register_read: _Optional[bool] = ..., page: _Optional[bool] = ...) -> None: ...

class ReadReply(_message.Message):
    __slots__ = ("rows", "resume")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[KeyValue]
    resume: bytes
    def __init__(self, rows: _Optional[_Iterable[_Union[KeyValue, _Mapping]]] = ..., resume: _Optional[bytes] = ...) -> None: ...

class DropTableRequest(_message.Message):
    __slots__ = ("table",)
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: str
    def __init__(self, table: _Optional[str] = ...) -> None: ...

class DropTableReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("index", "partitions", "cached_rows", "dirty_rows", "prepared", "checkpoints", "log_bytes", "epoch", "replicas", "replicated", "serving", "coordinated", "clock_requests", "clock_replies", "refreshes", "reaches", "leader", "term", "views", "metrics_port")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CACHED_ROWS_FIELD_NUMBER: _ClassVar[int]
    DIRTY_ROWS_FIELD_NUMBER: _ClassVar[int]
    PREPARED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    LOG_BYTES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    COORDINATED_FIELD_NUMBER: _ClassVar[int]
    CLOCK_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CLOCK_REPLIES_FIELD_NUMBER: _ClassVar[int]
    REFRESHES_FIELD_NUMBER: _ClassVar[int]
    REACHES_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    VIEWS_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    index: int
    partitions: int
    cached_rows: int
    dirty_rows: int
    prepared: int
    checkpoints: int
    log_bytes: int
    epoch: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    replicated: bool
    serving: _containers.RepeatedScalarFieldContainer[int]
    coordinated: int
    clock_requests: int
    clock_replies: int
    refreshes: int
    reaches: _containers.RepeatedScalarFieldContainer[int]
    leader: int
    term: int
    views: _containers.RepeatedCompositeFieldContainer[ViewStatus]
    metrics_port: int
    def __init__(self, index: _Optional[int] = ..., partitions: _Optional[int] = ..., cached_rows: _Optional[int] = ..., dirty_rows: _Optional[int] = ..., prepared: _Optional[int] = ..., checkpoints: _Optional[int] = ..., log_bytes: _Optional[int] = ..., epoch: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., replicated: _Optional[bool] = ..., serving: _Optional[_Iterable[int]] = ..., coordinated: _Optional[int] = ..., clock_requests: _Optional[int] = ..., clock_replies: _Optional[int] = ..., refreshes: _Optional[int] = ..., reaches: _Optional[_Iterable[int]] = ..., leader: _Optional[int] = ..., term: _Optional[int] = ..., views: _Optional[_Iterable[_Union[ViewStatus, _Mapping]]] = ..., metrics_port: _Optional[int] = ...) -> None: ...

class ViewStatus(_message.Message):
    __slots__ = ("name", "mode", "state", "lag_seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAG_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    mode: str
    state: str
    lag_seconds: float
    def __init__(self, name: _Optional[str] = ..., mode: _Optional[str] = ..., state: _Optional[str] = ..., lag_seconds: _Optional[float] = ...) -> None: ...

class ReplicateRequest(_message.Message):
    __slots__ = ("partition", "epoch", "reset", "chunks", "drop_before")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    DROP_BEFORE_FIELD_NUMBER: _ClassVar[int]
    partition: int
    epoch: int
    reset: bool
    chunks: _containers.RepeatedCompositeFieldContainer[LogChunk]
    drop_before: int
    def __init__(self, partition: _Optional[int] = ..., epoch: _Optional[int] = ..., reset: _Optional[bool] = ..., chunks: _Optional[_Iterable[_Union[LogChunk, _Mapping]]] = ..., drop_before: _Optional[int] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("segment", "data")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    segment: int
    data: bytes
    def __init__(self, segment: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ReplicateReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TakeOverRequest(_message.Message):
    __slots__ = ("partition", "epoch", "backup", "backup_address")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BACKUP_FIELD_NUMBER: _ClassVar[int]
    BACKUP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    epoch: int
    backup: int
    backup_address: str
    def __init__(self, partition: _Optional[int] = ..., epoch: _Optional[int] = ..., backup: _Optional[int] = ..., backup_address: _Optional[str] = ...) -> None: ...

class TakeOverReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HandOverRequest(_message.Message):
    __slots__ = ("partition", "epoch", "to", "from_address")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    FROM_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    epoch: int
    to: int
    from_address: str
    def __init__(self, partition: _Optional[int] = ..., epoch: _Optional[int] = ..., to: _Optional[int] = ..., from_address: _Optional[str] = ...) -> None: ...

class HandOverReply(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class LtmRequest(_message.Message):
    __slots__ = ("id", "prepare", "decide", "read")
    ID_FIELD_NUMBER: _ClassVar[int]
    PREPARE_FIELD_NUMBER: _ClassVar[int]
    DECIDE_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    id: int
    prepare: PrepareRequest
    decide: DecideRequest
    read: ReadRequest
    def __init__(self, id: _Optional[int] = ..., prepare: _Optional[_Union[PrepareRequest, _Mapping]] = ..., decide: _Optional[_Union[DecideRequest, _Mapping]] = ..., read: _Optional[_Union[ReadRequest, _Mapping]] = ...) -> None: ...

class LtmReply(_message.Message):
    __slots__ = ("id", "vote", "decided", "error", "rows", "error_reason")
    ID_FIELD_NUMBER: _ClassVar[int]
    VOTE_FIELD_NUMBER: _ClassVar[int]
    DECIDED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ERROR_REASON_FIELD_NUMBER: _ClassVar[int]
    id: int
    vote: Vote
    decided: DecideReply
    error: str
    rows: ReadReply
    error_reason: str
    def __init__(self, id: _Optional[int] = ..., vote: _Optional[_Union[Vote, _Mapping]] = ..., decided: _Optional[_Union[DecideReply, _Mapping]] = ..., error: _Optional[str] = ..., rows: _Optional[_Union[ReadReply, _Mapping]] = ..., error_reason: _Optional[str] = ...) -> None: ...

class LtmRequests(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[LtmRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[LtmRequest, _Mapping]]] = ...) -> None: ...

class LtmReplies(_message.Message):
    __slots__ = ("replies",)
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[LtmReply]
    def __init__(self, replies: _Optional[_Iterable[_Union[LtmReply, _Mapping]]] = ...) -> None: ...

class ExchangeHello(_message.Message):
    __slots__ = ("secret", "partition", "epoch", "stream", "token")
    SECRET_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    secret: str
    partition: int
    epoch: int
    stream: str
    token: str
    def __init__(self, secret: _Optional[str] = ..., partition: _Optional[int] = ..., epoch: _Optional[int] = ..., stream: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class OutcomeRequest(_message.Message):
    __slots__ = ("ts",)
    TS_FIELD_NUMBER: _ClassVar[int]
    ts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ts: _Optional[_Iterable[int]] = ...) -> None: ...

class OutcomeReply(_message.Message):
    __slots__ = ("outcomes", "answers_for")
    class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        PENDING: _ClassVar[OutcomeReply.Outcome]
        COMMITTED: _ClassVar[OutcomeReply.Outcome]
        ABORTED: _ClassVar[OutcomeReply.Outcome]
    PENDING: OutcomeReply.Outcome
    COMMITTED: OutcomeReply.Outcome
    ABORTED: OutcomeReply.Outcome
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_FOR_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedScalarFieldContainer[OutcomeReply.Outcome]
    answers_for: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[OutcomeReply.Outcome, str]]] = ..., answers_for: _Optional[_Iterable[int]] = ...) -> None: ...

class ClockRequest(_message.Message):
    __slots__ = ("member", "count", "read", "report", "seen", "undecided", "reading", "wait", "write_rows", "write_tables", "write_epoch")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    SEEN_FIELD_NUMBER: _ClassVar[int]
    UNDECIDED_FIELD_NUMBER: _ClassVar[int]
    READING_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    WRITE_ROWS_FIELD_NUMBER: _ClassVar[int]
    WRITE_TABLES_FIELD_NUMBER: _ClassVar[int]
    WRITE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    member: int
    count: int
    read: bool
    report: bool
    seen: int
    undecided: int
    reading: int
    wait: int
    write_rows: _containers.RepeatedCompositeFieldContainer[CachedRow]
    write_tables: _containers.RepeatedScalarFieldContainer[str]
    write_epoch: int
    def __init__(self, member: _Optional[int] = ..., count: _Optional[int] = ..., read: _Optional[bool] = ..., report: _Optional[bool] = ..., seen: _Optional[int] = ..., undecided: _Optional[int] = ..., reading: _Optional[int] = ..., wait: _Optional[int] = ..., write_rows: _Optional[_Iterable[_Union[CachedRow, _Mapping]]] = ..., write_tables: _Optional[_Iterable[str]] = ..., write_epoch: _Optional[int] = ...) -> None: ...

class CachedRow(_message.Message):
    __slots__ = ("table", "key")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    table: str
    key: bytes
    def __init__(self, table: _Optional[str] = ..., key: _Optional[bytes] = ...) -> None: ...

class WriteNotice(_message.Message):
    __slots__ = ("first", "last", "rows", "tables", "everything")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    EVERYTHING_FIELD_NUMBER: _ClassVar[int]
    first: int
    last: int
    rows: _containers.RepeatedCompositeFieldContainer[CachedRow]
    tables: _containers.RepeatedScalarFieldContainer[str]
    everything: bool
    def __init__(self, first: _Optional[int] = ..., last: _Optional[int] = ..., rows: _Optional[_Iterable[_Union[CachedRow, _Mapping]]] = ..., tables: _Optional[_Iterable[str]] = ..., everything: _Optional[bool] = ...) -> None: ...

class ClockReply(_message.Message):
    __slots__ = ("seq", "first", "count", "read_ts", "issued", "decided", "low", "epoch", "configuration", "notices")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    READ_TS_FIELD_NUMBER: _ClassVar[int]
    ISSUED_FIELD_NUMBER: _ClassVar[int]
    DECIDED_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CONFIGURATION_FIELD_NUMBER: _ClassVar[int]
    NOTICES_FIELD_NUMBER: _ClassVar[int]
    seq: int
    first: int
    count: int
    read_ts: int
    issued: int
    decided: int
    low: int
    epoch: int
    configuration: bytes
    notices: _containers.RepeatedCompositeFieldContainer[WriteNotice]
    def __init__(self, seq: _Optional[int] = ..., first: _Optional[int] = ..., count: _Optional[int] = ..., read_ts: _Optional[int] = ..., issued: _Optional[int] = ..., decided: _Optional[int] = ..., low: _Optional[int] = ..., epoch: _Optional[int] = ..., configuration: _Optional[bytes] = ..., notices: _Optional[_Iterable[_Union[WriteNotice, _Mapping]]] = ...) -> None: ...

class ViewCondition(_message.Message):
    __slots__ = ("column", "op", "values")
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    column: str
    op: str
    values: _containers.RepeatedCompositeFieldContainer[_client_pb2.Value]
    def __init__(self, column: _Optional[str] = ..., op: _Optional[str] = ..., values: _Optional[_Iterable[_Union[_client_pb2.Value, _Mapping]]] = ...) -> None: ...

class LeaderViewRequest(_message.Message):
    __slots__ = ("view", "conditions", "keep", "roll_up", "tentative")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    ROLL_UP_FIELD_NUMBER: _ClassVar[int]
    TENTATIVE_FIELD_NUMBER: _ClassVar[int]
    view: str
    conditions: _containers.RepeatedCompositeFieldContainer[ViewCondition]
    keep: _containers.RepeatedScalarFieldContainer[str]
    roll_up: bool
    tentative: bool
    def __init__(self, view: _Optional[str] = ..., conditions: _Optional[_Iterable[_Union[ViewCondition, _Mapping]]] = ..., keep: _Optional[_Iterable[str]] = ..., roll_up: _Optional[bool] = ..., tentative: _Optional[bool] = ...) -> None: ...

class LeaderViewReply(_message.Message):
    __slots__ = ("rows", "timestamp", "tentative")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    TENTATIVE_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[_client_pb2.Row]
    timestamp: int
    tentative: bool
    def __init__(self, rows: _Optional[_Iterable[_Union[_client_pb2.Row, _Mapping]]] = ..., timestamp: _Optional[int] = ..., tentative: _Optional[bool] = ...) -> None: ...

class SwitchCommit(_message.Message):
    __slots__ = ("ts", "changes", "more")
    TS_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    ts: int
    changes: _containers.RepeatedCompositeFieldContainer[RowImage]
    more: bool
    def __init__(self, ts: _Optional[int] = ..., changes: _Optional[_Iterable[_Union[RowImage, _Mapping]]] = ..., more: _Optional[bool] = ...) -> None: ...

class SwitchRequest(_message.Message):
    __slots__ = ("member", "fresh", "seq", "commits", "epoch_end")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    FRESH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    COMMITS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_END_FIELD_NUMBER: _ClassVar[int]
    member: int
    fresh: bool
    seq: int
    commits: _containers.RepeatedCompositeFieldContainer[SwitchCommit]
    epoch_end: int
    def __init__(self, member: _Optional[int] = ..., fresh: _Optional[bool] = ..., seq: _Optional[int] = ..., commits: _Optional[_Iterable[_Union[SwitchCommit, _Mapping]]] = ..., epoch_end: _Optional[int] = ...) -> None: ...

class SwitchReply(_message.Message):
    __slots__ = ("acked", "cut")
    ACKED_FIELD_NUMBER: _ClassVar[int]
    CUT_FIELD_NUMBER: _ClassVar[int]
    acked: int
    cut: int
    def __init__(self, acked: _Optional[int] = ..., cut: _Optional[int] = ...) -> None: ...
