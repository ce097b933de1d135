"""Is an explanation of a (member, item) pair grounded in the pair's facts? Pure Python (no torch).

Per explanation (``check_explanation``):

- **hallucination**: the text names a skill, company, city or industry of the dataset's vocabulary
  (``data.vocab``, and the skills that renamed pairs use, ``data.renaming``) that appears nowhere in the pair (member fields and history, item fields), or it
  claims the member has a skill they lack, or (when the member has every required skill) claims a gap:
  a clause with "you (would) need", lack, missing or "none of your/the required skills"; or it states a
  level gap the pair does not have: "N levels/steps above/below/up/down" other than the item's level
  minus the member's, or "your level" / "same level" / "matches yours" when the levels differ (a
  negated clause claims nothing). The fine-tuned teacher and its students wrote "It is a step up from
  director" for a director role offered to a director; or it states a location fit the pair does not
  have: remote or on site, "where you live" / ", your city", a move ("have to move"), the member open
  to remote work or not (judged for a remote item only). A fine-tuned teacher wrote "Remote work is
  possible, as you want" to a member not open to remote work; or it says the member engaged with
  (engaged with, looked at) or dismissed (dismissed, passed on) a title their history does not hold
  under that kind, company and industry: students shortened "Senior Python Developer" to "Senior
  Developer", and a teacher wrote "you passed on Accountant (internet)" for a finance role; or it writes
  a garbled copy of one of the pair's skills: a word in no field of the pair that starts with the same 4
  letters as a skill word and mostly matches it ("postgru" for postgresql, in a student's demo text);
  or it lists, beside one of the pair's skills (joined by a comma or "and"), a word that is in no field
  of the pair and that the explanation writer never uses ("none of bleiation and crm": a garble that
  lost the name's first letters);
- **coverage** (only when the pair shares a skill): the text names at least one truly shared skill,
  outside a clause that denies it;
- **verdict**: the first ``Strong fit`` / ``Partial fit`` / ``Weak fit`` of the first sentence, compared
  with the verdict the facts call for (``pair_facts.verdict_of``); no verdict is a disagreement, and so
  is a text that later states another verdict ("Strong fit ... Weak fit overall": it says both);
- **repetition**: the text states one sentence twice (compared without case and spacing; "It is in
  retail, your industry. [...] It is in retail, your industry."). Not a hallucination, but a fault a
  reader sees at once;
- **decision agreement** (when the scoring student's decision is given): ``Strong fit`` agrees with
  "engage", ``Weak fit`` with "not engage"; a ``Partial fit`` makes no yes/no claim and is left out,
  a missing verdict disagrees.

How a skill claim is read (a heuristic on clauses): the text is cut into clauses at sentence ends,
semicolons and contrast words (but, while, although, ...). A clause with a negation (not, no, none,
lack, missing, without, ...) claims nothing. Otherwise a skill is claimed when a second-person word
(you, your, ...) comes before it with no requirement word (need, requires, asks for, learn, ...) before
it, or when the clause speaks of sharing (shared, in common, match, both, ...) and has no requirement
word. Titles (the item's, the headline, the history's) are masked first, and a term that is one of the
pair's industries is not read as a skill. A few vocabulary words that are also plain English (``go``,
``excel``, ``lean``, ``planning``, ``react``, ``mentoring``, ``education``, ``energy``) count only for
coverage, never as a hallucination.

``summarize`` aggregates rates over held-out pairs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from functools import cached_property, lru_cache

from ..data import vocab
from ..data.renaming import HELD_OUT_SKILLS, RENAMING_SKILLS
from ..pair_facts import (
    OTHER_CITY,
    REMOTE_CLOSED,
    REMOTE_OPEN,
    SAME_CITY,
    VERDICTS,
    pair_facts,
    verdict_of,
)
from ..schema import ActivityKind, Item, Member

PLAIN_WORDS = frozenset({"go", "excel", "lean", "planning", "react", "mentoring", "education", "energy"})

_NEGATION = re.compile(
    r"\b(not|no|none|never|lack|lacks|lacking|missing|miss|misses|without|absent|gap|gaps)\b|n[\u2019']t\b"
)
_NEED = re.compile(
    r"\b(need|needs|needed|require|requires|required|requirement|requirements|ask|asks|asking|asked|"
    r"call|calls|want|wants|looking|learn|learning|pick up|build up|acquire|develop|gain)\b"
)
_POSSESSION = re.compile(r"\b(you|your|yours|you[\u2019']re|you[\u2019']ve|you[\u2019']d)\b")
_SHARING = re.compile(r"\b(shared|share|shares|in common|overlap|overlaps|overlapping|match|matches|both)\b")
_CLAUSE_SPLIT = re.compile(
    r"[.!?;\n]+|\b(?:but|while|whereas|although|though|however|yet|except)\b", re.IGNORECASE
)
_GAP = re.compile(
    r"\byou(?:[\u2019']d| would| will| still)? need\b|\b(?:lack|lacks|lacking|missing)\b|"
    r"\bnone of (?:your|the required|the) skills\b"
)
_LEVEL_STEPS = re.compile(
    r"\b(\d+|a|an|one|two|three|four|five|six) (?:levels?|steps?) (above|below|up|down|higher|lower)\b"
)
_SAME_LEVEL = re.compile(r"\b(?:your level|same level|matches yours)\b")
# A level fit denied ("It is senior, which you are not"): false when the levels are the same.
_DENIED_LEVEL = re.compile(r"\bwhich you are not\b(?! open)|\bnot (?:your|the same) level\b")
# A place that contradicts itself ("It is in Berlin, not Berlin"): false whatever the pair.
_PLACE_AND_NOT = re.compile(r"\bin ([A-Z][\w-]*(?: [A-Z][\w-]*)*), not \1\b")
# Location claims: (pattern, the fits of the pair where it holds (``pair_facts.location_fit``), read in a
# negated clause too). The member's view of remote work is judged only for a remote item.
_ON_SITE = (SAME_CITY, OTHER_CITY)
_LOCATION_CLAIMS = (
    (
        re.compile(r"\bis (?:fully )?remote\b|\bremote work is possible\b|\bcan be done remotely\b"),
        (REMOTE_OPEN, REMOTE_CLOSED),
        True,  # "Remote work is possible, as you do not want ...": the negation is not about remote
    ),
    (re.compile(r"\bon[ -]site\b"), _ON_SITE, False),
    (re.compile(r"\bwhere you live\b|, your (?:own )?city\b"), (SAME_CITY,), False),
    (re.compile(r"\b(?:have|need) to (?:move|relocate)\b"), (OTHER_CITY,), False),
    (
        re.compile(r"\bopen to (?:remote|that|it)\b|\bremote\b.*\b(?:which suits you|as you want)\b"),
        (REMOTE_OPEN, *_ON_SITE),
        False,
    ),
    (
        re.compile(r"\bnot open to remote\b|\bremote\b.*\bwhich you do not want\b"),
        (REMOTE_CLOSED, *_ON_SITE),
        True,
    ),
)
# "you <verb> (a) <Title> (role) (in <industry> | at <company> | (<industry>))": the writer's activity
# sentences; the title is the run of capitalised words.
_ACTIVITY = re.compile(
    r"\b(dismissed|passed on|engaged with|looked at)\s+(?:an?\s+)?([A-Z][\w&/+-]*(?:\s+[A-Z][\w&/+-]*)*)"
    r"(?:\s+role)?(?:\s+in\s+([^.;,()]+)|\s+at\s+([^.;,()]+)|\s*\(([^)]*)\))?"
)
_ACTIVITY_KINDS = {
    "dismissed": ActivityKind.DISMISSED,
    "passed on": ActivityKind.DISMISSED,
    "engaged with": ActivityKind.ENGAGED,
    "looked at": ActivityKind.ENGAGED,
}
_WORD = re.compile(r"[a-z][a-z0-9+#]*(?:[.-][a-z0-9+#]+)*")
# A garbled copy keeps the name's start: "postgru" for postgresql (4 letters, then most of the rest), or
# its first 3 letters and nearly all the rest: "typcript" for typescript. (prefix length, least ratio):
_NEAR_COPY_RULES = ((4, 0.6), (3, 0.8))
# The word after / before a list separator (", " or " and ") next to a skill.
_LIST_AFTER = re.compile(rf"(?:,\s*|\s+and\s+)({_WORD.pattern})")
_LIST_BEFORE = re.compile(rf"({_WORD.pattern})(?:,\s*|\s+and\s+)$")
_COUNT_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
_VERDICT = re.compile(r"\b(strong|partial|weak)\s+fit\b", re.IGNORECASE)
_FIRST_SENTENCE = re.compile(r"^[^.!?\n]*")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


@dataclass(frozen=True)
class _Vocabulary:
    skills: frozenset[str]
    companies: frozenset[str]
    cities: frozenset[str]
    industries: frozenset[str]
    pattern: re.Pattern

    @cached_property
    def words(self) -> frozenset[str]:
        """Every word of every term."""
        terms = self.skills | self.companies | self.cities | self.industries
        return frozenset(w for term in terms for w in _WORD.findall(term))

    def kinds(self, term: str) -> list[str]:
        return [
            kind
            for kind, terms in (
                ("skill", self.skills),
                ("company", self.companies),
                ("city", self.cities),
                ("industry", self.industries),
            )
            if term in terms
        ]


@lru_cache(maxsize=1)
def vocabulary() -> _Vocabulary:
    """The known skills, companies, cities and industries (lowercase) and one regex finding them, longest
    first (``social media`` is one mention, not also ``media``)."""
    skills = frozenset(s.lower() for s in (*vocab.SKILLS, *RENAMING_SKILLS, *HELD_OUT_SKILLS))
    companies = frozenset(c.lower() for c in vocab.COMPANIES)
    cities = frozenset(c.lower() for c in vocab.CITIES)
    industries = frozenset(i.lower() for i in vocab.INDUSTRIES)
    terms = sorted(skills | companies | cities | industries, key=lambda t: (-len(t), t))
    pattern = re.compile(
        r"(?<![\w-])(" + "|".join(re.escape(t) for t in terms) + r")(?![\w-])", re.IGNORECASE
    )
    return _Vocabulary(skills, companies, cities, industries, pattern)


def mentions(text: str) -> list[tuple[int, str]]:
    """(position, lowercase term) of every vocabulary term in ``text``."""
    return [(m.start(), m.group(1).lower()) for m in vocabulary().pattern.finditer(text)]


def _pair_text(member: Member, item: Item) -> str:
    parts = [member.headline, member.location, *member.skills, *member.industries]
    for activity in member.history:
        parts += [activity.item_title, activity.company, activity.industry]
    parts += [item.title, item.company, *item.required_skills, item.location, item.industry, item.description]
    return "\n".join(p for p in parts if p)


def _mask_titles(text: str, member: Member, item: Item) -> str:
    titles = {item.title, member.headline, *(a.item_title for a in member.history)}
    for title in sorted((t for t in titles if t), key=len, reverse=True):
        text = re.sub(re.escape(title), lambda m: "#" * len(m.group(0)), text, flags=re.IGNORECASE)
    return text


def clauses(text: str) -> list[str]:
    """The clauses a skill claim is read in (see the module docstring)."""
    return [c for c in _CLAUSE_SPLIT.split(text) if c and c.strip()]


def _claimed_and_named(text: str) -> tuple[set[str], set[str]]:
    """(skills the text claims the member has, skills named outside a negated clause)."""
    skills = vocabulary().skills
    claimed: set[str] = set()
    named: set[str] = set()
    for clause in clauses(text):
        lower = clause.lower()
        found_all = mentions(lower)
        for pos, term in found_all:  # cue words inside a term ("machine learning") are not cues
            lower = lower[:pos] + "#" * len(term) + lower[pos + len(term) :]
        if _NEGATION.search(lower):
            continue
        found = [(pos, term) for pos, term in found_all if term in skills]
        named |= {term for _, term in found}
        needs = [m.start() for m in _NEED.finditer(lower)]
        first_need = needs[0] if needs else math.inf
        sharing = _SHARING.search(lower) is not None and not needs
        owners = [m.start() for m in _POSSESSION.finditer(lower)]
        for pos, term in found:
            if sharing or (owners and owners[0] < pos and pos < first_need):
                claimed.add(term)
    return claimed, named


def parse_verdict(text: str) -> str | None:
    """``Strong fit``, ``Partial fit`` or ``Weak fit``: the first one in the first sentence (None: none)."""
    first = _FIRST_SENTENCE.match(text.strip())
    found = _VERDICT.search(first.group(0) if first else "")
    return None if found is None else f"{found.group(1).capitalize()} fit"


@dataclass
class GroundingCheck:
    """What one explanation gets right and wrong about its pair."""

    foreign_terms: list[str]  # vocabulary terms belonging to neither member nor item ("kind:term")
    false_skill_claims: list[str]  # skills the text says the member has, and the member lacks
    shared_skills: list[str]  # the pair's truly shared skills
    named_shared_skills: list[str]  # those the text names
    verdict: str | None  # the text's verdict
    expected_verdict: str  # the facts' verdict
    decision: bool | None = None  # the scoring student's decision (engage?), when given
    other_verdicts: list[str] = field(default_factory=list)  # other verdicts the text states later
    false_gap_claims: list[str] = field(default_factory=list)  # clauses claiming a gap a full match lacks
    repeated_sentences: list[str] = field(default_factory=list)  # sentences stated twice
    false_level_claims: list[str] = field(default_factory=list)  # clauses stating a level gap it lacks
    false_location_claims: list[str] = field(default_factory=list)  # clauses stating a location fit it lacks
    false_activity_claims: list[str] = field(default_factory=list)  # activities not in the member's history
    garbled_names: list[str] = field(default_factory=list)  # garbled skill copies ("word~skill")
    unknown_list_items: list[str] = field(default_factory=list)  # unknown words listed beside a skill

    @property
    def hallucinated(self) -> bool:
        return bool(
            self.foreign_terms
            or self.false_skill_claims
            or self.false_gap_claims
            or self.false_level_claims
            or self.false_location_claims
            or self.false_activity_claims
            or self.garbled_names
            or self.unknown_list_items
        )

    @property
    def covered(self) -> bool | None:
        """Names a shared skill (None when the pair shares none)."""
        return bool(self.named_shared_skills) if self.shared_skills else None

    @property
    def verdict_agrees(self) -> bool:
        return self.verdict == self.expected_verdict and not self.other_verdicts

    @property
    def decision_agrees(self) -> bool | None:
        """Verdict vs the scorer's decision (None: no decision given, or a ``Partial fit`` verdict; a
        text stating two verdicts disagrees)."""
        if self.decision is None:
            return None
        if self.other_verdicts:
            return False
        if self.verdict == "Partial fit":
            return None
        return self.verdict == ("Strong fit" if self.decision else "Weak fit")

    def problems(self) -> list[str]:
        """What the text gets wrong, one phrase each (empty: every checked fact holds)."""
        found = [f"names {term.split(':', 1)[1]!r}, of neither side" for term in self.foreign_terms]
        found += [f"claims the member has {skill!r}" for skill in self.false_skill_claims]
        found += [f"states {claim!r}" for claim in self.false_gap_claims + self.false_level_claims]
        found += [f"states {claim!r}" for claim in self.false_location_claims + self.false_activity_claims]
        found += [f"writes {pair.split('~')[0]!r} for {pair.split('~')[1]!r}" for pair in self.garbled_names]
        found += [
            f"lists {word!r} among the skills, a name of neither side" for word in self.unknown_list_items
        ]
        if not self.verdict_agrees:
            found.append(f"verdict {self.verdict or 'missing'}, the facts say {self.expected_verdict}")
        return found

    def as_dict(self) -> dict:
        return {
            "foreign_terms": self.foreign_terms,
            "false_skill_claims": self.false_skill_claims,
            "false_gap_claims": self.false_gap_claims,
            "false_level_claims": self.false_level_claims,
            "false_location_claims": self.false_location_claims,
            "false_activity_claims": self.false_activity_claims,
            "garbled_names": self.garbled_names,
            "unknown_list_items": self.unknown_list_items,
            "named_shared_skills": self.named_shared_skills,
            "verdict": self.verdict,
            "expected_verdict": self.expected_verdict,
            "other_verdicts": self.other_verdicts,
            "decision": self.decision,
        }


def check_explanation(member: Member, item: Item, text: str, decision: bool | None = None) -> GroundingCheck:
    """Check one explanation of ``(member, item)``; ``decision`` is the scoring student's (engage?)."""
    vocabulary_ = vocabulary()
    facts = pair_facts(member, item)
    pair_text = _pair_text(member, item)
    own = {term for _, term in mentions(pair_text)}
    foreign = sorted(
        {
            f"{vocabulary_.kinds(term)[0]}:{term}"
            for _, term in mentions(text)
            if term not in own and term not in PLAIN_WORDS
        }
    )
    masked = _mask_titles(text, member, item)
    claimed, named = _claimed_and_named(masked)
    owned = {s.lower() for s in member.skills}
    industries = {
        i.lower() for i in (item.industry, *member.industries, *(a.industry for a in member.history))
    }
    false_claims = sorted(claimed - owned - industries - PLAIN_WORDS)
    shared = [s.lower() for s in facts.shared_skills]
    verdict = parse_verdict(text)
    garbled = garbled_names(text, member, item, pair_text)
    miscopied = {pair.split("~")[0] for pair in garbled}
    return GroundingCheck(
        foreign_terms=foreign,
        false_skill_claims=false_claims,
        shared_skills=shared,
        named_shared_skills=[s for s in shared if s in named],
        verdict=verdict,
        expected_verdict=verdict_of(facts),
        decision=decision,
        other_verdicts=sorted({f"{v.capitalize()} fit" for v in _VERDICT.findall(text)} - {verdict}),
        false_gap_claims=_false_gaps(masked) if facts.full_match else [],
        repeated_sentences=repeated_sentences(text),
        false_level_claims=false_level_claims(masked, facts.level_gap),
        false_location_claims=false_location_claims(masked, facts.location_fit),
        false_activity_claims=false_activity_claims(text, member),
        garbled_names=garbled,
        unknown_list_items=[
            w for w in unknown_list_items(text, member, item, pair_text) if w not in miscopied
        ],
    )


