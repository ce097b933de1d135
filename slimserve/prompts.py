"""The scoring prompt template: the one place that turns a member and a candidate into model text.

The template is versioned. Its version is recorded in the serving bundle at export and checked by the
service, so a model is never served with a prompt it was not trained and exported with.
"""

from __future__ import annotations

from collections.abc import Callable

from .pair_facts import (
    OTHER_CITY,
    REMOTE_CLOSED,
    REMOTE_OPEN,
    SAME_CITY,
    PairFacts,
    join_words,
    level_gap,
    location_fit,
    pair_facts,
    verdict_of,
)
from .schema import Activity, ActivityKind, Item, ItemKind, Member, Seniority

SCORING_TEMPLATE_VERSION = "scoring-v5"
# Templates whose prompt is one text tokenized as a whole (no member prefix / item suffix split). Their
# bundles are still served, by the single-sequence scorer.
WHOLE_TEXT_TEMPLATES = ("scoring-v3",)
# Older split templates whose bundles are still served. ``scoring-v4`` asked the question after every
# item; ``scoring-v5`` asks it once, at the end of the member prefix (16 fewer tokens per candidate).
OLDER_SPLIT_TEMPLATES = ("scoring-v4",)
SERVED_TEMPLATES = (SCORING_TEMPLATE_VERSION, *OLDER_SPLIT_TEMPLATES, *WHOLE_TEXT_TEMPLATES)
# Templates whose member prefix ends with the question (asked once per Score call).
QUESTION_IN_PREFIX = ("scoring-v5",)

# The answer cue ends the prompt; the model's next token decides. Label words carry their leading space
# because that is how they follow the cue in running text (one token each in SmolLM2's vocabulary).
YES_WORD = " Yes"
NO_WORD = " No"

_SENIORITY_TEXT = {
    Seniority.UNSPECIFIED: "unspecified",
    Seniority.INTERN: "intern",
    Seniority.ENTRY: "entry level",
    Seniority.MID: "mid level",
    Seniority.SENIOR: "senior",
    Seniority.LEAD: "lead",
    Seniority.DIRECTOR: "director",
    Seniority.EXECUTIVE: "executive",
}

_KIND_TEXT = {
    ItemKind.UNSPECIFIED: "item",
    ItemKind.JOB: "job",
    ItemKind.COURSE: "course",
    ItemKind.POST: "post",
}


def _join(values: tuple[str, ...] | list[str]) -> str:
    return ", ".join(v for v in values if v) or "none listed"


_ACTIVITY_TEXT = {
    ActivityKind.UNSPECIFIED: "viewed",
    ActivityKind.ENGAGED: "engaged with",
    ActivityKind.DISMISSED: "dismissed",
}


def render_activity(activity: Activity) -> str:
    """One history entry: what the member did with which item."""
    where = f" at {activity.company}" if activity.company else ""
    industry = f" ({activity.industry})" if activity.industry else ""
    return f"{_ACTIVITY_TEXT[activity.kind]} {activity.item_title}{where}{industry}"


def render_member(member: Member) -> str:
    """Verbalize a member profile (360Brew style: short labelled lines, compact to keep prompts short)."""
    remote = "open to remote" if member.open_to_remote else "not open to remote"
    history = "; ".join(render_activity(a) for a in member.history) or "none"
    return (
        f"Member: {member.headline or 'no headline'} | {_SENIORITY_TEXT[member.seniority]}, "
        f"{member.years_experience:g} years | {member.location or 'unknown location'}, {remote}\n"
        f"Member skills: {_join(member.skills)}\n"
        f"Member industries: {_join(member.industries)}\n"
        f"Member activity: {history}\n"
    )


def render_item(item: Item) -> str:
    """Verbalize a candidate item."""
    kind = _KIND_TEXT[item.kind]
    remote = "remote" if item.remote else "on site"
    text = (
        f"{kind.capitalize()}: {item.title or 'untitled'} at {item.company or 'unknown company'} | "
        f"{_SENIORITY_TEXT[item.seniority]} | {item.location or 'unknown location'}, {remote} | "
        f"{item.industry or 'unknown industry'}\n"
        f"{kind.capitalize()} skills: {_join(item.required_skills)}\n"
    )
    if item.description:
        text += f"{kind.capitalize()} description: {item.description}\n"
    return text


