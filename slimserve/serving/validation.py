"""Validation of the member and item records every service receives; errors name the field path.

Rules: a member is required with a non-empty id; ids are at most ``max_id_chars`` and hold no control
characters; text fields are at most ``max_text_chars`` and hold no control characters other than tab
and newlines; lists are at most ``max_list_items`` entries; seniority and kind must be enum members;
years of experience is finite and within [0, 100]; history has at most ``max_history`` entries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from slimserve.schema import Activity, ActivityKind, Item, ItemKind, Member, Seniority

from .errors import InvalidArgument

MAX_YEARS_EXPERIENCE = 100.0
_TEXT_CONTROLS_ALLOWED = {"\t", "\n", "\r"}


class Limits(Protocol):
    """The limits record validation needs (``RecordLimitsConfig`` has them)."""

    max_text_chars: int
    max_list_items: int
    max_id_chars: int
    max_history: int


def _has_control(text: str, allowed: set[str] | frozenset[str] = frozenset()) -> bool:
    return any((ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0) and ch not in allowed for ch in text)


def check_id(value: object, field: str, limits: Limits) -> None:
    """A required id: a non-blank string, not too long, no control characters."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(field, "required (empty)")
    if len(value) > limits.max_id_chars:
        raise InvalidArgument(field, f"{len(value)} characters, at most {limits.max_id_chars} allowed")
    if _has_control(value):
        raise InvalidArgument(field, "contains control characters")


def check_text(value: object, field: str, limits: Limits) -> None:
    """An optional text: a string, not too long, no control characters but tab and newlines."""
    if not isinstance(value, str):
        raise InvalidArgument(field, f"expected text, got {type(value).__name__}")
    if len(value) > limits.max_text_chars:
        raise InvalidArgument(field, f"{len(value)} characters, at most {limits.max_text_chars} allowed")
    if _has_control(value, _TEXT_CONTROLS_ALLOWED):
        raise InvalidArgument(field, "contains control characters")


def check_list(values: object, field: str, limits: Limits) -> None:
    """A list of short texts, at most ``max_list_items`` long."""
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise InvalidArgument(field, "expected a list of texts")
    if len(values) > limits.max_list_items:
        raise InvalidArgument(field, f"{len(values)} entries, at most {limits.max_list_items} allowed")
    for index, value in enumerate(values):
        check_text(value, f"{field}[{index}]", limits)


def check_enum(value: object, enum_cls: type, field: str) -> None:
    """An enum field must hold a member of its enum."""
    if not isinstance(value, enum_cls):
        raise InvalidArgument(field, f"invalid value {value!r}")


def validate_member(member: Member | None, limits: Limits, field: str = "member") -> None:
    """Check a member; raise ``InvalidArgument`` naming the first bad field."""
    if member is None:
        raise InvalidArgument(field, "required")
    check_id(member.id, f"{field}.id", limits)
    check_text(member.headline, f"{field}.headline", limits)
    check_list(member.skills, f"{field}.skills", limits)
    check_enum(member.seniority, Seniority, f"{field}.seniority")
    years = member.years_experience
    if isinstance(years, bool) or not isinstance(years, (int, float)) or not math.isfinite(years):
        raise InvalidArgument(f"{field}.years_experience", f"must be a finite number, got {years!r}")
    if not 0 <= years <= MAX_YEARS_EXPERIENCE:
        raise InvalidArgument(
            f"{field}.years_experience", f"{years:g} is outside [0, {MAX_YEARS_EXPERIENCE:g}]"
        )
    check_text(member.location, f"{field}.location", limits)
    check_list(member.industries, f"{field}.industries", limits)
    validate_history(member.history, limits, f"{field}.history")


def validate_history(history: Sequence[Activity], limits: Limits, field: str) -> None:
    """Check a member's recent activity (each entry: title required, texts bounded, kind valid)."""
    if len(history) > limits.max_history:
        raise InvalidArgument(field, f"{len(history)} entries, at most {limits.max_history} allowed")
    for index, activity in enumerate(history):
        where = f"{field}[{index}]"
        if not activity.item_title:
            raise InvalidArgument(f"{where}.item_title", "required")
        check_text(activity.item_title, f"{where}.item_title", limits)
        check_text(activity.company, f"{where}.company", limits)
        check_text(activity.industry, f"{where}.industry", limits)
        check_enum(activity.kind, ActivityKind, f"{where}.kind")


def validate_item(item: Item, limits: Limits, field: str) -> None:
    """Check one candidate; raise ``InvalidArgument`` naming the first bad field."""
    if not isinstance(item, Item):
        raise InvalidArgument(field, "required")
    check_id(item.id, f"{field}.id", limits)
    check_enum(item.kind, ItemKind, f"{field}.kind")
    check_text(item.title, f"{field}.title", limits)
    check_text(item.company, f"{field}.company", limits)
    check_list(item.required_skills, f"{field}.required_skills", limits)
    check_enum(item.seniority, Seniority, f"{field}.seniority")
    check_text(item.location, f"{field}.location", limits)
    check_text(item.industry, f"{field}.industry", limits)
    check_text(item.description, f"{field}.description", limits)
