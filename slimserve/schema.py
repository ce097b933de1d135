"""Plain data types shared by the build and the services: members, items, seniority levels.

These mirror the ``Member`` and ``Item`` messages of ``protos/slimserve/v1/common.proto`` and the JSONL
dataset schema of the build stage; protobuf is converted to them by the servicers (``serving.convert``) and
from them by the clients (``client_convert``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Seniority(str, Enum):
    """Career level of a member, or the level an item asks for."""

    UNSPECIFIED = "unspecified"
    INTERN = "intern"
    ENTRY = "entry"
    MID = "mid"
    SENIOR = "senior"
    LEAD = "lead"
    DIRECTOR = "director"
    EXECUTIVE = "executive"


class ItemKind(str, Enum):
    """What a candidate item is."""

    UNSPECIFIED = "unspecified"
    JOB = "job"
    COURSE = "course"
    POST = "post"


class ActivityKind(str, Enum):
    """What a member did with an item in the past."""

    UNSPECIFIED = "unspecified"
    ENGAGED = "engaged"
    DISMISSED = "dismissed"


@dataclass(frozen=True)
class Activity:
    """One past interaction of a member, as the prompt shows it (most recent first)."""

    item_title: str
    company: str = ""
    industry: str = ""
    kind: ActivityKind = ActivityKind.ENGAGED


@dataclass(frozen=True)
class Member:
    """A member for whom candidates are ranked."""

    id: str
    headline: str = ""
    skills: tuple[str, ...] = ()
    seniority: Seniority = Seniority.UNSPECIFIED
    years_experience: float = 0.0
    location: str = ""
    industries: tuple[str, ...] = ()
    open_to_remote: bool = False
    history: tuple[Activity, ...] = ()


@dataclass(frozen=True)
class Item:
    """A candidate item (a job posting by default)."""

    id: str
    kind: ItemKind = ItemKind.JOB
    title: str = ""
    company: str = ""
    required_skills: tuple[str, ...] = ()
    seniority: Seniority = Seniority.UNSPECIFIED
    location: str = ""
    remote: bool = False
    industry: str = ""
    description: str = ""


@dataclass(frozen=True)
class ScoredItem:
    """One ranked result: the item id, the model score and its 1-based rank."""

    item_id: str
    score: float
    rank: int


@dataclass
class ScoreTimings:
    """Where the time of one Score call went, in milliseconds."""

    queue_ms: float = 0.0
    inference_ms: float = 0.0
    total_ms: float = 0.0


@dataclass
class ScoreResult:
    """The answer to one Score call, in plain types."""

    items: list[ScoredItem] = field(default_factory=list)
    timings: ScoreTimings = field(default_factory=ScoreTimings)


class SchemaError(ValueError):
    """A JSON record does not fit the schema; the message names the field."""


def _enum_value(enum_cls, raw, field_name: str):
    try:
        return enum_cls(str(raw).lower())
    except ValueError:
        choices = ", ".join(e.value for e in enum_cls)
        raise SchemaError(f"{field_name}: {raw!r} is not one of {choices}") from None


def _record(cls, data: object, where: str, enums: dict, lists: tuple[str, ...] = (), required: str = "id"):
    if not isinstance(data, dict):
        raise SchemaError(f"{where}: expected an object, got {type(data).__name__}")
    known = {f for f in cls.__dataclass_fields__}
    unknown = sorted(set(data) - known)
    if unknown:
        raise SchemaError(f"{where}.{unknown[0]}: unknown field (known: {', '.join(sorted(known))})")
    if not data.get(required):
        raise SchemaError(f"{where}.{required}: required")
    values = dict(data)
    for name, enum_cls in enums.items():
        if name in values:
            values[name] = _enum_value(enum_cls, values[name], f"{where}.{name}")
    for name in lists:
        if name in values:
            if not isinstance(values[name], list) or not all(isinstance(v, str) for v in values[name]):
                raise SchemaError(f"{where}.{name}: expected a list of strings")
            values[name] = tuple(values[name])
    try:
        return cls(**values)
    except TypeError as exc:
        raise SchemaError(f"{where}: {exc}") from None


def activity_from_dict(data: object, where: str = "activity") -> Activity:
    """An ``Activity`` from a JSON object (``kind`` by name: ``"engaged"`` or ``"dismissed"``)."""
    return _record(Activity, data, where, {"kind": ActivityKind}, required="item_title")


def member_from_dict(data: object, where: str = "member") -> Member:
    """A ``Member`` from a JSON object (enums by name, e.g. ``"senior"``)."""
    if isinstance(data, dict) and "history" in data:
        history = data["history"]
        if not isinstance(history, list):
            raise SchemaError(f"{where}.history: expected a list")
        activities = tuple(activity_from_dict(a, f"{where}.history[{i}]") for i, a in enumerate(history))
        data = {**data, "history": activities}
    return _record(Member, data, where, {"seniority": Seniority}, ("skills", "industries"))


def item_from_dict(data: object, where: str = "item") -> Item:
    """An ``Item`` from a JSON object (enums by name, e.g. ``"job"``)."""
    return _record(Item, data, where, {"kind": ItemKind, "seniority": Seniority}, ("required_skills",))
