from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ColumnKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COLUMN_KIND_UNSPECIFIED: _ClassVar[ColumnKind]
    TENSOR: _ClassVar[ColumnKind]
    SCALAR: _ClassVar[ColumnKind]
    JSON: _ClassVar[ColumnKind]

class StalePolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STALE_POLICY_UNSPECIFIED: _ClassVar[StalePolicy]
    DISCARD: _ClassVar[StalePolicy]
    REGENERATE: _ClassVar[StalePolicy]

class ClaimPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLAIM_POLICY_UNSPECIFIED: _ClassVar[ClaimPolicy]
    FIFO: _ClassVar[ClaimPolicy]
    GROUP: _ClassVar[ClaimPolicy]
    TOKEN_BALANCED: _ClassVar[ClaimPolicy]
    LONGEST_FIRST: _ClassVar[ClaimPolicy]
    SHORTEST_FIRST: _ClassVar[ClaimPolicy]
COLUMN_KIND_UNSPECIFIED: ColumnKind
TENSOR: ColumnKind
SCALAR: ColumnKind
JSON: ColumnKind
STALE_POLICY_UNSPECIFIED: StalePolicy
DISCARD: StalePolicy
REGENERATE: StalePolicy
CLAIM_POLICY_UNSPECIFIED: ClaimPolicy
FIFO: ClaimPolicy
GROUP: ClaimPolicy
TOKEN_BALANCED: ClaimPolicy
LONGEST_FIRST: ClaimPolicy
SHORTEST_FIRST: ClaimPolicy

class ColumnSpec(_message.Message):
    __slots__ = ("name", "kind", "dtype", "trailing_shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    TRAILING_SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: ColumnKind
    dtype: str
    trailing_shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[ColumnKind, str]] = ..., dtype: _Optional[str] = ..., trailing_shape: _Optional[_Iterable[int]] = ...) -> None: ...

class TaskSpec(_message.Message):
    __slots__ = ("name", "consumes", "produces")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONSUMES_FIELD_NUMBER: _ClassVar[int]
    PRODUCES_FIELD_NUMBER: _ClassVar[int]
    name: str
    consumes: _containers.RepeatedScalarFieldContainer[str]
    produces: _containers.RepeatedCompositeFieldContainer[ColumnSpec]
    def __init__(self, name: _Optional[str] = ..., consumes: _Optional[_Iterable[str]] = ..., produces: _Optional[_Iterable[_Union[ColumnSpec, _Mapping]]] = ...) -> None: ...

class RegisterTaskRequest(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskSpec]
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskSpec, _Mapping]]] = ...) -> None: ...

class RegisterTaskResponse(_message.Message):
    __slots__ = ("columns", "units")
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    columns: _containers.RepeatedCompositeFieldContainer[ColumnSpec]
    units: _containers.RepeatedCompositeFieldContainer[StorageUnitInfo]
    def __init__(self, columns: _Optional[_Iterable[_Union[ColumnSpec, _Mapping]]] = ..., units: _Optional[_Iterable[_Union[StorageUnitInfo, _Mapping]]] = ...) -> None: ...

