"""The data every model stage shares: examples per split, their tokens (member groups and single
sequences), labels and members."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..compression.batches import MemberGroup, encode_member_groups
from ..tokenization import PromptTokenizer
from .recipe import Recipe

log = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test", "pool")


@dataclass
class BuildData:
    """Examples, tokens, labels (-1 in the pool) and member ids per split.

    ``groups``: each split's examples grouped by member (member prefix tokens, item suffix tokens, the
    examples' indices), what multi-item scoring runs; ``sequences``: every example's single sequence
    ``prefix + item`` (the same tokens, for the single-sequence graph, the export and INT8).
    """

    tokenizer: PromptTokenizer
    examples: dict[str, list]
    sequences: dict[str, list[list[int]]]
    labels: dict[str, np.ndarray]
    member_ids: dict[str, list[str]]
    bayes_optimal_auc: float | None
    groups: dict[str, list[MemberGroup]] = field(default_factory=dict)

    def calibration(self, count: int) -> list[list[int]]:
        """The first ``count`` training prompts (real prompts for pruning and INT8 calibration)."""
        return self.sequences["train"][:count]

    def calibration_groups(self, count: int) -> list[MemberGroup]:
        """The same ``count`` training examples as ``calibration``, as member groups."""
        chosen = []
        for group in self.groups["train"]:
            keep = group.indices < count
            if keep.any():
                items = [item for item, k in zip(group.items, keep, strict=True) if k]
                chosen.append(MemberGroup(group.prefix, items, group.indices[keep]))
        return chosen


def prepare_data(recipe: Recipe, dataset_dir: Path, tokenizer_file: Path) -> BuildData:
    """Load the dataset, split by member, cap each split, tokenize."""
    from ..data.records import load_dataset
    from ..data.splits import split_dataset

    settings = recipe.data
    dataset = load_dataset(dataset_dir)
    splits = split_dataset(dataset, seed=settings.split_seed)
    caps = {
        "train": settings.max_train,
        "validation": settings.max_validation,
        "test": settings.max_test,
        "pool": settings.max_pool,
    }
    tokenizer = PromptTokenizer(tokenizer_file, max_length=max(recipe.publish.length_buckets))
    examples = {name: splits.by_name(name)[: caps[name]] for name in SPLITS if name != "pool"}
    examples["pool"] = trained_members_pool(splits.pool, examples["train"], caps["pool"])
    split = recipe.publish.prompt_split()
    encoded = {name: encode_member_groups(items, tokenizer, split) for name, items in examples.items()}
    groups = {name: value[0] for name, value in encoded.items()}
    sequences = {name: value[1] for name, value in encoded.items()}
    labels = {
        name: np.array([-1 if e.label is None else e.label for e in items], dtype=np.int64)
        for name, items in examples.items()
    }
    member_ids = {name: [e.member_id for e in items] for name, items in examples.items()}
    bayes = _bayes_optimal_auc(dataset_dir, examples["test"], labels["test"])
    log.info("data: %s", ", ".join(f"{n} {len(examples[n])} ({len(groups[n])} members)" for n in SPLITS))
    return BuildData(tokenizer, examples, sequences, labels, member_ids, bayes, groups)


def trained_members_pool(pool: list, train: list, count: int) -> list:
    """The first ``count`` pool pairs of members in ``train``: distillation then reads each member once
    for its labelled and its pool pairs (one multi-item prefix pass), instead of once more per pool pair
    of a member seen nowhere else."""
    members = {e.member_id for e in train}
    return [e for e in pool if e.member_id in members][:count]


def _bayes_optimal_auc(dataset_dir: Path, examples: list, labels: np.ndarray) -> float | None:
    """AUC of the generator's true probabilities on exactly these test examples (synthetic data only)."""
    from ..data.records import load_manifest
    from ..data.synth import oracle_probabilities
    from ..evaluation.metrics import auc

    manifest = load_manifest(dataset_dir)
    if not manifest or not examples:
        return None
    return auc(labels, oracle_probabilities(examples, manifest))
