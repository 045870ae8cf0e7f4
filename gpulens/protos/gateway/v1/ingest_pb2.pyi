from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Event(_message.Message):
    __slots__ = ("topic", "key", "value")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    key: bytes
    value: bytes
    def __init__(self, topic: _Optional[str] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ...) -> None: ...

class EventBatch(_message.Message):
    __slots__ = ("batch_id", "events")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    events: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, batch_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...

class BatchAck(_message.Message):
    __slots__ = ("batch_id", "events", "duplicate")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    events: int
    duplicate: bool
    def __init__(self, batch_id: _Optional[str] = ..., events: _Optional[int] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class PublishSummary(_message.Message):
    __slots__ = ("batches", "events", "duplicates")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    batches: int
    events: int
    duplicates: int
    def __init__(self, batches: _Optional[int] = ..., events: _Optional[int] = ..., duplicates: _Optional[int] = ...) -> None: ...
