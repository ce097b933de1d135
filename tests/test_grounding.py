"""The explanation writer (facts in, text that states only those facts) and the grounding evaluator on
hand-written good and bad explanations."""

from __future__ import annotations

import dataclasses
import random

import pytest

from slimserve.data import vocab
from slimserve.data.explanations import explanation_rng, general_instructions, write_explanation
from slimserve.data.synth import SynthConfig, synthesize
from slimserve.evaluation.grounding import (
    check_explanation,
    evaluate_grounding,
    mentions,
    parse_verdict,
    repeated_sentences,
    summarize,
)
from slimserve.pair_facts import (
    OTHER_CITY,
    REMOTE_CLOSED,
    REMOTE_OPEN,
    SAME_CITY,
    VERDICTS,
    join_words,
    pair_facts,
    verdict_for,
)
from slimserve.prompts import EXPLAIN_TEMPLATE_VERSION, SERVED_EXPLAIN_TEMPLATES, render_explain_request
from slimserve.schema import Activity, ActivityKind, Item, Member, Seniority

MEMBER = Member(
    id="m-1",
    headline="Senior Backend Developer in software",
    skills=("python", "sql", "docker", "aws"),
    seniority=Seniority.SENIOR,
    years_experience=8,
    location="Berlin",
    industries=("software",),
    open_to_remote=False,
    history=(Activity("Backend Developer", "Globex Corporation", "software", ActivityKind.ENGAGED),),
)
ITEM = Item(
    id="job-1",
    title="Software Engineer",
    company="Globex Corporation",
    required_skills=("python", "kubernetes", "sql"),
    seniority=Seniority.SENIOR,
    location="Berlin",
    industry="software",
    description="Global enterprise hiring a software engineer.",
)


def item(**changes) -> Item:
    return Item(**{**ITEM.__dict__, **changes})


@pytest.fixture(scope="module")
def pairs():
    dataset, _ = synthesize(SynthConfig(members=120, items=80, seed=3))
    return [(dataset.members[i.member_id], dataset.items[i.item_id]) for i in dataset.interactions[:600]]


# The writer.


def test_facts_of_a_pair():
    facts = pair_facts(MEMBER, ITEM)
    assert facts.shared_skills == ("python", "sql") and facts.missing_skills == ("kubernetes",)
    assert facts.level_gap == 0 and facts.location_fit == "same city" and facts.industry_match
    assert facts.activity_relation == "same company" and facts.activity.item_title == "Backend Developer"
    assert pair_facts(MEMBER, item(seniority=Seniority.ENTRY)).level_gap == -2


@pytest.mark.parametrize(
    ("changes", "verdict"),
    [
        ({}, "Strong fit"),  # 2 of 3 skills (2 points) + level + location = 4
        ({"location": "Paris"}, "Partial fit"),  # 3 points
        ({"location": "Paris", "remote": True}, "Partial fit"),  # remote, but the member is not open to it
        ({"required_skills": ("python", "sql", "aws")}, "Strong fit"),  # 5 points
        ({"required_skills": ("python", "sql", "aws"), "location": "Paris"}, "Strong fit"),  # 3 + level
        ({"required_skills": ("python", "figma", "seo")}, "Partial fit"),  # 1 + 1 + 1 = 3
        ({"required_skills": ("python", "figma", "seo"), "location": "Paris"}, "Partial fit"),  # 2 points
        (
            {
                "required_skills": ("python", "figma", "seo"),
                "location": "Paris",
                "seniority": Seniority.INTERN,
            },
            "Weak fit",  # 1 point
        ),
        ({"required_skills": ("figma", "seo", "crm")}, "Partial fit"),  # 0 + level + location = 2
        ({"required_skills": ("figma", "seo", "crm"), "location": "Paris"}, "Weak fit"),  # 1 point
        ({"required_skills": (), "location": "Paris"}, "Partial fit"),  # no skills listed: 1.5 + level
    ],
)
def test_verdict_rule(changes, verdict):
    assert verdict_for(MEMBER, item(**changes)) == verdict


def test_explanation_states_the_facts_and_only_them():
    text = write_explanation(MEMBER, ITEM, random.Random(0))
    assert text.startswith("Strong fit")
    for fact in ("python", "sql", "kubernetes", "Berlin", "software"):
        assert fact in text.lower() or fact in text
    named = {term for _, term in mentions(text)}
    assert named <= {"python", "sql", "kubernetes", "berlin", "software", "globex corporation"}
    check = check_explanation(MEMBER, ITEM, text)
    assert not check.hallucinated and check.covered and check.verdict_agrees


