"""Protobuf -> plain records of ``common.proto`` (members, items, activity), shared by the servicers.

Unknown enum numbers are refused with ``InvalidArgument`` naming the field. The other direction is the
clients' (``slimserve.client_convert``).
"""

from __future__ import annotations

from slimserve import schema
from slimserve.v1 import common_pb2

from .errors import InvalidArgument

_SENIORITY_FROM_PROTO = {common_pb2.Seniority.Value(f"SENIORITY_{s.name}"): s for s in schema.Seniority}
_KIND_FROM_PROTO = {common_pb2.ItemKind.Value(f"ITEM_KIND_{k.name}"): k for k in schema.ItemKind}
_ACTIVITY_FROM_PROTO = {
    common_pb2.ActivityKind.Value(f"ACTIVITY_KIND_{k.name}"): k for k in schema.ActivityKind
}


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