class StorageUnitInfo(_message.Message):
    __slots__ = ("id", "backend", "address")
    ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    id: int
    backend: str
    address: str
    def __init__(self, id: _Optional[int] = ..., backend: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class LayoutRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LayoutResponse(_message.Message):
    __slots__ = ("job", "units", "columns", "max_row_bytes", "table_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    MAX_ROW_BYTES_FIELD_NUMBER: _ClassVar[int]
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    units: _containers.RepeatedCompositeFieldContainer[StorageUnitInfo]
    columns: _containers.RepeatedCompositeFieldContainer[ColumnSpec]
    max_row_bytes: int
    table_id: str
    def __init__(self, job: _Optional[str] = ..., units: _Optional[_Iterable[_Union[StorageUnitInfo, _Mapping]]] = ..., columns: _Optional[_Iterable[_Union[ColumnSpec, _Mapping]]] = ..., max_row_bytes: _Optional[int] = ..., table_id: _Optional[str] = ...) -> None: ...

class AllocateRequest(_message.Message):
    __slots__ = ("partition", "count", "group_size")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    partition: int
    count: int
    group_size: int
    def __init__(self, partition: _Optional[int] = ..., count: _Optional[int] = ..., group_size: _Optional[int] = ...) -> None: ...

class AllocateResponse(_message.Message):
    __slots__ = ("indices", "groups")
    INDICES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    groups: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, indices: _Optional[_Iterable[int]] = ..., groups: _Optional[_Iterable[int]] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("count",)
    COUNT_FIELD_NUMBER: _ClassVar[int]
    count: int
    def __init__(self, count: _Optional[int] = ...) -> None: ...

class ReserveResponse(_message.Message):
    __slots__ = ("start", "count")
    START_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    start: int
    count: int
    def __init__(self, start: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class NotifyWrittenRequest(_message.Message):
    __slots__ = ("indices", "columns", "lengths", "versions", "nbytes", "create", "partition", "group_size", "task", "lease", "ack", "cells")
    INDICES_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    CELLS_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    columns: _containers.RepeatedScalarFieldContainer[str]
    lengths: _containers.RepeatedScalarFieldContainer[int]
    versions: _containers.RepeatedScalarFieldContainer[int]
    nbytes: _containers.RepeatedScalarFieldContainer[int]
    create: bool
    partition: int
    group_size: int
    task: str
    lease: str
    ack: bool
    cells: _containers.RepeatedCompositeFieldContainer[UnitCells]
    def __init__(self, indices: _Optional[_Iterable[int]] = ..., columns: _Optional[_Iterable[str]] = ..., lengths: _Optional[_Iterable[int]] = ..., versions: _Optional[_Iterable[int]] = ..., nbytes: _Optional[_Iterable[int]] = ..., create: _Optional[bool] = ..., partition: _Optional[int] = ..., group_size: _Optional[int] = ..., task: _Optional[str] = ..., lease: _Optional[str] = ..., ack: _Optional[bool] = ..., cells: _Optional[_Iterable[_Union[UnitCells, _Mapping]]] = ...) -> None: ...

class NotifyWrittenResponse(_message.Message):
    __slots__ = ("newly_ready", "acked")
    NEWLY_READY_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    newly_ready: int
    acked: int
    def __init__(self, newly_ready: _Optional[int] = ..., acked: _Optional[int] = ...) -> None: ...

class ClaimRequest(_message.Message):
    __slots__ = ("task", "count", "min_count", "token_budget", "policy", "dp_size", "wait_seconds", "has_partition", "partition", "has_min_version", "min_version", "on_stale", "stale_producer", "ack_lease", "consumer", "policy_name", "read", "has_max_partition", "max_partition", "one_partition")
    TASK_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MIN_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    DP_SIZE_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HAS_PARTITION_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    HAS_MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    ON_STALE_FIELD_NUMBER: _ClassVar[int]
    STALE_PRODUCER_FIELD_NUMBER: _ClassVar[int]
    ACK_LEASE_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    POLICY_NAME_FIELD_NUMBER: _ClassVar[int]
    READ_FIELD_NUMBER: _ClassVar[int]
    HAS_MAX_PARTITION_FIELD_NUMBER: _ClassVar[int]
    MAX_PARTITION_FIELD_NUMBER: _ClassVar[int]
    ONE_PARTITION_FIELD_NUMBER: _ClassVar[int]
    task: str
    count: int
    min_count: int
    token_budget: int
    policy: ClaimPolicy
    dp_size: int
    wait_seconds: float
    has_partition: bool
    partition: int
    has_min_version: bool
    min_version: int
    on_stale: StalePolicy
    stale_producer: str
    ack_lease: str
    consumer: str
    policy_name: str
    read: _containers.RepeatedScalarFieldContainer[str]
    has_max_partition: bool
    max_partition: int
    one_partition: bool
    def __init__(self, task: _Optional[str] = ..., count: _Optional[int] = ..., min_count: _Optional[int] = ..., token_budget: _Optional[int] = ..., policy: _Optional[_Union[ClaimPolicy, str]] = ..., dp_size: _Optional[int] = ..., wait_seconds: _Optional[float] = ..., has_partition: _Optional[bool] = ..., partition: _Optional[int] = ..., has_min_version: _Optional[bool] = ..., min_version: _Optional[int] = ..., on_stale: _Optional[_Union[StalePolicy, str]] = ..., stale_producer: _Optional[str] = ..., ack_lease: _Optional[str] = ..., consumer: _Optional[str] = ..., policy_name: _Optional[str] = ..., read: _Optional[_Iterable[str]] = ..., has_max_partition: _Optional[bool] = ..., max_partition: _Optional[int] = ..., one_partition: _Optional[bool] = ...) -> None: ...

class ClaimedRows(_message.Message):
    __slots__ = ("index", "partition", "unit", "length", "version", "group", "rank", "tag_set")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    TAG_SET_FIELD_NUMBER: _ClassVar[int]
    index: _containers.RepeatedScalarFieldContainer[int]
    partition: _containers.RepeatedScalarFieldContainer[int]
    unit: _containers.RepeatedScalarFieldContainer[int]
    length: _containers.RepeatedScalarFieldContainer[int]
    version: _containers.RepeatedScalarFieldContainer[int]
    group: _containers.RepeatedScalarFieldContainer[int]
    rank: _containers.RepeatedScalarFieldContainer[int]
    tag_set: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, index: _Optional[_Iterable[int]] = ..., partition: _Optional[_Iterable[int]] = ..., unit: _Optional[_Iterable[int]] = ..., length: _Optional[_Iterable[int]] = ..., version: _Optional[_Iterable[int]] = ..., group: _Optional[_Iterable[int]] = ..., rank: _Optional[_Iterable[int]] = ..., tag_set: _Optional[_Iterable[int]] = ...) -> None: ...

class TagSet(_message.Message):
    __slots__ = ("tags",)
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TAGS_FIELD_NUMBER: _ClassVar[int]
    tags: _containers.ScalarMap[str, str]
    def __init__(self, tags: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ClaimResponse(_message.Message):
    __slots__ = ("lease", "rows", "lease_seconds", "tag_sets", "cells")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TAG_SETS_FIELD_NUMBER: _ClassVar[int]
    CELLS_FIELD_NUMBER: _ClassVar[int]
    lease: str
    rows: ClaimedRows
    lease_seconds: float
    tag_sets: _containers.RepeatedCompositeFieldContainer[TagSet]
    cells: _containers.RepeatedCompositeFieldContainer[UnitCells]
    def __init__(self, lease: _Optional[str] = ..., rows: _Optional[_Union[ClaimedRows, _Mapping]] = ..., lease_seconds: _Optional[float] = ..., tag_sets: _Optional[_Iterable[_Union[TagSet, _Mapping]]] = ..., cells: _Optional[_Iterable[_Union[UnitCells, _Mapping]]] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("task", "lease", "indices")
    TASK_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    task: str
    lease: str
    indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, task: _Optional[str] = ..., lease: _Optional[str] = ..., indices: _Optional[_Iterable[int]] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("acked",)
    ACKED_FIELD_NUMBER: _ClassVar[int]
    acked: int
    def __init__(self, acked: _Optional[int] = ...) -> None: ...

class ExtendRequest(_message.Message):
    __slots__ = ("task", "lease")
    TASK_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    task: str
    lease: str
    def __init__(self, task: _Optional[str] = ..., lease: _Optional[str] = ...) -> None: ...

class ExtendResponse(_message.Message):
    __slots__ = ("lease_seconds",)
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    lease_seconds: float
    def __init__(self, lease_seconds: _Optional[float] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("task", "lease")
    TASK_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    task: str
    lease: str
    def __init__(self, task: _Optional[str] = ..., lease: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class RegenerateRequest(_message.Message):
    __slots__ = ("task", "lease", "indices", "producer")
    TASK_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    task: str
    lease: str
    indices: _containers.RepeatedScalarFieldContainer[int]
    producer: str
    def __init__(self, task: _Optional[str] = ..., lease: _Optional[str] = ..., indices: _Optional[_Iterable[int]] = ..., producer: _Optional[str] = ...) -> None: ...

class ReleaseConsumerRequest(_message.Message):
    __slots__ = ("consumer",)
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    consumer: str
    def __init__(self, consumer: _Optional[str] = ...) -> None: ...

class TaskStats(_message.Message):
    __slots__ = ("name", "ready", "claimed", "acked", "expired", "stale_discarded", "stale_regenerated", "acked_per_second")
    NAME_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    STALE_DISCARDED_FIELD_NUMBER: _ClassVar[int]
    STALE_REGENERATED_FIELD_NUMBER: _ClassVar[int]
    ACKED_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    name: str
    ready: int
    claimed: int
    acked: int
    expired: int
    stale_discarded: int
    stale_regenerated: int
    acked_per_second: float
    def __init__(self, name: _Optional[str] = ..., ready: _Optional[int] = ..., claimed: _Optional[int] = ..., acked: _Optional[int] = ..., expired: _Optional[int] = ..., stale_discarded: _Optional[int] = ..., stale_regenerated: _Optional[int] = ..., acked_per_second: _Optional[float] = ...) -> None: ...

class JobMetrics(_message.Message):
    __slots__ = ("step", "gen_seconds", "train_seconds", "staleness_mean", "staleness_max", "tokens_per_second", "samples_per_second", "reward_mean", "timestamp", "source", "profile")
    STEP_FIELD_NUMBER: _ClassVar[int]
    GEN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TRAIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STALENESS_MEAN_FIELD_NUMBER: _ClassVar[int]
    STALENESS_MAX_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    step: int
    gen_seconds: float
    train_seconds: float
    staleness_mean: float
    staleness_max: int
    tokens_per_second: float
    samples_per_second: float
    reward_mean: float
    timestamp: float
    source: str
    profile: str
    def __init__(self, step: _Optional[int] = ..., gen_seconds: _Optional[float] = ..., train_seconds: _Optional[float] = ..., staleness_mean: _Optional[float] = ..., staleness_max: _Optional[int] = ..., tokens_per_second: _Optional[float] = ..., samples_per_second: _Optional[float] = ..., reward_mean: _Optional[float] = ..., timestamp: _Optional[float] = ..., source: _Optional[str] = ..., profile: _Optional[str] = ...) -> None: ...

class MetricsAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("tasks", "rows", "partitions", "cleared_partitions", "bytes_written", "metrics", "consumers", "next_partition", "table_id")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CLEARED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PARTITION_FIELD_NUMBER: _ClassVar[int]
    TABLE_ID_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskStats]
    rows: int
    partitions: int
    cleared_partitions: int
    bytes_written: int
    metrics: JobMetrics
    consumers: _containers.RepeatedCompositeFieldContainer[ConsumerStats]
    next_partition: int
    table_id: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskStats, _Mapping]]] = ..., rows: _Optional[int] = ..., partitions: _Optional[int] = ..., cleared_partitions: _Optional[int] = ..., bytes_written: _Optional[int] = ..., metrics: _Optional[_Union[JobMetrics, _Mapping]] = ..., consumers: _Optional[_Iterable[_Union[ConsumerStats, _Mapping]]] = ..., next_partition: _Optional[int] = ..., table_id: _Optional[str] = ...) -> None: ...

class ConsumerStats(_message.Message):
    __slots__ = ("task", "consumer", "claimed")
    TASK_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    task: str
    consumer: str
    claimed: int
    def __init__(self, task: _Optional[str] = ..., consumer: _Optional[str] = ..., claimed: _Optional[int] = ...) -> None: ...

class WakeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WakeResponse(_message.Message):
    __slots__ = ("woken",)
    WOKEN_FIELD_NUMBER: _ClassVar[int]
    woken: int
    def __init__(self, woken: _Optional[int] = ...) -> None: ...

class BoundRequest(_message.Message):
    __slots__ = ("task", "max_partition")
    TASK_FIELD_NUMBER: _ClassVar[int]
    MAX_PARTITION_FIELD_NUMBER: _ClassVar[int]
    task: str
    max_partition: int
    def __init__(self, task: _Optional[str] = ..., max_partition: _Optional[int] = ...) -> None: ...

class BoundResponse(_message.Message):
    __slots__ = ("waiting",)
    WAITING_FIELD_NUMBER: _ClassVar[int]
    waiting: int
    def __init__(self, waiting: _Optional[int] = ...) -> None: ...

class Op(_message.Message):
    __slots__ = ("id", "notify", "claim", "ack", "release", "extend", "reserve", "wake", "bound")
    ID_FIELD_NUMBER: _ClassVar[int]
    NOTIFY_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    EXTEND_FIELD_NUMBER: _ClassVar[int]
    RESERVE_FIELD_NUMBER: _ClassVar[int]
    WAKE_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    id: int
    notify: NotifyWrittenRequest
    claim: ClaimRequest
    ack: AckRequest
    release: ReleaseRequest
    extend: ExtendRequest
    reserve: ReserveRequest
    wake: WakeRequest
    bound: BoundRequest
    def __init__(self, id: _Optional[int] = ..., notify: _Optional[_Union[NotifyWrittenRequest, _Mapping]] = ..., claim: _Optional[_Union[ClaimRequest, _Mapping]] = ..., ack: _Optional[_Union[AckRequest, _Mapping]] = ..., release: _Optional[_Union[ReleaseRequest, _Mapping]] = ..., extend: _Optional[_Union[ExtendRequest, _Mapping]] = ..., reserve: _Optional[_Union[ReserveRequest, _Mapping]] = ..., wake: _Optional[_Union[WakeRequest, _Mapping]] = ..., bound: _Optional[_Union[BoundRequest, _Mapping]] = ...) -> None: ...

class OpResult(_message.Message):
    __slots__ = ("id", "code", "error", "notify", "claim", "ack", "release", "extend", "reserve", "wake", "bound")
    ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NOTIFY_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    EXTEND_FIELD_NUMBER: _ClassVar[int]
    RESERVE_FIELD_NUMBER: _ClassVar[int]
    WAKE_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    id: int
    code: int
    error: str
    notify: NotifyWrittenResponse
    claim: ClaimResponse
    ack: AckResponse
    release: ReleaseResponse
    extend: ExtendResponse
    reserve: ReserveResponse
    wake: WakeResponse
    bound: BoundResponse
    def __init__(self, id: _Optional[int] = ..., code: _Optional[int] = ..., error: _Optional[str] = ..., notify: _Optional[_Union[NotifyWrittenResponse, _Mapping]] = ..., claim: _Optional[_Union[ClaimResponse, _Mapping]] = ..., ack: _Optional[_Union[AckResponse, _Mapping]] = ..., release: _Optional[_Union[ReleaseResponse, _Mapping]] = ..., extend: _Optional[_Union[ExtendResponse, _Mapping]] = ..., reserve: _Optional[_Union[ReserveResponse, _Mapping]] = ..., wake: _Optional[_Union[WakeResponse, _Mapping]] = ..., bound: _Optional[_Union[BoundResponse, _Mapping]] = ...) -> None: ...

class CellBlock(_message.Message):
    __slots__ = ("indices", "columns", "column_of", "sizes", "data")
    INDICES_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    COLUMN_OF_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    columns: _containers.RepeatedScalarFieldContainer[str]
    column_of: _containers.RepeatedScalarFieldContainer[int]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, indices: _Optional[_Iterable[int]] = ..., columns: _Optional[_Iterable[str]] = ..., column_of: _Optional[_Iterable[int]] = ..., sizes: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class UnitCells(_message.Message):
    __slots__ = ("unit", "block")
    UNIT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    unit: int
    block: CellBlock
    def __init__(self, unit: _Optional[int] = ..., block: _Optional[_Union[CellBlock, _Mapping]] = ...) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ("unit", "block")
    UNIT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    unit: int
    block: CellBlock
    def __init__(self, unit: _Optional[int] = ..., block: _Optional[_Union[CellBlock, _Mapping]] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("unit", "keys")
    UNIT_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    unit: int
    keys: CellBlock
    def __init__(self, unit: _Optional[int] = ..., keys: _Optional[_Union[CellBlock, _Mapping]] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("block",)
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    block: CellBlock
    def __init__(self, block: _Optional[_Union[CellBlock, _Mapping]] = ...) -> None: ...
