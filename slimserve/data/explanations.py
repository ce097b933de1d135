"""Explanations of (member, item) pairs written from the pair's observable facts only.

The generator teacher is fine-tuned on these before it is distilled (docs/generator-build.md), so the
student learns to explain a recommendation from what the profile and the item actually say. Pure Python.
The facts and the verdict rule live in ``slimserve.pair_facts`` (the reasoning service states them in
the ``explain-v5`` prompt); on the synthetic data the three verdicts separate the labels well (82%, 40%
and 12% engaged; docs/generator-build.md).

**Wording** (``write_explanation``): the verdict sentence, then the skills sentence (always second, so a
length-limited answer still names them), then level, location, industry and activity in the order the
prompt states them; every fact has several phrasings, all drawn from a seeded ``random.Random``. The order
is fixed because with a shuffled one the fine-tuned teacher, and the student after it, lost track of what
they had said and stated a fact twice (docs/generator-build.md). The text names only the pair's
own skills, companies, cities and industries; ``evaluation.grounding`` checks exactly that. The activity
is mentioned only when it concerns the item's company or industry.
"""

from __future__ import annotations

import random

from ..pair_facts import (
    REMOTE_CLOSED,
    REMOTE_OPEN,
    SAME_CITY,
    PairFacts,
    indefinite_article,
    join_words,
    pair_facts,
    verdict_of,
)
from ..schema import ActivityKind, Item, Member
from . import vocab

# The writer's version: a build's generator stages depend on it (a new one re-runs them). 2: no "a step
# up from <your level>" wording; 3: "an" before a vowel ("an Accountant role").
WRITER_VERSION = 3


def _steps(n: int) -> str:
    return "one level" if n == 1 else f"{n} levels"


def _capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


def _verdict_sentence(rng: random.Random, verdict: str, f: PairFacts) -> str:
    return rng.choice(
        (
            f"{verdict}.",
            f"{verdict} for you.",
            f"{verdict} overall.",
            f"{verdict} for this {f.kind}.",
        )
    )


def _skills_sentence(rng: random.Random, f: PairFacts) -> str:
    shared, missing = join_words(f.shared_skills), join_words(f.missing_skills)
    if not f.shared_skills and not f.missing_skills:
        return rng.choice(
            (
                f"The {f.kind} lists no required skills.",
                "No required skills are listed to compare with yours.",
            )
        )
    if not f.missing_skills:
        return rng.choice(
            (
                f"You have every skill it asks for: {shared}.",
                f"Your skills cover the whole list: {shared}.",
                f"All of the required skills are on your profile ({shared}).",
                f"You already know {shared}, all that the {f.kind} requires.",
            )
        )
    if not f.shared_skills:
        return rng.choice(
            (
                f"You have none of the required skills ({missing}).",
                f"The {f.kind} asks for {missing}, none of which are on your profile.",
                f"None of your skills match: it needs {missing}.",
                f"Your profile lists none of {missing}.",
            )
        )
    return rng.choice(
        (
            f"You have {shared}, but you would need {missing}.",
            f"Your {shared} skills match; {missing} {'is' if len(f.missing_skills) == 1 else 'are'} missing "
            f"from your profile.",
            f"You bring {shared}, while {missing} {'is' if len(f.missing_skills) == 1 else 'are'} lacking.",
            f"Shared skills: {shared}. Missing: {missing}.",
            f"You already know {shared} but not {missing}.",
        )
    )


def _level_sentence(rng: random.Random, f: PairFacts) -> str:
    gap = f.level_gap
    if gap is None:
        return rng.choice(("The level cannot be compared.", "Its seniority is not stated."))
    if gap == 0:
        return rng.choice(
            (
                f"It is at your level ({f.item_level}).",
                f"The {f.item_level} level matches yours.",
                f"Same level as you: {f.item_level}.",
            )
        )
    # Each wording names the item's level, then the gap "above/below" the member: a third one, "It is a
    # step up from <member level>", made the tuned teacher state wrong gaps (docs/generator-build.md).
    direction = "above" if gap > 0 else "below"
    return rng.choice(
        (
            f"It is {f.item_level}, {_steps(abs(gap))} {direction} you.",
            f"The {f.kind} is {f.item_level}, {_steps(abs(gap))} {direction} your {f.member_level} level.",
        )
    )


def _location_sentence(rng: random.Random, f: PairFacts) -> str:
    if f.location_fit == REMOTE_OPEN:
        return rng.choice(
            (
                "It is remote, and you are open to that.",
                "It is remote, which suits you.",
                "Remote work is possible, as you want.",
            )
        )
    if f.location_fit == REMOTE_CLOSED:
        return rng.choice(
            ("It is remote, but you are not open to remote work.", "It is remote, which you do not want.")
        )
    if f.location_fit == SAME_CITY:
        return rng.choice(
            (f"It is in {f.item_city}, where you live.", f"It is on site in {f.item_city}, your city.")
        )
    here = f.member_city or "your city"
    return rng.choice(
        (
            f"It is on site in {f.item_city}; you are in {here}.",
            f"You would have to move from {here} to {f.item_city}.",
            f"It is in {f.item_city}, not {here}.",
        )
    )


