"""Train/validation/test splits by member (no member in two splits) and the unlabelled distillation pool."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any

from ..errors import UserError
from ..schema import Item, Member
from .records import Dataset

SPLIT_NAMES = ("train", "validation", "test")
DEFAULT_FRACTIONS = (0.7, 0.1, 0.2)


@dataclass(frozen=True)
class Example:
    """A member-candidate pair to score; ``label`` is None in the unlabelled pool."""

    member: Member
    item: Item
    label: int | None

    @property
    def member_id(self) -> str:
        return self.member.id

    @property
    def item_id(self) -> str:
        return self.item.id


@dataclass
class Splits:
    """Labelled examples per split, and unlabelled train-member pairs for distillation."""

    train: list[Example]
    validation: list[Example]
    test: list[Example]
    pool: list[Example]

    def by_name(self, name: str) -> list[Example]:
        """The examples of ``train``, ``validation``, ``test`` or ``pool``."""
        return getattr(self, name)


def _member_key(member_id: str, seed: int) -> bytes:
    return hashlib.sha256(f"{seed}:{member_id}".encode()).digest()


def assign_members(member_ids, seed: int, fractions=DEFAULT_FRACTIONS) -> dict[str, str]:
    """Split name per member id: members ordered by a seeded hash, then cut at the fractions."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-6:
        raise UserError(f"split fractions must be three non-negative numbers summing to 1, got {fractions}")
    ordered = sorted(member_ids, key=lambda m: _member_key(m, seed))
    cut_train = round(len(ordered) * fractions[0])
    cut_validation = round(len(ordered) * (fractions[0] + fractions[1]))
    return {
        member: "train" if i < cut_train else "validation" if i < cut_validation else "test"
        for i, member in enumerate(ordered)
    }


def split_dataset(
    dataset: Dataset, seed: int, fractions=DEFAULT_FRACTIONS, pool_factor: float = 1.0
) -> Splits:
    """Labelled examples split by member; ``pool``: ``pool_factor`` x len(train) unseen train-member pairs."""
    assignment = assign_members(dataset.members, seed, fractions)
    labelled: dict[str, list[Example]] = {name: [] for name in SPLIT_NAMES}
    for row in dataset.interactions:
        example = Example(dataset.members[row.member_id], dataset.items[row.item_id], row.label)
        labelled[assignment[row.member_id]].append(example)
    pool = _pool(dataset, assignment, round(pool_factor * len(labelled["train"])), seed)
    return Splits(labelled["train"], labelled["validation"], labelled["test"], pool)


def _pool(dataset: Dataset, assignment: dict[str, str], size: int, seed: int) -> list[Example]:
    """``size`` distinct (train member, item) pairs with no interaction, drawn with a seeded generator."""
    members = sorted(m for m, split in assignment.items() if split == "train")
    items = sorted(dataset.items)
    taken = {(row.member_id, row.item_id) for row in dataset.interactions}
    capacity = len(members) * len(items) - sum(1 for m, _ in taken if assignment.get(m) == "train")
    size = min(size, capacity)
    rng = random.Random(f"pool:{seed}")
    pool: list[Example] = []
    while len(pool) < size:
        pair = (rng.choice(members), rng.choice(items))
        if pair in taken:
            continue
        taken.add(pair)
        pool.append(Example(dataset.members[pair[0]], dataset.items[pair[1]], None))
    return pool


def bayes_optimal_auc(manifest: dict[str, Any] | None, split_name: str) -> float:
    """The best AUC any model can reach on a split, as the synthetic generator recorded it."""
    try:
        return float(manifest["splits"][split_name]["bayes_optimal_auc"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        raise UserError(
            f"no Bayes-optimal AUC for split {split_name!r}: the dataset has no synthetic manifest"
        ) from None
