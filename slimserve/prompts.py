"""The scoring prompt template: the one place that turns a member and a candidate into model text.

The template is versioned. Its version is recorded in the serving bundle at export and checked by the
service, so a model is never served with a prompt it was not trained and exported with.
"""

from __future__ import annotations

from .schema import Activity, ActivityKind, Item, ItemKind, Member, Seniority

SCORING_TEMPLATE_VERSION = "scoring-v2"

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
    """One history line: what the member did with which item."""
    where = f" at {activity.company}" if activity.company else ""
    industry = f" ({activity.industry})" if activity.industry else ""
    return f"- {_ACTIVITY_TEXT[activity.kind]} {activity.item_title}{where}{industry}\n"


def render_member(member: Member) -> str:
    """Verbalize a member profile (360Brew style: short labelled lines)."""
    remote = "yes" if member.open_to_remote else "no"
    return (
        f"Member headline: {member.headline or 'none'}\n"
        f"Member skills: {_join(member.skills)}\n"
        f"Member seniority: {_SENIORITY_TEXT[member.seniority]}, "
        f"{member.years_experience:g} years of experience\n"
        f"Member location: {member.location or 'unknown'} (open to remote: {remote})\n"
        f"Member industries: {_join(member.industries)}\n"
    ) + _render_history(member.history)


def _render_history(history: tuple[Activity, ...]) -> str:
    if not history:
        return "Member recent activity: none\n"
    return "Member recent activity:\n" + "".join(render_activity(a) for a in history)


def render_item(item: Item) -> str:
    """Verbalize a candidate item."""
    kind = _KIND_TEXT[item.kind]
    remote = "remote" if item.remote else "on site"
    text = (
        f"Candidate {kind}: {item.title or 'untitled'} at {item.company or 'unknown company'}\n"
        f"Required skills: {_join(item.required_skills)}\n"
        f"Level: {_SENIORITY_TEXT[item.seniority]}\n"
        f"Location: {item.location or 'unknown'} ({remote})\n"
        f"Industry: {item.industry or 'unknown'}\n"
    )
    if item.description:
        text += f"Description: {item.description}\n"
    return text


def render_scoring_prompt(member: Member, item: Item) -> str:
    """The full scoring prompt: profile, candidate, question, answer cue."""
    kind = _KIND_TEXT[item.kind]
    return (
        f"{render_member(member)}"
        f"{render_item(item)}"
        f"Question: Will this member engage with this {kind}? Answer Yes or No.\n"
        f"Answer:"
    )


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
