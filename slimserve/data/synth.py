"""The synthetic dataset: members, jobs and labels from a hidden, text-learnable preference model.

logit = w_skill * skill overlap + w_seniority * seniority fit + w_location * (same city or remote fit)
        + w_industry * industry affinity + w_taste * (company type == member's hidden taste) + bias
label ~ Bernoulli(sigmoid(logit + noise)). The taste is never written down; it shows only through the
member's history, drawn from the same model. The noise-free probability is the oracle: its AUC against
the sampled labels is the best any model can reach (the Bayes-optimal AUC stored in the manifest).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from pydantic import Field

from ..evaluation.metrics import auc
from ..pair_facts import indefinite_article
from ..schema import Activity, ActivityKind, Item, ItemKind, Member, Seniority
from ..settings import Settings
from . import vocab
from .records import Dataset, Interaction, write_dataset
from .splits import SPLIT_NAMES, Example, assign_members

GENERATOR_VERSION = 1
_LEVELS = tuple(s for s in Seniority if s is not Seniority.UNSPECIFIED)
_MEMBER_LEVEL_WEIGHTS = (0.04, 0.18, 0.28, 0.26, 0.14, 0.07, 0.03)
_ITEM_LEVEL_WEIGHTS = (0.05, 0.2, 0.3, 0.25, 0.12, 0.06, 0.02)
_YEARS = {0: (0, 1), 1: (0, 2), 2: (2, 5), 3: (5, 10), 4: (8, 15), 5: (12, 20), 6: (15, 25)}
_HEADLINE_PREFIX = ("Intern ", "Junior ", "", "Senior ", "Lead ", "Principal ", "Chief ")
_START_TIME = 1_700_000_000


class SynthConfig(Settings):
    """How many members and items to make, and the weights of the hidden preference model."""

    env_prefix: ClassVar[str] = "SLIMSERVE_SYNTH_"

    seed: int = Field(0, description="random seed: the same seed writes identical files")
    members: int = Field(1200, ge=1, description="number of members")
    items: int = Field(600, ge=1, description="number of job items")
    impressions_per_member: int = Field(8, ge=1, description="labelled candidates shown to each member")
    history_len: int = Field(4, ge=0, description="past activities shown in each member's profile")
    history_engaged_fraction: float = Field(
        0.75, ge=0, le=1, description="share of history entries that are engagements (the rest dismissals)"
    )
    relevant_fraction: float = Field(
        0.6, ge=0, le=1, description="share of candidates drawn from the member's own job family"
    )
    remote_fraction: float = Field(0.25, ge=0, le=1, description="share of items that are remote")
    open_to_remote_fraction: float = Field(0.5, ge=0, le=1, description="share of members open to remote")
    w_skill: float = Field(4.0, description="weight of the fraction of required skills the member has")
    w_seniority: float = Field(2.0, description="weight of seniority fit (1 same level, -1 far apart)")
    w_location: float = Field(1.2, description="weight of same city, or remote item for a remote-open member")
    w_industry: float = Field(0.8, description="weight of the item's industry being one of the member's")
    w_taste: float = Field(3.0, description="weight of the item's company type matching the hidden taste")
    bias: float = Field(-4.3, description="constant added to every logit")
    noise: float = Field(0.5, ge=0, description="std of Gaussian noise added to the logit before sampling")
    split_fractions: tuple[float, float, float] = Field(
        (0.7, 0.1, 0.2), description="train/validation/test member fractions the manifest reports on"
    )


def seniority_fit(member: Seniority, item: Seniority) -> float:
    """1 at the same level, 0.5 per level apart less, floored at -1 (0 when either is unspecified)."""
    if Seniority.UNSPECIFIED in (member, item):
        return 0.0
    return max(-1.0, 1.0 - abs(_LEVELS.index(member) - _LEVELS.index(item)) / 2)


def oracle_logit(config: SynthConfig, member: Member, item: Item, preferred_type: str) -> float:
    """The noise-free logit of the hidden model for one member-item pair."""
    required = set(item.required_skills)
    skill = len(required & set(member.skills)) / len(required) if required else 0.0
    location = member.location == item.location or (item.remote and member.open_to_remote)
    industry = item.industry in member.industries
    taste = vocab.company_type(item.company) == preferred_type
    return (
        config.w_skill * skill
        + config.w_seniority * seniority_fit(member.seniority, item.seniority)
        + config.w_location * float(location)
        + config.w_industry * float(industry)
        + config.w_taste * float(taste)
        + config.bias
    )


def oracle_probabilities(examples: Iterable, manifest: dict[str, Any]) -> np.ndarray:
    """Noise-free P(label = 1) of examples (anything with ``.member`` and ``.item``) under a manifest."""
    config = SynthConfig(**manifest["config"])
    tastes = manifest["hidden"]["preferred_company_type"]
    logits = [oracle_logit(config, e.member, e.item, tastes[e.member.id]) for e in examples]
    return 1.0 / (1.0 + np.exp(-np.asarray(logits, dtype=np.float64)))


def _make_item(rng: random.Random, config: SynthConfig, index: int, width: int) -> tuple[Item, str]:
    family = rng.choice(vocab.FAMILIES)
    title = rng.choice(family.titles)
    company = rng.choice(sorted(vocab.COMPANIES))
    kind = vocab.company_type(company)
    industry = rng.choice(family.industries) if rng.random() < 0.8 else rng.choice(vocab.INDUSTRIES)
    phrase = rng.choice(vocab.TYPE_PHRASES[kind])
    item = Item(
        id=f"job-{index:0{width}d}",
        kind=ItemKind.JOB,
        title=title,
        company=company,
        required_skills=tuple(rng.sample(family.skills, 3)),
        seniority=rng.choices(_LEVELS, _ITEM_LEVEL_WEIGHTS)[0],
        location=rng.choice(vocab.CITIES),
        remote=rng.random() < config.remote_fraction,
        industry=industry,
        description=f"{phrase} hiring {indefinite_article(title)} {title.lower()}.",
    )
    return item, family.name


def _make_member(rng: random.Random, config: SynthConfig, index: int, width: int) -> tuple[Member, str, str]:
    family = rng.choice(vocab.FAMILIES)
    title = rng.choice(family.titles)
    level = rng.choices(range(len(_LEVELS)), _MEMBER_LEVEL_WEIGHTS)[0]
    skills = rng.sample(family.skills, 4)
    if rng.random() < 0.3:
        extra = rng.choice(rng.choice(vocab.FAMILIES).skills)
        skills += [extra] if extra not in skills else []
    industries = rng.sample(family.industries, rng.choice((1, 2)))
    low, high = _YEARS[level]
    member = Member(
        id=f"m-{index:0{width}d}",
        headline=f"{_HEADLINE_PREFIX[level]}{title} in {industries[0]}",
        skills=tuple(skills),
        seniority=_LEVELS[level],
        years_experience=float(rng.randint(low, high)),
        location=rng.choice(vocab.CITIES),
        industries=tuple(industries),
        open_to_remote=rng.random() < config.open_to_remote_fraction,
    )
    return member, family.name, rng.choice(vocab.COMPANY_TYPES)


def _candidates(
    rng, count: int, own: list[str], everything: list[str], exclude: set, share: float
) -> list[str]:
    """``count`` distinct item ids: each from the member's family with probability ``share``."""
    chosen: list[str] = []
    own_left = [i for i in own if i not in exclude]
    limit = min(count, len(everything) - len(exclude))
    while len(chosen) < limit:
        item_id = rng.choice(own_left if own_left and rng.random() < share else everything)
        if item_id not in exclude:
            exclude.add(item_id)
            chosen.append(item_id)
            if own_left and item_id in own_left:
                own_left.remove(item_id)
    return chosen