def test_explain_prompt_states_the_computed_facts_and_only_the_pairs_terms():
    text = render_explain_request(MEMBER, item(location="Paris"))
    assert "- skills the member has (2 of 3 required): python and sql\n" in text
    assert "- skills the member lacks (1 of 3 required): kubernetes\n" in text
    assert "- level: senior, the member's level\n" in text
    assert "- location: on site in Paris; the member is in Berlin\n" in text
    assert "- industry: software, one of the member's industries\n" in text
    assert "- recent activity: engaged with Backend Developer at Globex Corporation (same company)\n" in text
    assert "- verdict: Partial fit\n" in text and verdict_for(MEMBER, item(location="Paris")) == "Partial fit"
    named = {term for _, term in mentions(text)}
    assert named <= {
        "python",
        "sql",
        "kubernetes",
        "docker",
        "aws",
        "berlin",
        "paris",
        "software",
        "globex corporation",
    }


def test_explain_prompt_states_a_full_match_or_no_match_in_one_line_without_a_list_of_none():
    full = render_explain_request(MEMBER, item(required_skills=["python", "sql"]))
    assert full.startswith("Job: Software Engineer at Globex Corporation\nFacts:\n")
    assert "- skills the member has: python and sql (all 2 required)\n" in full
    assert "lacks" not in full and "none" not in full.lower()
    no_match = render_explain_request(MEMBER, item(required_skills=["kubernetes"]))
    assert "- skills the member lacks: kubernetes (the one required)\n" in no_match
    assert "skills the member has" not in no_match
    v4 = render_explain_request(MEMBER, item(required_skills=["kubernetes"]), "explain-v4")  # still served
    assert "- skills the member lacks: the one required (kubernetes)\n" in v4


def test_explain_prompt_spells_every_listed_skill_as_the_answer_writes_it():
    """Each skill's tokens in the prompt are the tokens an answer writes (its leading space included), so
    the student copies them: after "(" the first name of a list lost its space ("negot", "iation")."""
    from slimserve.models.teacher import default_tokenizer_file
    from slimserve.tokenization import load_tokenizer

    tokenizer = load_tokenizer(default_tokenizer_file())
    for skills in (["negotiation", "lead generation", "salesforce"], ["python", "sql"], ["kubernetes"]):
        for member_skills in ((), tuple(skills)):  # none of them, all of them
            member = dataclasses.replace(MEMBER, skills=member_skills)
            prompt = tokenizer.encode(render_explain_request(member, item(required_skills=skills))).ids
            for skill in skills:
                written = tokenizer.encode(f" {skill}").ids
                assert any(prompt[i : i + len(written)] == written for i in range(len(prompt))), skill


def test_explain_prompt_versions(pairs):
    for member, item_ in pairs[:50]:  # every synthetic pair renders, and the verdict line is the rule's
        prompt = render_explain_request(member, item_)
        assert f"- verdict: {verdict_for(member, item_)}\n" in prompt
        facts = pair_facts(member, item_)
        for skills in (facts.shared_skills, facts.missing_skills):  # the lists as explanations say them
            listed = f": {join_words(skills)}"
            assert (
                not skills
                or f"{listed}\n" in prompt
                or f"{listed} (all " in prompt
                or f"{listed} (the " in prompt
            )
        assert "Member:" not in prompt and len(prompt) < len(
            render_explain_request(member, item_, "explain-v3")
        )
    old = render_explain_request(MEMBER, ITEM, "explain-v1")
    assert "Facts:" not in old and "Member skills: python, sql, docker, aws" in old
    v2 = render_explain_request(MEMBER, item(location="Paris"), "explain-v2")  # lists as v2 served them
    assert "- skills the member has: python, sql\n- skills the member lacks: kubernetes\n" in v2
    none_required = render_explain_request(MEMBER, item(required_skills=[]))
    assert (
        "- required skills: none listed\n" in none_required and "skills the member has" not in none_required
    )
    v3 = render_explain_request(MEMBER, item(required_skills=["python", "sql"]), "explain-v3")
    assert v3.startswith("Member: ") and "- skills the member lacks (0 of 2 required): none\n" in v3
    assert EXPLAIN_TEMPLATE_VERSION in SERVED_EXPLAIN_TEMPLATES
    assert {"explain-v1", "explain-v2", "explain-v3"} <= set(SERVED_EXPLAIN_TEMPLATES)
    with pytest.raises(ValueError, match="unknown explain template 'explain-v0'"):
        render_explain_request(MEMBER, ITEM, "explain-v0")


