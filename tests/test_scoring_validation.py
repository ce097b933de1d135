"""Validation of plain Score requests: every rule, each error naming its field path."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest

from slimserve.schema import Item, ItemKind, Member, Seniority
from slimserve.serving.errors import InvalidArgument
from slimserve.serving.scoring.config import ScoringServiceConfig
from slimserve.serving.scoring.validation import effective_top_k, validate_score_request

LIMITS = ScoringServiceConfig(
    max_candidates=5, max_text_chars=20, max_list_items=3, max_id_chars=8, max_history=2
)
MEMBER = Member(id="m1", headline="Data engineer", skills=("python", "sql"), seniority=Seniority.MID)


def items(n: int) -> list[Item]:
    return [Item(id=f"i{k}", title="Engineer") for k in range(n)]


def check(member=MEMBER, candidates=None, top_k=1) -> None:
    validate_score_request(member, items(3) if candidates is None else candidates, top_k, LIMITS)


def assert_field(field: str, **kwargs) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as info:
        check(**kwargs)
    assert info.value.field == field
    assert info.value.message.startswith(f"{field}: ")
    return info.value


def with_candidate(index: int, **changes) -> list[Item]:
    candidates = items(4)
    candidates[index] = replace(candidates[index], **changes)
    return candidates


def test_valid_request_passes():
    check()
    check(candidates=items(5), top_k=100)


def test_member_required():
    assert_field("member", member=None)


@pytest.mark.parametrize("bad_id", ["", "   "])
def test_member_id_required(bad_id):
    assert_field("member.id", member=replace(MEMBER, id=bad_id))


def test_member_id_too_long():
    error = assert_field("member.id", member=replace(MEMBER, id="x" * 9))
    assert "at most 8" in error.message


def test_ids_reject_control_characters():
    assert_field("member.id", member=replace(MEMBER, id="a\nb"))
    assert_field("candidates[1].id", candidates=with_candidate(1, id="a\x00"))


@pytest.mark.parametrize("name", ["headline", "location"])
def test_member_text_too_long(name):
    assert_field(f"member.{name}", member=replace(MEMBER, **{name: "x" * 21}))


def test_text_allows_newlines_but_not_nul():
    check(candidates=with_candidate(0, description="line one\nline\ttwo\r\n"))
    assert_field("candidates[2].description", candidates=with_candidate(2, description="bad\x00"))
    assert_field("member.headline", member=replace(MEMBER, headline="bell\x07"))


@pytest.mark.parametrize("name", ["skills", "industries"])
def test_member_lists(name):
    assert_field(f"member.{name}", member=replace(MEMBER, **{name: ("a", "b", "c", "d")}))
    assert_field(f"member.{name}[1]", member=replace(MEMBER, **{name: ("a", "x" * 21)}))


def test_member_enum_and_years():
    assert_field("member.seniority", member=replace(MEMBER, seniority="senior"))
    for years in (-1.0, 101.0, float("nan"), float("inf")):
        assert_field("member.years_experience", member=replace(MEMBER, years_experience=years))


def test_candidates_required_and_bounded():
    assert_field("candidates", candidates=[])
    error = assert_field("candidates", candidates=items(6))
    assert "at most 5" in error.message


@pytest.mark.parametrize("name", ["title", "company", "location", "industry", "description"])
def test_candidate_text_too_long(name):
    assert_field(f"candidates[3].{name}", candidates=with_candidate(3, **{name: "x" * 21}))


def test_candidate_id_rules():
    assert_field("candidates[2].id", candidates=with_candidate(2, id=""))
    assert_field("candidates[2].id", candidates=with_candidate(2, id="x" * 9))
    error = assert_field("candidates[3].id", candidates=with_candidate(3, id="i1"))
    assert error.message == "candidates[3].id: duplicate of candidates[1].id"


def test_candidate_lists_and_enums():
    assert_field("candidates[0].required_skills", candidates=with_candidate(0, required_skills=("a",) * 4))
    assert_field("candidates[1].required_skills[0]", candidates=with_candidate(1, required_skills=("\x00",)))
    assert_field("candidates[1].kind", candidates=with_candidate(1, kind=7))
    assert_field("candidates[2].seniority", candidates=with_candidate(2, seniority=None))
    check(candidates=with_candidate(0, kind=ItemKind.UNSPECIFIED, seniority=Seniority.UNSPECIFIED))


def test_top_k():
    assert_field("top_k", top_k=-1)
    assert_field("top_k", top_k=0)  # required: zero top_k with candidates is bad input
    assert effective_top_k(3, 7) == 3
    assert effective_top_k(50, 7) == 7  # clamped, not an error


def test_history():
    from slimserve.schema import Activity, ActivityKind

    ok = (Activity("Engineer", "Acme"), Activity("Nurse", kind=ActivityKind.DISMISSED))
    check(member=dataclasses.replace(MEMBER, history=ok))
    assert_field("member.history", member=dataclasses.replace(MEMBER, history=ok + ok[:1]))
    assert_field(
        "member.history[1].item_title", member=dataclasses.replace(MEMBER, history=(ok[0], Activity("")))
    )
    long = Activity("Engineer", company="c" * 21)
    assert_field("member.history[0].company", member=dataclasses.replace(MEMBER, history=(long,)))
    bad_kind = Activity("Engineer", kind="sometimes")
    assert_field("member.history[0].kind", member=dataclasses.replace(MEMBER, history=(bad_kind,)))