def repeated_sentences(text: str) -> list[str]:
    """The sentences ``text`` states more than once (lower-cased, spacing collapsed), in order."""
    seen: set[str] = set()
    repeated: list[str] = []
    for sentence in _SENTENCE_END.split(text):
        key = " ".join(sentence.lower().split())
        if key and key in seen and key not in repeated:
            repeated.append(key)
        seen.add(key)
    return repeated


def false_level_claims(text: str, gap: int | None) -> list[str]:
    """The clauses of ``text`` that state a level gap other than ``gap`` (item level minus the member's;
    None: not comparable, so any stated gap is false), or deny a fit when the levels are the same."""
    false = []
    for clause in clauses(text):
        lower = clause.lower()
        if gap == 0 and _DENIED_LEVEL.search(lower):
            false.append(clause.strip())
            continue
        if _NEGATION.search(lower):
            continue
        stated = [
            (int(count) if count.isdigit() else _COUNT_WORDS[count])
            * (1 if direction in ("above", "up", "higher") else -1)
            for count, direction in _LEVEL_STEPS.findall(lower)
        ]
        if not stated and _SAME_LEVEL.search(lower):
            stated = [0]
        if any(claim != gap for claim in stated):
            false.append(clause.strip())
    return false


def false_location_claims(text: str, fit: str) -> list[str]:
    """The clauses of ``text`` that state a location fit other than ``fit`` (``pair_facts.location_fit``):
    remote or on site, in the member's city, a move, the member open to remote work or not; or a place
    that contradicts itself ("in Berlin, not Berlin")."""
    false = []
    for clause in clauses(text):
        lower = clause.lower()
        negated = _NEGATION.search(lower) is not None
        if _PLACE_AND_NOT.search(clause) or any(
            pattern.search(lower) and fit not in holds and (in_negated or not negated)
            for pattern, holds, in_negated in _LOCATION_CLAIMS
        ):
            false.append(clause.strip())
    return false