def test_written_explanations_are_grounded_on_the_synthetic_data(pairs):
    summary, checks = evaluate_grounding(
        pairs, [write_explanation(m, i, explanation_rng(0, m, i)) for m, i in pairs]
    )
    bad = [c.as_dict() for c in checks if c.hallucinated or c.covered is False or not c.verdict_agrees]
    assert not bad
    assert summary.hallucination_rate == 0 and summary.coverage == 1 and summary.verdict_agreement == 1
    assert summary.repetition_rate == 0
    assert summary.coverage_pairs > 50 and all(summary.verdicts[v] > 0 for v in VERDICTS)


def test_explanations_vary_in_wording_and_follow_the_prompt_s_order(pairs):
    member, item_ = pairs[0]
    texts = {write_explanation(member, item_, random.Random(seed)) for seed in range(40)}
    assert len(texts) >= 20
    assert write_explanation(member, item_, explanation_rng(5, member, item_)) == write_explanation(
        member, item_, explanation_rng(5, member, item_)
    )
    sentences = [t.split(". ") for t in texts]
    assert len({s[0] for s in sentences}) >= 3  # verdict phrasings
    assert len({s[2] for s in sentences}) >= 2  # level phrasings
    # After verdict and skills: level, location, industry, as the prompt states them.
    for seed in range(10):
        text = write_explanation(MEMBER, ITEM, random.Random(seed))
        assert text.index("Berlin") < text.lower().index("software"), text
    # Across pairs: many distinct texts and sentence openings, no single template.
    every = [write_explanation(m, i, explanation_rng(0, m, i)) for m, i in pairs[:200]]
    openings = {" ".join(s.split()[:2]) for t in every for s in t.split(". ")[1:]}
    assert len(set(every)) == len(every) and len(openings) >= 25


def test_general_instructions_are_seeded_and_varied():
    first = general_instructions(30, seed=1)
    assert first == general_instructions(30, seed=1) and first != general_instructions(30, seed=2)
    assert len(set(first)) >= 20 and all(text.strip() for text in first)


# The evaluator on hand-written explanations (MEMBER x ITEM: shares python and sql, lacks kubernetes,
# same level, same city, same industry: a Strong fit).

GOOD = (
    "Strong fit. You have python and sql, but you would need kubernetes. The senior level matches yours "
    "and it is in Berlin, your city. Globex Corporation is in software, your industry."
)


def test_a_grounded_explanation_passes():
    check = check_explanation(MEMBER, ITEM, GOOD, decision=True)
    assert not check.hallucinated and check.covered and check.verdict == "Strong fit"
    assert check.verdict_agrees and check.decision_agrees
    assert check.problems() == []


def test_problems_name_what_is_wrong_in_a_phrase_each():
    text = "Weak fit. You have kubernetes. The team in Paris is two levels above you. You recently dismissed a Nurse role."
    assert check_explanation(MEMBER, ITEM, text).problems() == [
        "names 'paris', of neither side",
        "claims the member has 'kubernetes'",
        "states 'The team in Paris is two levels above you'",
        "states 'dismissed a Nurse role'",
        "verdict Weak fit, the facts say Strong fit",
    ]


@pytest.mark.parametrize(
    ("text", "foreign", "false_claims"),
    [
        ("Strong fit. You have python, sql and kubernetes.", [], ["kubernetes"]),  # claims a lacking skill
        ("Strong fit. Shared skills: python and kubernetes.", [], ["kubernetes"]),
        ("Strong fit. Your tableau and python experience fits.", ["skill:tableau"], ["tableau"]),
        ("Strong fit. The team in Paris uses python.", ["city:paris"], []),
        ("Strong fit. Initech Group would value your sql.", ["company:initech group"], []),
        ("Strong fit. It is a great role in healthcare for you.", ["industry:healthcare"], []),
    ],
)
def test_hallucinations_are_caught(text, foreign, false_claims):
    check = check_explanation(MEMBER, ITEM, text)
    assert check.hallucinated
    assert check.foreign_terms == foreign and check.false_skill_claims == false_claims


