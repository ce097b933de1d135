"""ScoringService protobuf <-> plain conversion."""

from __future__ import annotations

import pytest

from slimserve import schema
from slimserve.client_convert import item_to_proto, member_to_proto
from slimserve.serving.convert import item_from_proto, member_from_proto
from slimserve.serving.errors import InvalidArgument
from slimserve.serving.scoring.servicer import request_from_proto, response_to_proto
from slimserve.v1 import common_pb2, scoring_pb2

MEMBER = schema.Member(
    id="m1",
    headline="Data engineer",
    skills=("python", "sql"),
    seniority=schema.Seniority.SENIOR,
    years_experience=7.5,
    location="Berlin",
    industries=("software",),
    open_to_remote=True,
    history=(
        schema.Activity("Data Engineer", "Globex", "software", schema.ActivityKind.ENGAGED),
        schema.Activity("Nurse", kind=schema.ActivityKind.DISMISSED),
    ),
)
ITEM = schema.Item(
    id="j1",
    kind=schema.ItemKind.COURSE,
    title="Spark course",
    company="Acme",
    required_skills=("spark",),
    seniority=schema.Seniority.ENTRY,
    location="Remote",
    remote=True,
    industry="education",
    description="Learn Spark.",
)


def test_member_round_trip():
    assert member_from_proto(member_to_proto(MEMBER)) == MEMBER


def test_item_round_trip():
    assert item_from_proto(item_to_proto(ITEM), "candidates[0]") == ITEM


@pytest.mark.parametrize("level", list(schema.Seniority))
def test_every_seniority_round_trips(level):
    member = schema.Member(id="m", seniority=level)
    assert member_from_proto(member_to_proto(member)).seniority is level


@pytest.mark.parametrize("kind", list(schema.ItemKind))
def test_every_kind_round_trips(kind):
    assert item_from_proto(item_to_proto(schema.Item(id="i", kind=kind)), "c").kind is kind


def test_proto_enum_names_match():
    assert member_to_proto(MEMBER).seniority == common_pb2.SENIORITY_SENIOR
    assert item_to_proto(ITEM).kind == common_pb2.ITEM_KIND_COURSE


def test_unknown_enum_numbers_are_invalid_arguments():
    with pytest.raises(InvalidArgument) as info:
        member_from_proto(common_pb2.Member(id="m", seniority=42))
    assert info.value.field == "member.seniority"
    request = scoring_pb2.ScoreRequest(member=member_to_proto(MEMBER))
    request.candidates.add(id="a")
    request.candidates.add(id="b", kind=9)
    with pytest.raises(InvalidArgument) as info:
        request_from_proto(request)
    assert info.value.field == "candidates[1].kind"


def test_request_from_proto():
    request = scoring_pb2.ScoreRequest(member=member_to_proto(MEMBER), top_k=2, request_id="r")
    request.candidates.append(item_to_proto(ITEM))
    member, candidates, top_k = request_from_proto(request)
    assert member == MEMBER and candidates == [ITEM] and top_k == 2


def test_missing_member_is_none():
    member, candidates, top_k = request_from_proto(scoring_pb2.ScoreRequest())
    assert member is None and candidates == [] and top_k == 0


def test_response_to_proto():
    result = schema.ScoreResult(
        items=[schema.ScoredItem("b", 1.5, 1), schema.ScoredItem("a", -0.25, 2)],
        timings=schema.ScoreTimings(queue_ms=1.0, inference_ms=2.0, total_ms=4.0),
    )
    metadata = common_pb2.ResponseMetadata(
        request_id="r1", model_name="scorer", model_version="1", bundle_hash="h"
    )
    response = response_to_proto(result, metadata)
    assert [(i.item_id, i.score, i.rank) for i in response.items] == [("b", 1.5, 1), ("a", -0.25, 2)]
    meta = response.metadata
    assert (meta.request_id, meta.model_name, meta.model_version, meta.bundle_hash) == (
        "r1",
        "scorer",
        "1",
        "h",
    )
    assert (meta.queue_ms, meta.inference_ms, meta.total_ms) == (1.0, 2.0, 4.0)
    assert scoring_pb2.ScoreResponse.FromString(response.SerializeToString()) == response
