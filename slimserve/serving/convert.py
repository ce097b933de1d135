"""Protobuf <-> plain records of ``common.proto`` (members, items, activity), shared by the servicers.

Unknown enum numbers are refused with ``InvalidArgument`` naming the field.
"""

from __future__ import annotations

from slimserve import schema
from slimserve.v1 import common_pb2

from .errors import InvalidArgument

_SENIORITY_TO_PROTO = {s: common_pb2.Seniority.Value(f"SENIORITY_{s.name}") for s in schema.Seniority}
_SENIORITY_FROM_PROTO = {v: k for k, v in _SENIORITY_TO_PROTO.items()}
_KIND_TO_PROTO = {k: common_pb2.ItemKind.Value(f"ITEM_KIND_{k.name}") for k in schema.ItemKind}
_KIND_FROM_PROTO = {v: k for k, v in _KIND_TO_PROTO.items()}
_ACTIVITY_TO_PROTO = {
    k: common_pb2.ActivityKind.Value(f"ACTIVITY_KIND_{k.name}") for k in schema.ActivityKind
}
_ACTIVITY_FROM_PROTO = {v: k for k, v in _ACTIVITY_TO_PROTO.items()}


def _enum(mapping: dict, number: int, field: str):
    try:
        return mapping[number]
    except KeyError:
        raise InvalidArgument(field, f"unknown enum value {number}") from None


def member_from_proto(message: common_pb2.Member, field: str = "member") -> schema.Member:
    """A protobuf Member as a plain ``schema.Member`` (unknown enum numbers are refused)."""
    return schema.Member(
        id=message.id,
        headline=message.headline,
        skills=tuple(message.skills),
        seniority=_enum(_SENIORITY_FROM_PROTO, message.seniority, f"{field}.seniority"),
        years_experience=float(message.years_experience),
        location=message.location,
        industries=tuple(message.industries),
        open_to_remote=message.open_to_remote,
        history=tuple(activity_from_proto(a, f"{field}.history[{i}]") for i, a in enumerate(message.history)),
    )


def activity_from_proto(message: common_pb2.Activity, field: str) -> schema.Activity:
    """A protobuf Activity as a plain ``schema.Activity``."""
    return schema.Activity(
        item_title=message.item_title,
        company=message.company,
        industry=message.industry,
        kind=_enum(_ACTIVITY_FROM_PROTO, message.kind, f"{field}.kind"),
    )


def item_from_proto(message: common_pb2.Item, field: str) -> schema.Item:
    """A protobuf Item as a plain ``schema.Item`` (unknown enum numbers are refused)."""
    return schema.Item(
        id=message.id,
        kind=_enum(_KIND_FROM_PROTO, message.kind, f"{field}.kind"),
        title=message.title,
        company=message.company,
        required_skills=tuple(message.required_skills),
        seniority=_enum(_SENIORITY_FROM_PROTO, message.seniority, f"{field}.seniority"),
        location=message.location,
        remote=message.remote,
        industry=message.industry,
        description=message.description,
    )


def member_to_proto(member: schema.Member) -> common_pb2.Member:
    """A plain member as protobuf (for clients and tests)."""
    return common_pb2.Member(
        id=member.id,
        headline=member.headline,
        skills=list(member.skills),
        seniority=_SENIORITY_TO_PROTO[member.seniority],
        years_experience=member.years_experience,
        location=member.location,
        industries=list(member.industries),
        open_to_remote=member.open_to_remote,
        history=[
            common_pb2.Activity(
                item_title=a.item_title,
                company=a.company,
                industry=a.industry,
                kind=_ACTIVITY_TO_PROTO[a.kind],
            )
            for a in member.history
        ],
    )


def item_to_proto(item: schema.Item) -> common_pb2.Item:
    """A plain item as protobuf (for clients and tests)."""
    return common_pb2.Item(
        id=item.id,
        kind=_KIND_TO_PROTO[item.kind],
        title=item.title,
        company=item.company,
        required_skills=list(item.required_skills),
        seniority=_SENIORITY_TO_PROTO[item.seniority],
        location=item.location,
        remote=item.remote,
        industry=item.industry,
        description=item.description,
    )
