from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Seniority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SENIORITY_UNSPECIFIED: _ClassVar[Seniority]
    SENIORITY_INTERN: _ClassVar[Seniority]
    SENIORITY_ENTRY: _ClassVar[Seniority]
    SENIORITY_MID: _ClassVar[Seniority]
    SENIORITY_SENIOR: _ClassVar[Seniority]
    SENIORITY_LEAD: _ClassVar[Seniority]
    SENIORITY_DIRECTOR: _ClassVar[Seniority]
    SENIORITY_EXECUTIVE: _ClassVar[Seniority]

class ActivityKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTIVITY_KIND_UNSPECIFIED: _ClassVar[ActivityKind]
    ACTIVITY_KIND_ENGAGED: _ClassVar[ActivityKind]
    ACTIVITY_KIND_DISMISSED: _ClassVar[ActivityKind]

class ItemKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ITEM_KIND_UNSPECIFIED: _ClassVar[ItemKind]
    ITEM_KIND_JOB: _ClassVar[ItemKind]
    ITEM_KIND_COURSE: _ClassVar[ItemKind]
    ITEM_KIND_POST: _ClassVar[ItemKind]
SENIORITY_UNSPECIFIED: Seniority
SENIORITY_INTERN: Seniority
SENIORITY_ENTRY: Seniority
SENIORITY_MID: Seniority
SENIORITY_SENIOR: Seniority
SENIORITY_LEAD: Seniority
SENIORITY_DIRECTOR: Seniority
SENIORITY_EXECUTIVE: Seniority
ACTIVITY_KIND_UNSPECIFIED: ActivityKind
ACTIVITY_KIND_ENGAGED: ActivityKind
ACTIVITY_KIND_DISMISSED: ActivityKind
ITEM_KIND_UNSPECIFIED: ItemKind
ITEM_KIND_JOB: ItemKind
ITEM_KIND_COURSE: ItemKind
ITEM_KIND_POST: ItemKind

class Activity(_message.Message):
    __slots__ = ("item_title", "company", "industry", "kind")
    ITEM_TITLE_FIELD_NUMBER: _ClassVar[int]
    COMPANY_FIELD_NUMBER: _ClassVar[int]
    INDUSTRY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    item_title: str
    company: str
    industry: str
    kind: ActivityKind
    def __init__(self, item_title: _Optional[str] = ..., company: _Optional[str] = ..., industry: _Optional[str] = ..., kind: _Optional[_Union[ActivityKind, str]] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("id", "headline", "skills", "seniority", "years_experience", "location", "industries", "open_to_remote", "history")
    ID_FIELD_NUMBER: _ClassVar[int]
    HEADLINE_FIELD_NUMBER: _ClassVar[int]
    SKILLS_FIELD_NUMBER: _ClassVar[int]
    SENIORITY_FIELD_NUMBER: _ClassVar[int]
    YEARS_EXPERIENCE_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    INDUSTRIES_FIELD_NUMBER: _ClassVar[int]
    OPEN_TO_REMOTE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    id: str
    headline: str
    skills: _containers.RepeatedScalarFieldContainer[str]
    seniority: Seniority
    years_experience: float
    location: str
    industries: _containers.RepeatedScalarFieldContainer[str]
    open_to_remote: bool
    history: _containers.RepeatedCompositeFieldContainer[Activity]
    def __init__(self, id: _Optional[str] = ..., headline: _Optional[str] = ..., skills: _Optional[_Iterable[str]] = ..., seniority: _Optional[_Union[Seniority, str]] = ..., years_experience: _Optional[float] = ..., location: _Optional[str] = ..., industries: _Optional[_Iterable[str]] = ..., open_to_remote: bool = ..., history: _Optional[_Iterable[_Union[Activity, _Mapping]]] = ...) -> None: ...

class Item(_message.Message):
    __slots__ = ("id", "kind", "title", "company", "required_skills", "seniority", "location", "remote", "industry", "description")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    COMPANY_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_SKILLS_FIELD_NUMBER: _ClassVar[int]
    SENIORITY_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    REMOTE_FIELD_NUMBER: _ClassVar[int]
    INDUSTRY_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: ItemKind
    title: str
    company: str
    required_skills: _containers.RepeatedScalarFieldContainer[str]
    seniority: Seniority
    location: str
    remote: bool
    industry: str
    description: str
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[_Union[ItemKind, str]] = ..., title: _Optional[str] = ..., company: _Optional[str] = ..., required_skills: _Optional[_Iterable[str]] = ..., seniority: _Optional[_Union[Seniority, str]] = ..., location: _Optional[str] = ..., remote: bool = ..., industry: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class ResponseMetadata(_message.Message):
    __slots__ = ("request_id", "model_name", "model_version", "bundle_hash", "queue_ms", "inference_ms", "total_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_HASH_FIELD_NUMBER: _ClassVar[int]
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model_name: str
    model_version: str
    bundle_hash: str
    queue_ms: float
    inference_ms: float
    total_ms: float
    def __init__(self, request_id: _Optional[str] = ..., model_name: _Optional[str] = ..., model_version: _Optional[str] = ..., bundle_hash: _Optional[str] = ..., queue_ms: _Optional[float] = ..., inference_ms: _Optional[float] = ..., total_ms: _Optional[float] = ...) -> None: ...