def _label(rng: random.Random, config: SynthConfig, member: Member, item: Item, taste: str) -> int:
    logit = oracle_logit(config, member, item, taste) + rng.gauss(0.0, config.noise)
    return int(rng.random() < 1.0 / (1.0 + math.exp(-logit)))


def _history(rng, config, member, items: list[Item], taste: str) -> tuple[Activity, ...]:
    """Past activity from the same model: engagements first picked, then dismissals, shuffled in time."""
    engaged, dismissed = [], []
    for item in items:
        (engaged if _label(rng, config, member, item, taste) else dismissed).append(item)
    want = round(config.history_len * config.history_engaged_fraction)
    chosen = [(i, ActivityKind.ENGAGED) for i in engaged[:want]]
    chosen += [(i, ActivityKind.DISMISSED) for i in dismissed[: config.history_len - len(chosen)]]
    chosen += [(i, ActivityKind.ENGAGED) for i in engaged[want : want + config.history_len - len(chosen)]]
    rng.shuffle(chosen)
    return tuple(Activity(i.title, i.company, i.industry, kind) for i, kind in chosen)


def synthesize(config: SynthConfig) -> tuple[Dataset, dict[str, Any]]:
    """A reproducible synthetic dataset and its manifest (counts, positive rates, Bayes-optimal AUC)."""
    rng = random.Random(config.seed)
    items_and_families = [_make_item(rng, config, i, len(str(config.items))) for i in range(config.items)]
    items = {item.id: item for item, _ in items_and_families}
    by_family: dict[str, list[str]] = {}
    for item, family in items_and_families:
        by_family.setdefault(family, []).append(item.id)
    everything = list(items)
    members: dict[str, Member] = {}
    tastes: dict[str, str] = {}
    interactions: list[Interaction] = []
    for index in range(config.members):
        member, family, taste = _make_member(rng, config, index, len(str(config.members)))
        own, seen = by_family.get(family, []), set()
        past = _candidates(rng, 4 * config.history_len, own, everything, seen, config.relevant_fraction)
        history = _history(rng, config, member, [items[i] for i in past], taste)
        member = dataclasses.replace(member, history=history)
        members[member.id], tastes[member.id] = member, taste
        shown = _candidates(
            rng, config.impressions_per_member, own, everything, seen, config.relevant_fraction
        )
        clock = _START_TIME + rng.randint(0, 90 * 86400)
        for item_id in shown:
            clock += rng.randint(60, 86400)
            label = _label(rng, config, member, items[item_id], taste)
            interactions.append(Interaction(member.id, item_id, label, clock))
    dataset = Dataset(members, items, interactions)
    return dataset, build_manifest(dataset, config, tastes)


