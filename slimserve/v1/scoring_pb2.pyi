from slimserve.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreRequest(_message.Message):
    __slots__ = ("member", "candidates", "top_k", "request_id")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    member: _common_pb2.Member
    candidates: _containers.RepeatedCompositeFieldContainer[_common_pb2.Item]
    top_k: int
    request_id: str
    def __init__(self, member: _Optional[_Union[_common_pb2.Member, _Mapping]] = ..., candidates: _Optional[_Iterable[_Union[_common_pb2.Item, _Mapping]]] = ..., top_k: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class ScoredItem(_message.Message):
    __slots__ = ("item_id", "score", "rank")
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    item_id: str
    score: float
    rank: int
    def __init__(self, item_id: _Optional[str] = ..., score: _Optional[float] = ..., rank: _Optional[int] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("items", "metadata")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ScoredItem]
    metadata: _common_pb2.ResponseMetadata
    def __init__(self, items: _Optional[_Iterable[_Union[ScoredItem, _Mapping]]] = ..., metadata: _Optional[_Union[_common_pb2.ResponseMetadata, _Mapping]] = ...) -> None: ...
