"""Plain data types shared by the build and the services: members, items, seniority levels.

These mirror the ``Member`` and ``Item`` messages of ``protos/slimserve/v1/common.proto`` and the JSONL
dataset schema of the build stage; only the scoring servicer converts between them and protobuf.
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