def _gap_text(gap: int) -> str:
    """A non-zero level gap as the prompts say it: "1 level above the member", "2 levels below the member"."""
    steps = "1 level" if abs(gap) == 1 else f"{abs(gap)} levels"
    return f"{steps} {'above' if gap > 0 else 'below'} the member"


def _level_match(member: Seniority, item: Seniority) -> str:
    gap = level_gap(member, item)
    if gap is None:
        return "level unknown"
    return "same level" if gap == 0 else _gap_text(gap)


_LOCATION_MATCH = {
    REMOTE_OPEN: "remote, member open to remote",
    REMOTE_CLOSED: "remote, member not open to it",
    SAME_CITY: "same city",
    OTHER_CITY: "other city",
}


def render_match(member: Member, item: Item) -> str:
    """The match line: what the profile and the item share, computed from their fields.

    Production rankers verbalize such match features next to the raw profile; the model still has to
    learn how much each one matters (and the member's taste, which shows only in the activity).
    """
    required = [s for s in item.required_skills if s]
    shared = [s for s in required if s in set(member.skills)]
    industry = "member's industry" if item.industry in member.industries else "new industry"
    return (
        f"Match: {len(shared)} of {len(required)} skills; "
        f"{_level_match(member.seniority, item.seniority)}; {_LOCATION_MATCH[location_fit(member, item)]}; {industry}\n"
    )


def _question_once(version: str) -> bool:
    """Whether ``version`` asks the question once per member (``scoring-v5``) or after every item."""
    if version not in SERVED_TEMPLATES:
        raise ValueError(f"unknown scoring template {version!r}; known: {', '.join(SERVED_TEMPLATES)}")
    return version in QUESTION_IN_PREFIX


def _question(kind: str) -> str:
    return f"Question: Will this member engage with {kind}? Answer Yes or No.\n"


def render_member_prefix(member: Member, version: str = SCORING_TEMPLATE_VERSION) -> str:
    """The member prefix of a scoring prompt (profile, activity and, from ``scoring-v5``, the question):
    the same for all candidates of a Score call, so multi-item scoring computes it once."""
    question = _question("the item below") if _question_once(version) else ""
    return render_member(member) + question


def render_item_suffix(member: Member, item: Item, version: str = SCORING_TEMPLATE_VERSION) -> str:
    """The item suffix of a scoring prompt: the candidate, its match line (the question, before
    ``scoring-v5``) and the answer cue."""
    question = "" if _question_once(version) else _question(f"this {_KIND_TEXT[item.kind]}")
    return f"{render_item(item)}{render_match(member, item)}{question}Answer:"


def render_scoring_prompt(member: Member, item: Item, version: str = SCORING_TEMPLATE_VERSION) -> str:
    """The full scoring prompt as one text: member prefix + item suffix (``scoring-v3`` tokenizes the
    ``scoring-v4`` text whole; split templates tokenize the two parts apart, see
    ``slimserve.scoring_tokens``)."""
    split_version = OLDER_SPLIT_TEMPLATES[0] if version in WHOLE_TEXT_TEMPLATES else version
    return render_member_prefix(member, split_version) + render_item_suffix(member, item, split_version)