def false_activity_claims(text: str, member: Member) -> list[str]:
    """The activities ``text`` says the member engaged with or dismissed ("You recently looked at a
    Senior Developer role") that the member's history lacks: no activity of that title and kind, with
    the company or industry the text attaches to it."""
    false = []
    for clause in clauses(text):
        if _NEGATION.search(clause.lower()):
            continue
        for claim in _ACTIVITY.finditer(clause):
            verb, title, industry_in, company, industry_paren = claim.groups(default="")
            industry = (industry_in or industry_paren).strip().lower()
            if not any(
                a.item_title.lower() == title.lower()
                and a.kind is _ACTIVITY_KINDS[verb]
                and (not industry or industry == a.industry.lower())
                and (not company or company.strip().lower() == a.company.lower())
                for a in member.history
            ):
                false.append(claim.group(0))
    return false


def _near_copy(word: str, skill: str) -> bool:
    """``word`` starts like ``skill`` and keeps most of it (``_NEAR_COPY_RULES``)."""
    least = [ratio for prefix, ratio in _NEAR_COPY_RULES if word[:prefix] == skill[:prefix]]
    return bool(least) and SequenceMatcher(None, word, skill).ratio() >= min(least)


def garbled_names(text: str, member: Member, item: Item, pair_text: str | None = None) -> list[str]:
    """Words of ``text`` that are garbled copies of one of the pair's skills ("postgru" for postgresql):
    in no field of the pair, sharing the skill word's first 4 letters and most of the rest (or its first 3
    and nearly all the rest: "typcript" for typescript), and neither word a prefix of the other
    ("pythonic", "market" for marketing are not). As "word~skill word".
    ``pair_text``: the pair's fields as ``check_explanation`` already joined them (None: joined here)."""
    pair = _pair_words(member, item, pair_text)
    skills = sorted(
        {w for s in (*member.skills, *item.required_skills) for w in _WORD.findall(s.lower()) if len(w) >= 4}
    )
    garbled = []
    for word in sorted(set(_WORD.findall(text.lower())) - pair):
        for skill in skills:
            if word.startswith(skill) or skill.startswith(word):
                continue
            if _near_copy(word, skill):
                garbled.append(f"{word}~{skill}")
                break
    return garbled


