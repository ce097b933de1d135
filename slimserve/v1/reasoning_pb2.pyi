from slimserve.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_STOP_STRING: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_STOP_STRING: FinishReason

class GenerationOptions(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "seed", "stop", "repetition_penalty")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    repetition_penalty: float
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., repetition_penalty: _Optional[float] = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("member", "item", "options", "request_id")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    ITEM_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    member: _common_pb2.Member
    item: _common_pb2.Item
    options: GenerationOptions
    request_id: str
    def __init__(self, member: _Optional[_Union[_common_pb2.Member, _Mapping]] = ..., item: _Optional[_Union[_common_pb2.Item, _Mapping]] = ..., options: _Optional[_Union[GenerationOptions, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "options", "request_id")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    options: GenerationOptions
    request_id: str
    def __init__(self, prompt: _Optional[str] = ..., options: _Optional[_Union[GenerationOptions, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class GenerationMetadata(_message.Message):
    __slots__ = ("response", "finish_reason", "stop_string", "time_to_first_token_ms", "prompt_tokens", "tokens_generated", "tokens_per_second")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_STRING_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    response: _common_pb2.ResponseMetadata
    finish_reason: FinishReason
    stop_string: str
    time_to_first_token_ms: float
    prompt_tokens: int
    tokens_generated: int
    tokens_per_second: float
    def __init__(self, response: _Optional[_Union[_common_pb2.ResponseMetadata, _Mapping]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., stop_string: _Optional[str] = ..., time_to_first_token_ms: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., tokens_generated: _Optional[int] = ..., tokens_per_second: _Optional[float] = ...) -> None: ...

class TextChunk(_message.Message):
    __slots__ = ("text", "index", "metadata")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    text: str
    index: int
    metadata: GenerationMetadata
    def __init__(self, text: _Optional[str] = ..., index: _Optional[int] = ..., metadata: _Optional[_Union[GenerationMetadata, _Mapping]] = ...) -> None: ...