# The reasoning workload: the generator explains why an item suits a member. The text is the user turn
# of a chat wrapped by `render_chat_prompt`, so an instruction-tuned teacher sees the format it was
# trained on. ``explain-v2`` states the pair's computed facts (``slimserve.pair_facts``: shared and
# missing skills, level gap, location fit, industry, relevant activity, the verdict they call for) so the
# model explains them instead of computing them. ``explain-v3`` states the same facts with each skill list
# counted ("2 of 3 required") and punctuated as the explanations say it ("A, B and C"), so a small
# student copies a span rather than deciding where a list ends. ``explain-v4`` is ``explain-v3`` made
# short (about 150 prompt tokens, not 200: the member's and the item's profile lines, which the facts
# repeat, give way to the item's title and company) and states a full match, or a pair with none of the
# skills, in one line ("all 3 required") instead of a count and a list of "none", which a small student
# copied into a false gap ("but you would need none of them"). Shorter prompts are cheaper to train on
# and to attend to at every decode step. ``explain-v5`` moves that line's count behind its list ("python
# and sql (all 2 required)", not "all 2 required (python and sql)"): after "(" the list's first name
# tokenizes without its leading space ("negot", "iation"), unlike every name the answer writes
# (" negotiation"), and the student, which must then translate the name instead of copying its tokens,
# wrote "liaiation". The older versions are still served.
EXPLAIN_TEMPLATE_VERSION = "explain-v5"
OLDER_EXPLAIN_TEMPLATES = ("explain-v4", "explain-v3", "explain-v2", "explain-v1")
_ONE_LINE_SKILL_TEMPLATES = ("explain-v4", "explain-v5")
SERVED_EXPLAIN_TEMPLATES = (EXPLAIN_TEMPLATE_VERSION, *OLDER_EXPLAIN_TEMPLATES)
EXPLAIN_SYSTEM_PROMPT = "You are a helpful career assistant."
END_OF_TURN = "<|im_end|>"


def _listed(values: tuple[str, ...]) -> str:
    return ", ".join(values) or "none"


def _level_fact(f: PairFacts) -> str:
    if f.level_gap is None:
        return "not comparable (a level is not stated)"
    if f.level_gap == 0:
        return f"{f.item_level}, the member's level"
    return f"{f.item_level}, {_gap_text(f.level_gap)} ({f.member_level})"


def _location_fact(f: PairFacts) -> str:
    if f.location_fit == REMOTE_OPEN:
        return "remote; the member is open to remote work"
    if f.location_fit == REMOTE_CLOSED:
        return "remote; the member is not open to remote work"
    if f.location_fit == SAME_CITY:
        return f"on site in {f.item_city}, the member's city"
    return f"on site in {f.item_city or 'an unstated city'}; the member is in {f.member_city or 'an unstated city'}"


def _industry_fact(f: PairFacts, listed: Callable[[tuple[str, ...]], str]) -> str:
    if not f.item_industry:
        return "not stated"
    if f.industry_match:
        return f"{f.item_industry}, one of the member's industries"
    return f"{f.item_industry}, new to the member (the member's: {listed(f.member_industries)})"


def _activity_fact(f: PairFacts) -> str | None:
    a = f.activity
    if a is None or f.activity_relation == "other":
        return None
    at = f" at {a.company}" if a.company else ""
    where = (
        f"{f.activity_relation}" if f.activity_relation == "same company" else f"same industry, {a.industry}"
    )
    return f"{_ACTIVITY_TEXT[a.kind]} {a.item_title}{at} ({where})"


def _spoken_list(values: tuple[str, ...]) -> str:
    return join_words(values) or "none"


def _skill_facts(f: PairFacts, version: str) -> list[str]:
    if version == "explain-v2":
        return [
            f"- skills the member has: {_listed(f.shared_skills)}",
            f"- skills the member lacks: {_listed(f.missing_skills)}",
        ]
    required = len(f.shared_skills) + len(f.missing_skills)
    if not required:
        return ["- required skills: none listed"]
    if version in _ONE_LINE_SKILL_TEMPLATES and not (f.shared_skills and f.missing_skills):
        has_all = not f.missing_skills
        which = "has" if has_all else "lacks"
        every = "the one required" if required == 1 else f"all {required} required"
        listed = _spoken_list(f.shared_skills if has_all else f.missing_skills)
        if version == "explain-v4":
            return [f"- skills the member {which}: {every} ({listed})"]
        return [f"- skills the member {which}: {listed} ({every})"]
    return [
        f"- skills the member has ({len(f.shared_skills)} of {required} required): "
        f"{_spoken_list(f.shared_skills)}",
        f"- skills the member lacks ({len(f.missing_skills)} of {required} required): "
        f"{_spoken_list(f.missing_skills)}",
    ]