def build_manifest(dataset: Dataset, config: SynthConfig, tastes: dict[str, str]) -> dict[str, Any]:
    """Seed, config, counts, positive rates and Bayes-optimal AUC per split, and the hidden tastes."""
    manifest: dict[str, Any] = {
        "generator": f"slimserve.data.synth v{GENERATOR_VERSION}",
        "seed": config.seed,
        "config": config.model_dump(mode="json"),
        "counts": {
            "members": len(dataset.members),
            "items": len(dataset.items),
            "interactions": len(dataset.interactions),
        },
        "positive_rate": _rate([row.label for row in dataset.interactions]),
        "split": {"seed": config.seed, "fractions": list(config.split_fractions)},
        "hidden": {"preferred_company_type": dict(sorted(tastes.items()))},
    }
    assignment = assign_members(dataset.members, config.seed, config.split_fractions)
    manifest["splits"] = {}
    for name in SPLIT_NAMES:
        rows = [r for r in dataset.interactions if assignment[r.member_id] == name]
        pairs = [Example(dataset.members[r.member_id], dataset.items[r.item_id], r.label) for r in rows]
        labels = [r.label for r in rows]
        bayes = auc(labels, oracle_probabilities(pairs, manifest)) if rows else float("nan")
        manifest["splits"][name] = {
            "members": sum(1 for split in assignment.values() if split == name),
            "interactions": len(rows),
            "positive_rate": _rate(labels),
            "bayes_optimal_auc": None if math.isnan(bayes) else round(bayes, 6),
        }
    return manifest


def _rate(labels: list[int]) -> float | None:
    return round(sum(labels) / len(labels), 6) if labels else None


def write_synthetic(config: SynthConfig, directory: Path | str) -> dict[str, Any]:
    """Synthesize and write a dataset directory (with ``manifest.json``); returns the manifest."""
    dataset, manifest = synthesize(config)
    write_dataset(dataset, directory, manifest)
    return manifest
