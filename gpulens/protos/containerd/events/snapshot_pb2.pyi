from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SnapshotPrepare(_message.Message):
    __slots__ = ("key", "parent", "snapshotter")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTTER_FIELD_NUMBER: _ClassVar[int]
    key: str
    parent: str
    snapshotter: str
    def __init__(self, key: _Optional[str] = ..., parent: _Optional[str] = ..., snapshotter: _Optional[str] = ...) -> None: ...

class SnapshotCommit(_message.Message):
    __slots__ = ("key", "name", "snapshotter")
    KEY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTTER_FIELD_NUMBER: _ClassVar[int]
    key: str
    name: str
    snapshotter: str
    def __init__(self, key: _Optional[str] = ..., name: _Optional[str] = ..., snapshotter: _Optional[str] = ...) -> None: ...

class SnapshotRemove(_message.Message):
    __slots__ = ("key", "snapshotter")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTTER_FIELD_NUMBER: _ClassVar[int]
    key: str
    snapshotter: str
    def __init__(self, key: _Optional[str] = ..., snapshotter: _Optional[str] = ...) -> None: ...
