from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Comparison(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EQ: _ClassVar[Comparison]
    NE: _ClassVar[Comparison]
    LT: _ClassVar[Comparison]
    LE: _ClassVar[Comparison]
    GT: _ClassVar[Comparison]
    GE: _ClassVar[Comparison]
EQ: Comparison
NE: Comparison
LT: Comparison
LE: Comparison
GT: Comparison
GE: Comparison

class Value(_message.Message):
    __slots__ = ("null", "int_value", "decimal_value", "float_value", "text_value", "date_value", "bool_value")
    NULL_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DECIMAL_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    TEXT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DATE_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    null: bool
    int_value: int
    decimal_value: str
    float_value: float
    text_value: str
    date_value: int
    bool_value: bool
    def __init__(self, null: _Optional[bool] = ..., int_value: _Optional[int] = ..., decimal_value: _Optional[str] = ..., float_value: _Optional[float] = ..., text_value: _Optional[str] = ..., date_value: _Optional[int] = ..., bool_value: _Optional[bool] = ...) -> None: ...

class Row(_message.Message):
    __slots__ = ("columns",)
    class ColumnsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    columns: _containers.MessageMap[str, Value]
    def __init__(self, columns: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class Condition(_message.Message):
    __slots__ = ("column", "op", "value")
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    column: str
    op: Comparison
    value: Value
    def __init__(self, column: _Optional[str] = ..., op: _Optional[_Union[Comparison, str]] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...

class Operation(_message.Message):
    __slots__ = ("kind", "table", "key", "values", "require")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        INSERT: _ClassVar[Operation.Kind]
        UPDATE: _ClassVar[Operation.Kind]
        ADD: _ClassVar[Operation.Kind]
        DELETE: _ClassVar[Operation.Kind]
    INSERT: Operation.Kind
    UPDATE: Operation.Kind
    ADD: Operation.Kind
    DELETE: Operation.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_FIELD_NUMBER: _ClassVar[int]
    kind: Operation.Kind
    table: str
    key: Row
    values: Row
    require: _containers.RepeatedCompositeFieldContainer[Condition]
    def __init__(self, kind: _Optional[_Union[Operation.Kind, str]] = ..., table: _Optional[str] = ..., key: _Optional[_Union[Row, _Mapping]] = ..., values: _Optional[_Union[Row, _Mapping]] = ..., require: _Optional[_Iterable[_Union[Condition, _Mapping]]] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("operations",)
    OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    operations: _containers.RepeatedCompositeFieldContainer[Operation]
    def __init__(self, operations: _Optional[_Iterable[_Union[Operation, _Mapping]]] = ...) -> None: ...

class CommitReply(_message.Message):
    __slots__ = ("timestamp",)
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    timestamp: int
    def __init__(self, timestamp: _Optional[int] = ...) -> None: ...

class TransactRequest(_message.Message):
    __slots__ = ("id", "operations")
    ID_FIELD_NUMBER: _ClassVar[int]
    OPERATIONS_FIELD_NUMBER: _ClassVar[int]
    id: int
    operations: _containers.RepeatedCompositeFieldContainer[Operation]
    def __init__(self, id: _Optional[int] = ..., operations: _Optional[_Iterable[_Union[Operation, _Mapping]]] = ...) -> None: ...

class TransactRequests(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[TransactRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[TransactRequest, _Mapping]]] = ...) -> None: ...

class TransactReply(_message.Message):
    __slots__ = ("id", "timestamp", "code", "message", "reason")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    id: int
    timestamp: int
    code: int
    message: str
    reason: str
    def __init__(self, id: _Optional[int] = ..., timestamp: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class TransactReplies(_message.Message):
    __slots__ = ("replies",)
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    replies: _containers.RepeatedCompositeFieldContainer[TransactReply]
    def __init__(self, replies: _Optional[_Iterable[_Union[TransactReply, _Mapping]]] = ...) -> None: ...

class SqlRequest(_message.Message):
    __slots__ = ("sql", "as_of", "tentative")
    SQL_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    TENTATIVE_FIELD_NUMBER: _ClassVar[int]
    sql: str
    as_of: int
    tentative: bool
    def __init__(self, sql: _Optional[str] = ..., as_of: _Optional[int] = ..., tentative: _Optional[bool] = ...) -> None: ...

class SqlReply(_message.Message):
    __slots__ = ("message", "columns", "rows", "timestamp", "results", "tentative")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    TENTATIVE_FIELD_NUMBER: _ClassVar[int]
    message: str
    columns: _containers.RepeatedScalarFieldContainer[str]
    rows: _containers.RepeatedCompositeFieldContainer[Row]
    timestamp: int
    results: _containers.RepeatedCompositeFieldContainer[SqlReply]
    tentative: bool
    def __init__(self, message: _Optional[str] = ..., columns: _Optional[_Iterable[str]] = ..., rows: _Optional[_Iterable[_Union[Row, _Mapping]]] = ..., timestamp: _Optional[int] = ..., results: _Optional[_Iterable[_Union[SqlReply, _Mapping]]] = ..., tentative: _Optional[bool] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("table", "key", "as_of")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    table: str
    key: Row
    as_of: int
    def __init__(self, table: _Optional[str] = ..., key: _Optional[_Union[Row, _Mapping]] = ..., as_of: _Optional[int] = ...) -> None: ...

class GetReply(_message.Message):
    __slots__ = ("found", "row", "timestamp")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    found: bool
    row: Row
    timestamp: int
    def __init__(self, found: _Optional[bool] = ..., row: _Optional[_Union[Row, _Mapping]] = ..., timestamp: _Optional[int] = ...) -> None: ...

class ScanRequest(_message.Message):
    __slots__ = ("table", "prefix", "limit", "as_of")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    table: str
    prefix: Row
    limit: int
    as_of: int
    def __init__(self, table: _Optional[str] = ..., prefix: _Optional[_Union[Row, _Mapping]] = ..., limit: _Optional[int] = ..., as_of: _Optional[int] = ...) -> None: ...

class ScanReply(_message.Message):
    __slots__ = ("rows", "timestamp", "columns")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[Row]
    timestamp: int
    columns: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, rows: _Optional[_Iterable[_Union[Row, _Mapping]]] = ..., timestamp: _Optional[int] = ..., columns: _Optional[_Iterable[str]] = ...) -> None: ...

class ViewRequest(_message.Message):
    __slots__ = ("view", "where", "as_of", "tentative")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    WHERE_FIELD_NUMBER: _ClassVar[int]
    AS_OF_FIELD_NUMBER: _ClassVar[int]
    TENTATIVE_FIELD_NUMBER: _ClassVar[int]
    view: str
    where: Row
    as_of: int
    tentative: bool
    def __init__(self, view: _Optional[str] = ..., where: _Optional[_Union[Row, _Mapping]] = ..., as_of: _Optional[int] = ..., tentative: _Optional[bool] = ...) -> None: ...

class ViewReply(_message.Message):
    __slots__ = ("rows", "timestamp", "columns", "tentative")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    TENTATIVE_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[Row]
    timestamp: int
    columns: _containers.RepeatedScalarFieldContainer[str]
    tentative: bool
    def __init__(self, rows: _Optional[_Iterable[_Union[Row, _Mapping]]] = ..., timestamp: _Optional[int] = ..., columns: _Optional[_Iterable[str]] = ..., tentative: _Optional[bool] = ...) -> None: ...

class RefreshRequest(_message.Message):
    __slots__ = ("view",)
    VIEW_FIELD_NUMBER: _ClassVar[int]
    view: str
    def __init__(self, view: _Optional[str] = ...) -> None: ...

class RefreshReply(_message.Message):
    __slots__ = ("timestamp",)
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    timestamp: int
    def __init__(self, timestamp: _Optional[int] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DescribeReply(_message.Message):
    __slots__ = ("kind", "store_table", "schema_json", "plan_json", "base_schemas_json", "columns", "refreshed_at", "state", "store_url", "runtime_json")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        TABLE: _ClassVar[DescribeReply.Kind]
        VIEW: _ClassVar[DescribeReply.Kind]
    TABLE: DescribeReply.Kind
    VIEW: DescribeReply.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    STORE_TABLE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    BASE_SCHEMAS_JSON_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    REFRESHED_AT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STORE_URL_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_JSON_FIELD_NUMBER: _ClassVar[int]
    kind: DescribeReply.Kind
    store_table: str
    schema_json: str
    plan_json: str
    base_schemas_json: _containers.RepeatedScalarFieldContainer[str]
    columns: _containers.RepeatedScalarFieldContainer[str]
    refreshed_at: int
    state: str
    store_url: str
    runtime_json: str
    def __init__(self, kind: _Optional[_Union[DescribeReply.Kind, str]] = ..., store_table: _Optional[str] = ..., schema_json: _Optional[str] = ..., plan_json: _Optional[str] = ..., base_schemas_json: _Optional[_Iterable[str]] = ..., columns: _Optional[_Iterable[str]] = ..., refreshed_at: _Optional[int] = ..., state: _Optional[str] = ..., store_url: _Optional[str] = ..., runtime_json: _Optional[str] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListReply(_message.Message):
    __slots__ = ("tables", "views")
    TABLES_FIELD_NUMBER: _ClassVar[int]
    VIEWS_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedScalarFieldContainer[str]
    views: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tables: _Optional[_Iterable[str]] = ..., views: _Optional[_Iterable[str]] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("lease", "ttl_ms")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    lease: int
    ttl_ms: int
    def __init__(self, lease: _Optional[int] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class SnapshotReply(_message.Message):
    __slots__ = ("lease", "timestamp")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    lease: int
    timestamp: int
    def __init__(self, lease: _Optional[int] = ..., timestamp: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: int
    def __init__(self, lease: _Optional[int] = ...) -> None: ...

class ReleaseReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SplitsRequest(_message.Message):
    __slots__ = ("name", "count")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class SplitsReply(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class RawRow(_message.Message):
    __slots__ = ("key", "row")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ROW_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    row: bytes
    def __init__(self, key: _Optional[bytes] = ..., row: _Optional[bytes] = ...) -> None: ...

class ReadRangeRequest(_message.Message):
    __slots__ = ("name", "start", "stop", "snapshot", "page_rows")
    NAME_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    PAGE_ROWS_FIELD_NUMBER: _ClassVar[int]
    name: str
    start: bytes
    stop: bytes
    snapshot: int
    page_rows: int
    def __init__(self, name: _Optional[str] = ..., start: _Optional[bytes] = ..., stop: _Optional[bytes] = ..., snapshot: _Optional[int] = ..., page_rows: _Optional[int] = ...) -> None: ...

class RawPage(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[RawRow]
    def __init__(self, rows: _Optional[_Iterable[_Union[RawRow, _Mapping]]] = ...) -> None: ...

class LoadRequest(_message.Message):
    __slots__ = ("table", "staging_table")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    STAGING_TABLE_FIELD_NUMBER: _ClassVar[int]
    table: str
    staging_table: str
    def __init__(self, table: _Optional[str] = ..., staging_table: _Optional[str] = ...) -> None: ...

class LoadReply(_message.Message):
    __slots__ = ("timestamp", "rows")
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    timestamp: int
    rows: int
    def __init__(self, timestamp: _Optional[int] = ..., rows: _Optional[int] = ...) -> None: ...

class BeginViewRequest(_message.Message):
    __slots__ = ("sql", "view", "ttl_ms")
    SQL_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    sql: str
    view: str
    ttl_ms: int
    def __init__(self, sql: _Optional[str] = ..., view: _Optional[str] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class BeginViewReply(_message.Message):
    __slots__ = ("view", "lease", "snapshot", "plan_json", "base_schemas_json")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    BASE_SCHEMAS_JSON_FIELD_NUMBER: _ClassVar[int]
    view: str
    lease: int
    snapshot: int
    plan_json: str
    base_schemas_json: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, view: _Optional[str] = ..., lease: _Optional[int] = ..., snapshot: _Optional[int] = ..., plan_json: _Optional[str] = ..., base_schemas_json: _Optional[_Iterable[str]] = ...) -> None: ...

class ViewRowsChunk(_message.Message):
    __slots__ = ("view", "snapshot", "rows")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    view: str
    snapshot: int
    rows: _containers.RepeatedCompositeFieldContainer[RawRow]
    def __init__(self, view: _Optional[str] = ..., snapshot: _Optional[int] = ..., rows: _Optional[_Iterable[_Union[RawRow, _Mapping]]] = ...) -> None: ...

class FinishViewReply(_message.Message):
    __slots__ = ("message", "timestamp")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    message: str
    timestamp: int
    def __init__(self, message: _Optional[str] = ..., timestamp: _Optional[int] = ...) -> None: ...

class AbortViewRequest(_message.Message):
    __slots__ = ("view",)
    VIEW_FIELD_NUMBER: _ClassVar[int]
    view: str
    def __init__(self, view: _Optional[str] = ...) -> None: ...

class AbortViewReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MembersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MembersReply(_message.Message):
    __slots__ = ("addresses", "partitions", "leader", "transact_addresses", "silent")
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    TRANSACT_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    SILENT_FIELD_NUMBER: _ClassVar[int]
    addresses: _containers.RepeatedScalarFieldContainer[str]
    partitions: int
    leader: int
    transact_addresses: _containers.RepeatedScalarFieldContainer[str]
    silent: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, addresses: _Optional[_Iterable[str]] = ..., partitions: _Optional[int] = ..., leader: _Optional[int] = ..., transact_addresses: _Optional[_Iterable[str]] = ..., silent: _Optional[_Iterable[int]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("view", "where", "since", "interval_ms", "tentative")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    WHERE_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    TENTATIVE_FIELD_NUMBER: _ClassVar[int]
    view: str
    where: Row
    since: int
    interval_ms: int
    tentative: bool
    def __init__(self, view: _Optional[str] = ..., where: _Optional[_Union[Row, _Mapping]] = ..., since: _Optional[int] = ..., interval_ms: _Optional[int] = ..., tentative: _Optional[bool] = ...) -> None: ...

class GroupChange(_message.Message):
    __slots__ = ("group", "old", "new")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    OLD_FIELD_NUMBER: _ClassVar[int]
    NEW_FIELD_NUMBER: _ClassVar[int]
    group: Row
    old: Row
    new: Row
    def __init__(self, group: _Optional[_Union[Row, _Mapping]] = ..., old: _Optional[_Union[Row, _Mapping]] = ..., new: _Optional[_Union[Row, _Mapping]] = ...) -> None: ...

class ViewChanges(_message.Message):
    __slots__ = ("timestamp", "changes", "reset", "tentative")
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    TENTATIVE_FIELD_NUMBER: _ClassVar[int]
    timestamp: int
    changes: _containers.RepeatedCompositeFieldContainer[GroupChange]
    reset: bool
    tentative: bool
    def __init__(self, timestamp: _Optional[int] = ..., changes: _Optional[_Iterable[_Union[GroupChange, _Mapping]]] = ..., reset: _Optional[bool] = ..., tentative: _Optional[bool] = ...) -> None: ...