@pytest.mark.parametrize(
    "text",
    [
        "Strong fit. You lack kubernetes, but you have python.",  # a lacking skill named as lacking
        "Strong fit. The job requires you to know kubernetes; you know python.",
        "Strong fit. You would need to learn kubernetes. You already use sql.",
        "Strong fit. You can go far here with python.",  # "go" as a plain word
        "Strong fit. Your Backend Developer role at Globex Corporation shows your python.",
    ],
)
def test_no_false_alarm_on_grounded_phrasings(text):
    check = check_explanation(MEMBER, ITEM, text)
    assert not check.hallucinated, check.as_dict()
    assert check.covered


FULL_MATCH = item(required_skills=("python", "sql", "docker"))


@pytest.mark.parametrize(
    "text",
    [  # the first is what the cpu recipe's 5-epoch students wrote for the demo's full match
        "Strong fit for this job. You have python, sql and docker, but you would need none of your skills.",
        "Strong fit. You have python and sql; docker is missing from your profile.",
        "Strong fit. None of your skills match: it needs python.",
        "Strong fit. You bring python, while you lack docker.",
    ],
)
def test_a_gap_claimed_for_a_full_match_is_caught(text):
    check = check_explanation(MEMBER, FULL_MATCH, text)
    assert check.hallucinated and check.false_gap_claims and not check.false_skill_claims


def test_full_match_phrasings_and_real_gaps_raise_no_gap_alarm(pairs):
    for text in (
        "Strong fit. You have every skill it asks for: python, sql and docker. It is in Berlin, your city.",
        "Strong fit. You already know python, sql and docker, all that the job requires.",
    ):
        assert not check_explanation(MEMBER, FULL_MATCH, text).false_gap_claims, text
    assert not check_explanation(MEMBER, ITEM, GOOD).false_gap_claims  # a real gap, named
    full = [(m, i) for m, i in pairs if i.required_skills and set(i.required_skills) <= set(m.skills)]
    assert len(full) >= 3
    for member, job in full:  # the writer's own full-match explanations, in several wordings
        for seed in range(8):
            text = write_explanation(member, job, explanation_rng(seed, member, job))
            assert not check_explanation(member, job, text).false_gap_claims, text


@pytest.mark.parametrize(
    ("seniority", "text"),
    [  # ITEM is senior; the first is what a fine-tuned teacher and its students wrote for a same-level pair
        (Seniority.SENIOR, "Strong fit. You have python and sql. It is a step up from senior."),
        (Seniority.MID, "Strong fit. You have python and sql. It is at your level (senior)."),
        (Seniority.MID, "Strong fit. You have python and sql. It is senior, one level below you."),
        (Seniority.ENTRY, "Strong fit. You have python and sql. It is 3 steps up from entry-level."),
        (Seniority.UNSPECIFIED, "Strong fit. You have python and sql. The senior level matches yours."),
        # a same-level pair's fit denied (a student's demo text)
        (Seniority.SENIOR, "Strong fit. You have python and sql. It is senior, which you are not."),
    ],
)
def test_a_level_gap_the_pair_lacks_is_caught(seniority, text):
    member = Member(**{**MEMBER.__dict__, "seniority": seniority})
    check = check_explanation(member, ITEM, text)
    assert check.hallucinated and check.false_level_claims and not check.foreign_terms


def test_level_phrasings_that_state_the_gap_raise_no_alarm(pairs):
    for seniority, text in (
        (Seniority.SENIOR, GOOD),  # "The senior level matches yours"
        (Seniority.MID, "Strong fit. It is senior, one level above your level. You have python."),
        (Seniority.ENTRY, "Strong fit. It is 2 steps up from entry-level, not a level you hold yet."),
        (Seniority.LEAD, "Strong fit. It is a step down from lead. It is not at your level."),
        (Seniority.MID, "Strong fit. It is senior, which you are not. You have python."),
        (Seniority.SENIOR, "Weak fit. It is remote, which you are not open to. It is senior."),
        (Seniority.UNSPECIFIED, "Strong fit. The level cannot be compared. You have python."),
    ):
        member = Member(**{**MEMBER.__dict__, "seniority": seniority})
        assert not check_explanation(member, ITEM, text).false_level_claims, text
    gaps = set()
    for member, job in pairs:  # the writer's level sentences, in every wording, at every gap it meets
        facts = pair_facts(member, job)
        gaps.add(facts.level_gap)
        for seed in range(6):
            text = write_explanation(member, job, explanation_rng(seed, member, job))
            assert not check_explanation(member, job, text).false_level_claims, (facts.level_gap, text)
    assert {0, 1, -1, 2, -2} <= gaps