def _industry_sentence(rng: random.Random, f: PairFacts) -> str:
    industry = f.item_industry
    if not industry:
        return rng.choice(("Its industry is not stated.", f"The {f.kind} names no industry."))
    company = f.company or f"The {f.kind}"
    if f.industry_match:
        return rng.choice(
            (
                f"It is in {industry}, your industry.",
                f"{company} is in {industry}, an industry you know.",
                f"{_capitalize(industry)} is an industry you work in.",
            )
        )
    yours = join_words(f.member_industries)
    options = [
        f"{_capitalize(industry)} would be a new industry for you.",
        f"{company} is in {industry}, new to you.",
    ]
    if yours:
        options.append(f"It is in {industry}, outside your {yours} background.")
    return rng.choice(options)


def _activity_sentence(rng: random.Random, f: PairFacts) -> str | None:
    a = f.activity
    if a is None or f.activity_relation == "other":
        return None  # no history, or none that concerns this item's company or industry
    at = f" at {a.company}" if a.company else ""
    article = indefinite_article(a.item_title)
    verbs = ("dismissed", "passed on") if a.kind is ActivityKind.DISMISSED else ("engaged with", "looked at")
    if f.activity_relation == "same company":
        return rng.choice(
            (
                f"You recently {rng.choice(verbs)} {article} {a.item_title} role{at}.",
                f"Your recent activity: you {rng.choice(verbs)} {a.item_title}{at}.",
            )
        )
    return rng.choice(
        (
            f"You recently {rng.choice(verbs)} {article} {a.item_title} role in {a.industry}.",
            f"Your recent activity: you {rng.choice(verbs)} {a.item_title} ({a.industry}).",
        )
    )


def write_explanation(member: Member, item: Item, rng: random.Random) -> str:
    """A short explanation of the pair from its facts: verdict, skills, then the other facts in the
    prompt's order."""
    f = pair_facts(member, item)
    first = [_verdict_sentence(rng, verdict_of(f), f), _skills_sentence(rng, f)]
    rest = [_level_sentence(rng, f), _location_sentence(rng, f), _industry_sentence(rng, f)]
    activity = _activity_sentence(rng, f)
    if activity is not None:
        rest.append(activity)
    return " ".join(first + rest)


def explanation_rng(seed: int, member: Member, item: Item) -> random.Random:
    """The seeded generator of one pair's explanation (the same pair and seed write the same text)."""
    return random.Random(f"{seed}:{member.id}:{item.id}")


# Free instructions for the teacher to answer itself (mixed into its fine-tune so that free ``Generate``
# prompts keep working): templates filled from the dataset's vocabulary.
_GENERAL_TEMPLATES = (
    "Give three short tips for a job interview as a {title}.",
    "Write a two-sentence job advert for a {title} in {city}.",
    "What does a {title} do in a typical week? Answer briefly.",
    "Explain in two sentences what {skill} is used for.",
    "Suggest a one-week plan to start learning {skill}.",
    "Write a short, friendly message to a recruiter asking about a {title} role.",
    "List three questions to ask at the end of an interview in {industry}.",
    "Summarize in two sentences why {industry} companies hire for {skill}.",
    "Write a one-paragraph summary for a profile of an experienced {title}.",
    "How can someone move from {industry} into a new industry? Give two ideas.",
    "Name two ways to show {skill} experience on a CV.",
    "Write a polite two-sentence reply declining a job offer.",
)


# Free prompts off the career topic: the published generator's check of free ``Generate`` prompts adds
# them to held-out fills of the templates above.
OFF_TOPIC_INSTRUCTIONS = (
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "Explain photosynthesis to a child in two sentences.",
    "Translate 'good morning' into Spanish and German.",
)


def general_instructions(count: int, seed: int) -> list[str]:
    """``count`` free instructions (career and general questions), seeded."""
    rng = random.Random(f"general:{seed}")
    titles = [t for f in vocab.FAMILIES for t in f.titles]
    skills = list(vocab.SKILLS)
    out = []
    for _ in range(count):
        template = rng.choice(_GENERAL_TEMPLATES)
        out.append(
            template.format(
                title=rng.choice(titles),
                city=rng.choice(vocab.CITIES),
                skill=rng.choice(skills),
                industry=rng.choice(vocab.INDUSTRIES),
            )
        )
    return out