def _pair_words(member: Member, item: Item, pair_text: str | None = None) -> set[str]:
    """The words of the pair's fields (lowercase); ``pair_text``: those fields already joined."""
    return set(_WORD.findall((pair_text or _pair_text(member, item)).lower()))


@lru_cache(maxsize=1)
def writer_words() -> frozenset[str]:
    """Every word the explanation writer (``data.explanations``) uses over a small synthetic dataset's
    pairs, names included: the words a list beside a skill may hold besides the pair's own."""
    from ..data.explanations import explanation_rng, write_explanation
    from ..data.synth import SynthConfig, synthesize

    dataset, _ = synthesize(SynthConfig(members=60, items=60, seed=0))
    words: set[str] = set()
    for seed in range(4):
        for row in dataset.interactions:
            member, item = dataset.members[row.member_id], dataset.items[row.item_id]
            words.update(
                _WORD.findall(write_explanation(member, item, explanation_rng(seed, member, item)).lower())
            )
    return frozenset(words)


@lru_cache(maxsize=1)
def lexicon() -> frozenset[str]:
    """Plain words: those the packaged SmolLM2 tokenizer spells as one token after a space (" other",
    " while"). A garbled or invented name is rarely one ("bleiation" is several)."""
    import json

    from ..models.teacher import default_tokenizer_file

    vocab = json.loads(default_tokenizer_file().read_text(encoding="utf-8"))["model"]["vocab"]
    return frozenset(token[1:].lower() for token in vocab if token[:1] == "\u0120" and token[1:].isalpha())