def test_wrong_verdict_and_missing_coverage_are_caught():
    wrong = check_explanation(MEMBER, ITEM, GOOD.replace("Strong fit", "Weak fit"), decision=True)
    assert wrong.verdict == "Weak fit" and not wrong.verdict_agrees and wrong.decision_agrees is False
    assert not wrong.hallucinated and wrong.covered
    noise = check_explanation(
        MEMBER, ITEM, "This job is a great fit for me, as I'm passionate about technology.", decision=False
    )
    assert noise.verdict is None and not noise.verdict_agrees and noise.covered is False
    assert noise.decision_agrees is False and not noise.hallucinated
    partial = check_explanation(MEMBER, ITEM, "Partial fit. You have python.", decision=True)
    assert partial.decision_agrees is None and not partial.verdict_agrees
    # No skill shared: coverage is not counted.
    assert check_explanation(MEMBER, item(required_skills=("figma",)), "Weak fit.").covered is None


def test_a_second_verdict_later_in_the_text_is_a_disagreement():
    """The demo's student once wrote "Strong fit for this job. ... Weak fit overall.": it states both."""
    both = check_explanation(MEMBER, ITEM, GOOD + " Weak fit overall.", decision=True)
    assert both.verdict == "Strong fit" and both.other_verdicts == ["Weak fit"]
    assert not both.verdict_agrees and both.decision_agrees is False
    again = check_explanation(MEMBER, ITEM, GOOD + " A strong fit overall.", decision=True)
    assert again.other_verdicts == [] and again.verdict_agrees and again.decision_agrees


def test_skills_outside_the_dataset_are_read_on_renamed_pairs():
    """A pair renamed to held-out skills: copying them covers; a garbled name does not; a renamed skill
    of neither side is a hallucination."""
    member = Member(**{**MEMBER.__dict__, "skills": ("grpc", "postgresql", "docker")})
    renamed = item(required_skills=("grpc", "postgresql", "terraform"))
    copied = check_explanation(member, renamed, "Strong fit. You have grpc and postgresql.")
    assert copied.covered and not copied.hallucinated
    garbled = check_explanation(member, renamed, "Strong fit. You have postql and grcp.")
    assert garbled.covered is False
    foreign = check_explanation(member, renamed, "Strong fit. Your grpc and kafka fit.")
    assert foreign.hallucinated and foreign.foreign_terms == ["skill:kafka"]


def test_verdict_parsing():
    assert parse_verdict("  strong FIT: you have python") == "Strong fit"
    assert parse_verdict("This is a partial fit for you. Strong fit later.") == "Partial fit"
    assert parse_verdict("Great match. Weak fit.") is None


def test_rates_over_pairs():
    other = item(id="job-2", required_skills=("figma", "seo", "crm"), location="Paris")  # Weak fit
    pairs = [(MEMBER, ITEM), (MEMBER, ITEM), (MEMBER, other), (MEMBER, other)]
    texts = [
        GOOD,
        "Weak fit. You have kubernetes.",  # wrong verdict, false claim, no shared skill named
        "Weak fit. None of your skills match: it needs figma, seo and crm.",
        "Partial fit. It is in Paris.",
    ]
    summary, _ = evaluate_grounding(pairs, texts, [True, True, False, None])
    assert summary.pairs == 4 and summary.hallucination_rate == 0.25
    assert summary.coverage == 0.5 and summary.coverage_pairs == 2
    assert summary.verdict_agreement == 0.5
    assert summary.decision_agreement == pytest.approx(2 / 3) and summary.decision_pairs == 3
    assert summary.verdicts == {"Strong fit": 1, "Partial fit": 1, "Weak fit": 2, "none": 0}
    assert summary.repetition_rate == 0
    assert summarize([]).pairs == 0