def render_facts(member: Member, item: Item, version: str = EXPLAIN_TEMPLATE_VERSION) -> str:
    """The facts block of an ``explain-v2``..``explain-v5`` prompt: what ``pair_facts`` computes, one
    fact a line."""
    f = pair_facts(member, item)
    listed = _listed if version == "explain-v2" else _spoken_list
    lines = [
        *_skill_facts(f, version),
        f"- level: {_level_fact(f)}",
        f"- location: {_location_fact(f)}",
        f"- industry: {_industry_fact(f, listed)}",
    ]
    activity = _activity_fact(f)
    if activity is not None:
        lines.append(f"- recent activity: {activity}")
    lines.append(f"- verdict: {verdict_of(f)}")
    return "Facts:\n" + "\n".join(lines) + "\n"


def _first_line(text: str) -> str:
    """The first line of a rendered block (``render_member``: headline, level, place; ``render_item``:
    kind, title, company, level, place, industry), with its newline."""
    return text.split("\n", 1)[0] + "\n"


def render_explain_request(member: Member, item: Item, version: str = EXPLAIN_TEMPLATE_VERSION) -> str:
    """The user message asking for a short explanation of why ``item`` suits ``member`` (or does not).

    ``explain-v5``/``explain-v4``: the item's title and company, the pair's facts (``render_facts``) and a
    short instruction. ``explain-v3``/``explain-v2``: the member's first profile line, the item's first
    line, the facts and the instruction. ``explain-v1``: the whole profile and item, no facts.
    """
    kind = _KIND_TEXT[item.kind]
    if version == "explain-v1":
        return (
            f"{render_member(member)}"
            f"{render_item(item)}"
            f"In two or three sentences, explain to this member why this {kind} does or does not suit them. "
            f"Mention their skills, level, location and industries where they matter."
        )
    if version not in SERVED_EXPLAIN_TEMPLATES:
        raise ValueError(
            f"unknown explain template {version!r}; known: {', '.join(SERVED_EXPLAIN_TEMPLATES)}"
        )
    if version in _ONE_LINE_SKILL_TEMPLATES:
        return (
            f"{kind.capitalize()}: {item.title or 'untitled'} at {item.company or 'unknown company'}\n"
            f"{render_facts(member, item, version)}"
            f'Start with the verdict, then explain it to the member as "you", using only these facts.'
        )
    return (
        f"{_first_line(render_member(member))}"
        f"{_first_line(render_item(item))}"
        f"{render_facts(member, item, version)}"
        f'Start with the verdict, then explain it to the member (as "you") in two or three sentences, '
        f"using only these facts."
    )


def explain_names(member: Member, item: Item, version: str = EXPLAIN_TEMPLATE_VERSION) -> tuple[str, ...]:
    """The words of the names the explain request states, once each: the required skills, the item's title
    and company, the cities, the industries, the recent activity's title and company. What the served
    generator keeps whole when it copies them (``copy_names`` of the generator model)."""
    f = pair_facts(member, item)
    activity = (f.activity.item_title, f.activity.company) if f.activity else ()
    names = (*f.shared_skills, *f.missing_skills, item.title, f.company, f.item_city, f.member_city)
    names += (f.item_industry, *f.member_industries, *activity)
    text = render_explain_request(member, item, version)
    words = (word.strip("()[]{},.;:!?\"'") for name in names for word in name.split())
    return tuple(dict.fromkeys(word for word in words if word and word in text))


def render_chat_prompt(user_text: str) -> str:
    """A one-turn ChatML conversation ending with the assistant cue (SmolLM2-Instruct's chat format).

    The markers are special tokens of the tokenizer, so the text tokenizes to the exact ids the model was
    instruction-tuned on; the generator's prompts are always built here.
    """
    return (
        f"<|im_start|>system\n{EXPLAIN_SYSTEM_PROMPT}<|im_end|>\n"
        f"<|im_start|>user\n{user_text}<|im_end|>\n"
        f"<|im_start|>assistant\n"
    )