@lru_cache(maxsize=1)
def _known_words() -> frozenset[str]:
    """The words a skill list may hold besides the pair's: the writer's, the plain ones, the dataset's names."""
    return writer_words() | lexicon() | vocabulary().words


def unknown_list_items(text: str, member: Member, item: Item, pair_text: str | None = None) -> list[str]:
    """Words of ``text`` listed beside one of the pair's skills ("A, B", "A and B") that are in no field
    of the pair, that the writer never uses (``writer_words``), that are no plain word (``lexicon``) and
    no name of the dataset (those are ``foreign_terms``): "bleiation" in "none of bleiation and crm"."""
    lower = text.lower()
    pair, known = _pair_words(member, item, pair_text), _known_words()
    skills = sorted({s.lower() for s in (*member.skills, *item.required_skills) if s}, key=len, reverse=True)
    unknown: list[str] = []
    for skill in skills:
        for found in re.finditer(rf"(?<![\w-]){re.escape(skill)}(?![\w-])", lower):
            after = _LIST_AFTER.match(lower, found.end())
            before = _LIST_BEFORE.search(lower[: found.start()])
            for neighbour in (after, before):
                word = neighbour.group(1) if neighbour else None
                if word and word not in pair and word not in known and word not in unknown:
                    unknown.append(word)
    return unknown