def test_a_sentence_stated_twice_is_caught_and_counted():
    twice = GOOD + " It is in Berlin, your city.  it is in  berlin, your city."
    check = check_explanation(MEMBER, ITEM, twice)
    assert check.repeated_sentences == ["it is in berlin, your city."]
    assert not check.hallucinated  # a repetition is counted apart, not as a hallucination
    assert check_explanation(MEMBER, ITEM, GOOD).repeated_sentences == []
    # "It is in" opening two different sentences is no repetition
    assert not repeated_sentences("It is in Berlin, your city. It is in software, your industry.")
    summary, _ = evaluate_grounding([(MEMBER, ITEM)] * 2, [GOOD, twice])
    assert summary.repetition_rate == 0.5


def test_vocabulary_terms_are_found_longest_first():
    found = [term for _, term in mentions("Social media and SQL at Red Cross Chapter in Lisbon (e-learning)")]
    assert found == ["social media", "sql", "red cross chapter", "lisbon", "e-learning"]
    assert {c.lower() for c in vocab.CITIES} <= {term for _, term in mentions(" ".join(vocab.CITIES))}


@pytest.mark.parametrize(
    ("changes", "text"),
    [  # MEMBER lives in Berlin and is not open to remote work; ITEM is on site in Berlin
        ({}, "Strong fit. You have python and sql. It is remote, which suits you."),
        ({}, "Strong fit. You have python and sql. Remote work is possible, as you do not want an office."),
        ({}, "Strong fit. You have python and sql. You would have to move from Berlin to Berlin."),
        ({"location": "Paris"}, "Strong fit. You have python and sql. It is in Paris, where you live."),
        ({"remote": True}, "Strong fit. You have python and sql. It is on site in Berlin, your city."),
        ({"remote": True}, "Strong fit. You have python and sql. It is remote, and you are open to that."),
        ({}, "Strong fit. You have python and sql. It is in Berlin, not Berlin."),  # a student's demo text
    ],
)
def test_a_location_fit_the_pair_lacks_is_caught(changes, text):
    check = check_explanation(MEMBER, item(**changes), text)
    assert check.hallucinated and check.false_location_claims and not check.foreign_terms


def test_location_phrasings_that_state_the_fit_raise_no_alarm(pairs):
    open_member = Member(**{**MEMBER.__dict__, "open_to_remote": True})
    for member, changes, text in (
        (MEMBER, {}, GOOD),
        (
            MEMBER,
            {"remote": True},
            "Weak fit. It is remote, not on site, and you are not open to remote work.",
        ),
        (open_member, {"remote": True}, "Strong fit. It is remote, so you would not have to move."),
        (MEMBER, {"location": "Paris"}, "Partial fit. It is on site in Paris, not where you live."),
    ):
        assert not check_explanation(member, item(**changes), text).false_location_claims, text
    fits = set()
    for member, job in pairs:  # the writer's location sentences, in every wording, at every fit it meets
        fits.add(pair_facts(member, job).location_fit)
        for seed in range(6):
            text = write_explanation(member, job, explanation_rng(seed, member, job))
            assert not check_explanation(member, job, text).false_location_claims, text
    assert fits == {SAME_CITY, OTHER_CITY, REMOTE_OPEN, REMOTE_CLOSED}


@pytest.mark.parametrize(
    ("text", "claim"),
    [  # MEMBER engaged with "Backend Developer" at Globex Corporation, in software
        ("Strong fit. You recently looked at a Senior Backend Developer role.", "looked at a Senior Backend Developer role"),
        ("Strong fit. You recently looked at a Developer role at Globex Corporation.", "looked at a Developer role at Globex Corporation"),
        ("Strong fit. Your recent activity: you dismissed Backend Developer.", "dismissed Backend Developer"),
        ("Strong fit. You recently passed on a Software Engineer role.", "passed on a Software Engineer role"),
        ("Strong fit. You recently engaged with a Backend Developer role in finance.", "engaged with a Backend Developer role in finance"),
        ("Strong fit. Your recent activity: you looked at Backend Developer at Initech.", "looked at Backend Developer at Initech"),
        ("Strong fit. Your recent activity: you engaged with Backend Developer (retail).", "engaged with Backend Developer (retail)"),
    ],
)  # fmt: skip
def test_an_activity_the_member_s_history_lacks_is_caught(text, claim):
    check = check_explanation(MEMBER, ITEM, text)
    assert check.hallucinated and check.false_activity_claims == [claim]


