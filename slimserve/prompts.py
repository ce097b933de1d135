"""The scoring prompt template: the one place that turns a member and a candidate into model text.

The template is versioned. Its version is recorded in the serving bundle at export and checked by the
service, so a model is never served with a prompt it was not trained and exported with.
"""

from __future__ import annotations

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


_LEVELS = [level for level in Seniority if level is not Seniority.UNSPECIFIED]


def _level_match(member: Seniority, item: Seniority) -> str:
    if Seniority.UNSPECIFIED in (member, item):
        return "level unknown"
    gap = _LEVELS.index(item) - _LEVELS.index(member)
    if gap == 0:
        return "same level"
    steps = "1 level" if abs(gap) == 1 else f"{abs(gap)} levels"
    return f"{steps} {'above' if gap > 0 else 'below'} the member"


def _location_match(member: Member, item: Item) -> str:
    if item.remote:
        return "remote, member open to remote" if member.open_to_remote else "remote, member not open to it"
    if member.location and member.location == item.location:
        return "same city"
    return "other city"


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
        f"{_level_match(member.seniority, item.seniority)}; {_location_match(member, item)}; {industry}\n"
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
# trained on.
EXPLAIN_TEMPLATE_VERSION = "explain-v1"
EXPLAIN_SYSTEM_PROMPT = "You are a helpful career assistant."
END_OF_TURN = "<|im_end|>"


def render_explain_request(member: Member, item: Item) -> str:
    """The user message asking for a short explanation of why `item` suits `member` (or does not)."""
    kind = _KIND_TEXT[item.kind]
    return (
        f"{render_member(member)}"
        f"{render_item(item)}"
        f"In two or three sentences, explain to this member why this {kind} does or does not suit them. "
        f"Mention their skills, level, location and industries where they matter."
    )


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