def _false_gaps(text: str) -> list[str]:
    """The clauses of ``text`` that claim a missing skill (for a pair that misses none)."""
    return [c.strip() for c in clauses(text) if _GAP.search(c.lower())]


def _rate(values: Iterable[bool | None]) -> tuple[float, int]:
    counted = [v for v in values if v is not None]
    return (sum(counted) / len(counted) if counted else float("nan")), len(counted)


@dataclass
class GroundingSummary:
    """Rates over explanations of held-out pairs (NaN when nothing was counted)."""

    pairs: int
    hallucination_rate: float
    coverage: float  # over the pairs that share a skill
    coverage_pairs: int
    verdict_agreement: float
    decision_agreement: float  # over the pairs with a decision and a Strong/Weak or missing verdict
    decision_pairs: int
    verdicts: dict[str, int] = field(default_factory=dict)  # how often each verdict was written
    repetition_rate: float = float("nan")  # share stating a sentence twice

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def summarize(checks: Sequence[GroundingCheck]) -> GroundingSummary:
    """Aggregate rates of ``checks`` (see ``GroundingSummary``)."""
    hallucination, _ = _rate(c.hallucinated for c in checks)
    coverage, coverage_pairs = _rate(c.covered for c in checks)
    verdict, _ = _rate(c.verdict_agrees for c in checks)
    decision, decision_pairs = _rate(c.decision_agrees for c in checks)
    verdicts = {v: sum(c.verdict == v for c in checks) for v in VERDICTS}
    verdicts["none"] = sum(c.verdict is None for c in checks)
    repetition, _ = _rate(bool(c.repeated_sentences) for c in checks)
    return GroundingSummary(
        len(checks),
        hallucination,
        coverage,
        coverage_pairs,
        verdict,
        decision,
        decision_pairs,
        verdicts,
        repetition_rate=repetition,
    )


def evaluate_grounding(
    pairs: Sequence[tuple[Member, Item]],
    texts: Sequence[str],
    decisions: Sequence[bool | None] | None = None,
) -> tuple[GroundingSummary, list[GroundingCheck]]:
    """Check every explanation of ``pairs`` and aggregate (``decisions``: the scorer's, per pair)."""
    decisions = [None] * len(pairs) if decisions is None else list(decisions)
    checks = [
        check_explanation(member, item, text, decision)
        for (member, item), text, decision in zip(pairs, texts, decisions, strict=True)
    ]
    return summarize(checks), checks