def test_activity_phrasings_that_state_the_history_raise_no_alarm(pairs):
    for text in (
        GOOD,
        "Strong fit. You recently engaged with a Backend Developer role at Globex Corporation.",
        "Strong fit. Your recent activity: you looked at backend developer (software).",
        "Strong fit. You have not dismissed a Software Engineer role.",
        "Strong fit. It looked at your python skills.",  # no title: no claim
    ):
        assert not check_explanation(MEMBER, ITEM, text).false_activity_claims, text
    kinds = set()
    for member, job in pairs:  # the writer's activity sentences, in every wording, of both kinds
        kinds |= {a.kind for a in member.history}
        for seed in range(6):
            text = write_explanation(member, job, explanation_rng(seed, member, job))
            assert not check_explanation(member, job, text).false_activity_claims, text
    assert kinds == {ActivityKind.ENGAGED, ActivityKind.DISMISSED}


@pytest.mark.parametrize(
    ("skills", "text", "garbled"),
    [  # the demo's published student wrote "postgru" and "typcript"; the unseen pairs "postgsrvql"
        (
            ("python", "grpc", "postgresql"),
            "Strong fit. You have python, grpc and postgru.",
            ["postgru~postgresql"],
        ),
        (
            ("python", "kubernetes", "sql"),
            "Strong fit. You have python and kubernets.",
            ["kubernets~kubernetes"],
        ),
        (("python", "sql", "postgresql"), "Strong fit. You have postgsrvql.", ["postgsrvql~postgresql"]),
        (("go", "typescript", "react"), "Strong fit. You have typcript and react.", ["typcript~typescript"]),
    ],
)
def test_a_garbled_copy_of_a_pair_skill_is_caught(skills, text, garbled):
    member = Member(**{**MEMBER.__dict__, "skills": skills})
    check = check_explanation(member, item(required_skills=skills), text)
    assert check.hallucinated and check.garbled_names == garbled
    assert f"writes {garbled[0].split('~')[0]!r}" in check.problems()[0]


def test_words_near_a_skill_that_are_not_copies_raise_no_alarm(pairs):
    member = Member(**{**MEMBER.__dict__, "skills": ("python", "marketing", "excel")})
    job = item(required_skills=("marketing", "python", "leadership"))
    for text in (
        GOOD,
        "Strong fit. Your python is pythonic, the market likes marketing and you excel at it.",
    ):
        assert not check_explanation(member, job, text).garbled_names, text
    for member, job in pairs:  # the writer's texts: every word is the pair's or the writer's own
        for seed in range(3):
            text = write_explanation(member, job, explanation_rng(seed, member, job))
            assert not check_explanation(member, job, text).garbled_names, text


@pytest.mark.parametrize(
    ("skills", "text", "unknown"),
    [
        # a garble that lost the invented name's first letters, as in a student's demo text
        (
            ("python", "vorblenix", "crm"),
            "Weak fit. You have python, but none of blenix and crm.",
            ["blenix"],
        ),
        (("python", "sql"), "Strong fit. You have sql, ython and nothing else.", ["ython"]),
    ],
)
def test_an_unknown_word_listed_beside_a_skill_is_caught(skills, text, unknown):
    member = Member(**{**MEMBER.__dict__, "skills": ("python", "sql")})
    check = check_explanation(member, item(required_skills=skills), text)
    assert check.hallucinated and check.unknown_list_items == unknown
    assert f"lists {unknown[0]!r} among the skills" in " ".join(check.problems())


def test_list_neighbours_that_are_the_pairs_or_the_writers_raise_no_alarm(pairs):
    member = Member(**{**MEMBER.__dict__, "skills": ("python", "sql")})
    job = item(required_skills=("python", "sql", "postgresql"))
    for text in (
        "Partial fit. You have python and sql, but you would need postgresql.",
        "Partial fit. Python, sql and other skills match, so you would need postgresql only.",
    ):
        assert not check_explanation(member, job, text).unknown_list_items, text
    # a garbled copy is reported once, as a garble
    check = check_explanation(member, job, "Strong fit. You have python, sql and postgrsql.")
    assert check.garbled_names == ["postgrsql~postgresql"] and not check.unknown_list_items
    for member, job in pairs:  # the writer's texts, on pairs the writer's vocabulary was not taken from
        for seed in range(3):
            text = write_explanation(member, job, explanation_rng(seed, member, job))
            assert not check_explanation(member, job, text).unknown_list_items, text
