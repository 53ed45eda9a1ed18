from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LatestRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VersionInfo(_message.Message):
    __slots__ = ("version", "total_bytes", "epoch")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    version: int
    total_bytes: int
    epoch: int
    def __init__(self, version: _Optional[int] = ..., total_bytes: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("min_version", "wait_seconds", "epoch")
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    min_version: int
    wait_seconds: float
    epoch: int
    def __init__(self, min_version: _Optional[int] = ..., wait_seconds: _Optional[float] = ..., epoch: _Optional[int] = ...) -> None: ...

class WeightChunk(_message.Message):
    __slots__ = ("version", "name", "dtype", "shape", "nbytes", "data", "epoch", "along")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ALONG_FIELD_NUMBER: _ClassVar[int]
    version: int
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    nbytes: int
    data: bytes
    epoch: int
    along: _containers.RepeatedCompositeFieldContainer[WeightChunk]
    def __init__(self, version: _Optional[int] = ..., name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., nbytes: _Optional[int] = ..., data: _Optional[bytes] = ..., epoch: _Optional[int] = ..., along: _Optional[_Iterable[_Union[WeightChunk, _Mapping]]] = ...) -> None: ...

class ReplicaVersion(_message.Message):
    __slots__ = ("replica", "version", "epoch")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    replica: str
    version: int
    epoch: int
    def __init__(self, replica: _Optional[str] = ..., version: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class ReportAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("fresh_seconds", "wait", "wait_version", "wait_seconds")
    FRESH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    WAIT_VERSION_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    fresh_seconds: float
    wait: bool
    wait_version: int
    wait_seconds: float
    def __init__(self, fresh_seconds: _Optional[float] = ..., wait: _Optional[bool] = ..., wait_version: _Optional[int] = ..., wait_seconds: _Optional[float] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("version", "replicas", "epoch")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    version: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaVersion]
    epoch: int
    def __init__(self, version: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaVersion, _Mapping]]] = ..., epoch: _Optional[int] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("replica", "group", "store", "world", "backend")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    WORLD_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    replica: str
    group: str
    store: str
    world: int
    backend: str
    def __init__(self, replica: _Optional[str] = ..., group: _Optional[str] = ..., store: _Optional[str] = ..., world: _Optional[int] = ..., backend: _Optional[str] = ...) -> None: ...

class JoinAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BroadcastRequest(_message.Message):
    __slots__ = ("replica", "group", "min_version", "wait_seconds", "epoch")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    replica: str
    group: str
    min_version: int
    wait_seconds: float
    epoch: int
    def __init__(self, replica: _Optional[str] = ..., group: _Optional[str] = ..., min_version: _Optional[int] = ..., wait_seconds: _Optional[float] = ..., epoch: _Optional[int] = ...) -> None: ...

class TensorSlot(_message.Message):
    __slots__ = ("name", "dtype", "shape", "bucket", "offset", "nbytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    bucket: int
    offset: int
    nbytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., bucket: _Optional[int] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class BroadcastPlan(_message.Message):
    __slots__ = ("version", "epoch", "buckets", "tensors")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    version: int
    epoch: int
    buckets: _containers.RepeatedScalarFieldContainer[int]
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSlot]
    def __init__(self, version: _Optional[int] = ..., epoch: _Optional[int] = ..., buckets: _Optional[_Iterable[int]] = ..., tensors: _Optional[_Iterable[_Union[TensorSlot, _Mapping]]] = ...) -> None: ...
