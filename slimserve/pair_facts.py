"""The observable facts of a (member, item) pair and the verdict they call for. Pure Python.

Shared by the build (the written explanations of ``data.explanations``, the grounding evaluation) and
the reasoning service (the ``explain-v2`` and ``explain-v3`` prompts state these facts, so the generator explains what was
computed instead of computing it).

**Facts** (``pair_facts``): the item's required skills the member has (shared) and lacks (missing), the
level gap (item level minus member level, in steps of ``Seniority``), the location fit (same city, remote
and the member is open to remote, remote but the member is not, another city), whether the item's industry
is one of the member's, and the member's most relevant recent activity (the most recent history entry at
the item's company, else in the item's industry, else the most recent entry).

**Verdict** (``verdict_of``). Points: 3 x the share of required skills the member has (1.5 when the item
lists none), plus 1 when the level is at most one step away (or unknown), plus 1 when the location works
(same city, or remote and the member is open to remote):

- ``Strong fit``: 4 points or more (two of three skills with level and location fitting, or every skill
  with one of them);
- ``Weak fit``: under 2 points (no skill shared and at most one of level or location, or one of three
  skills and neither);
- ``Partial fit``: everything else.

Industry and activity are context; they do not move the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import Activity, Item, ItemKind, Member, Seniority

VERDICTS = ("Strong fit", "Partial fit", "Weak fit")
_LEVELS = [level for level in Seniority if level is not Seniority.UNSPECIFIED]
_LEVEL_TEXT = {
    Seniority.INTERN: "intern",
    Seniority.ENTRY: "entry-level",
    Seniority.MID: "mid-level",
    Seniority.SENIOR: "senior",
    Seniority.LEAD: "lead",
    Seniority.DIRECTOR: "director",
    Seniority.EXECUTIVE: "executive",
}
_KIND_TEXT = {
    ItemKind.UNSPECIFIED: "role",
    ItemKind.JOB: "job",
    ItemKind.COURSE: "course",
    ItemKind.POST: "post",
}

# Location fit of a pair.
SAME_CITY, REMOTE_OPEN, REMOTE_CLOSED, OTHER_CITY = (
    "same city",
    "remote, open",
    "remote, not open",
    "other city",
)


@dataclass(frozen=True)
class PairFacts:
    """What a (member, item) pair's fields say, and nothing else."""

    shared_skills: tuple[str, ...]  # required skills the member has (item order)
    missing_skills: tuple[str, ...]  # required skills the member lacks (item order)
    level_gap: int | None  # item level - member level in steps (None: either unspecified)
    member_level: str
    item_level: str
    location_fit: str  # SAME_CITY, REMOTE_OPEN, REMOTE_CLOSED or OTHER_CITY
    member_city: str
    item_city: str
    industry_match: bool
    item_industry: str
    member_industries: tuple[str, ...]
    company: str
    kind: str  # "job", "course", ...
    activity: Activity | None  # the most relevant recent history entry
    activity_relation: str  # "same company", "same industry" or "other"

    @property
    def skill_share(self) -> float | None:
        """Shared / required skills (None when the item lists none)."""
        required = len(self.shared_skills) + len(self.missing_skills)
        return len(self.shared_skills) / required if required else None

    @property
    def full_match(self) -> bool:
        """The member has every required skill (and the item requires at least one)."""
        return bool(self.shared_skills) and not self.missing_skills

    @property
    def location_works(self) -> bool:
        return self.location_fit in (SAME_CITY, REMOTE_OPEN)


def join_words(values) -> str:
    """``A``, ``A and B``, ``A, B and C``: a list as the written explanations say it (and the
    ``explain-v3`` prompt states it, so the generator copies a span instead of re-punctuating a list)."""
    values = list(values)
    if len(values) <= 1:
        return "".join(values)
    return ", ".join(values[:-1]) + " and " + values[-1]


def indefinite_article(word: str) -> str:
    """``an`` before a vowel letter, else ``a`` ("an Accountant", "a Backend Developer")."""
    return "an" if word[:1].lower() in "aeiou" else "a"


def level_gap(member: Seniority, item: Seniority) -> int | None:
    """Item level minus member level in ``Seniority`` steps (None when either is unspecified)."""
    if Seniority.UNSPECIFIED in (member, item):
        return None
    return _LEVELS.index(item) - _LEVELS.index(member)


def location_fit(member: Member, item: Item) -> str:
    """``SAME_CITY``, ``REMOTE_OPEN``, ``REMOTE_CLOSED`` or ``OTHER_CITY``."""
    if item.remote:
        return REMOTE_OPEN if member.open_to_remote else REMOTE_CLOSED
    if member.location and member.location == item.location:
        return SAME_CITY
    return OTHER_CITY


def _relevant_activity(member: Member, item: Item) -> tuple[Activity | None, str]:
    history = [a for a in member.history if a.item_title]
    for activity in history:
        if item.company and activity.company == item.company:
            return activity, "same company"
    for activity in history:
        if item.industry and activity.industry == item.industry:
            return activity, "same industry"
    return (history[0], "other") if history else (None, "other")


def pair_facts(member: Member, item: Item) -> PairFacts:
    """The observable facts of a pair (see the module docstring)."""
    owned = set(member.skills)
    required = [s for s in dict.fromkeys(item.required_skills) if s]
    activity, relation = _relevant_activity(member, item)
    return PairFacts(
        shared_skills=tuple(s for s in required if s in owned),
        missing_skills=tuple(s for s in required if s not in owned),
        level_gap=level_gap(member.seniority, item.seniority),
        member_level=_LEVEL_TEXT.get(member.seniority, ""),
        item_level=_LEVEL_TEXT.get(item.seniority, ""),
        location_fit=location_fit(member, item),
        member_city=member.location,
        item_city=item.location,
        industry_match=bool(item.industry) and item.industry in member.industries,
        item_industry=item.industry,
        member_industries=tuple(i for i in member.industries if i),
        company=item.company,
        kind=_KIND_TEXT[item.kind],
        activity=activity,
        activity_relation=relation,
    )


def verdict_points(facts: PairFacts) -> float:
    """The points the verdict is read from (see the module docstring)."""
    share = facts.skill_share
    level_close = facts.level_gap is None or abs(facts.level_gap) <= 1
    return (1.5 if share is None else 3 * share) + float(level_close) + float(facts.location_works)


def verdict_of(facts: PairFacts) -> str:
    """``Strong fit``, ``Partial fit`` or ``Weak fit`` by the rule in the module docstring."""
    points = verdict_points(facts)
    if points >= 4 - 1e-9:
        return "Strong fit"
    if points < 2 - 1e-9:
        return "Weak fit"
    return "Partial fit"


def verdict_for(member: Member, item: Item) -> str:
    """The verdict the facts of ``(member, item)`` call for."""
    return verdict_of(pair_facts(member, item))
