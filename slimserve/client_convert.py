"""Plain records -> protobuf messages of ``common.proto``: what the clients send (CLI, ``up``'s demo, bench).

The client side of the conversion; the servers own the other direction (``serving.convert``: protobuf ->
plain, refusing unknown enum numbers). Clients never import ``slimserve.serving``.
"""

from __future__ import annotations

from slimserve import schema
from slimserve.v1 import common_pb2

_SENIORITY_TO_PROTO = {s: common_pb2.Seniority.Value(f"SENIORITY_{s.name}") for s in schema.Seniority}
_KIND_TO_PROTO = {k: common_pb2.ItemKind.Value(f"ITEM_KIND_{k.name}") for k in schema.ItemKind}
_ACTIVITY_TO_PROTO = {
    k: common_pb2.ActivityKind.Value(f"ACTIVITY_KIND_{k.name}") for k in schema.ActivityKind
}


def member_to_proto(member: schema.Member) -> common_pb2.Member:
    """A plain member as protobuf."""
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
    """A plain item as protobuf."""
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
