"""The two trainings of the build: the teacher's yes/no fine-tuning and the student's distillation.

Both run members' examples as multi-item batches (``member_batches``): one member prefix and that
member's item suffixes per row, the prefix computed once, gradients through it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..compression import precision
from ..compression.batches import MemberGroup, member_batches, multi_item_batch
from ..compression.losses import distill_loss, label_loss
from ..compression.split_scorer import MemberHiddenCache, SplitScorer, top_logits_multi
from ..compression.trainer import TrainConfig, TrainReport, train
from ..evaluation.metrics import auc
from ..models.multi_item import MultiItemScorer
from ..models.scorer_graph import ScorerGraph
from .recipe import DistillSettings


def finetune_top_layers(
    split: SplitScorer,
    cache: MemberHiddenCache,
    labels: np.ndarray,
    config: TrainConfig,
    checkpoint: Path,
    validation: tuple[MemberHiddenCache, np.ndarray] | None = None,
) -> TrainReport:
    """Fit the top layers on cached bottom states (per member) with the label loss on the two label
    logits; batches are whole members, about ``config.batch_size`` examples each. The forward runs at
    ``compression.precision``'s setting (the teacher stage's).

    With ``validation`` (a cache and its labels), the weights of the epoch with the best validation AUC
    are kept.
    """
    split.freeze_bottom()
    targets = torch.from_numpy(labels)

    def plan(epoch: int) -> list[np.ndarray]:
        return member_batches(cache.groups, config.batch_size, shuffle=True, seed=config.seed + epoch)

    def loss_fn(chosen: np.ndarray) -> torch.Tensor:
        indices, prefix_h, prefix_mask, item_h, item_mask, valid = cache.batch(chosen)
        with precision.compute():
            logits = split.top_label_logits_multi(prefix_h, prefix_mask, item_h, item_mask)[valid]
        return label_loss(logits, targets[indices])

    split.graph.train()
    try:
        return train(
            split.trainable_parameters(),
            plan,
            loss_fn,
            config,
            checkpoint,
            desc="teacher fine-tune",
            validation_score=_validation_auc(split, *validation) if validation else None,
        )
    finally:
        split.graph.eval()


def _validation_auc(split: SplitScorer, cache: MemberHiddenCache, labels: np.ndarray):
    def score() -> float:
        logits = top_logits_multi(split, cache)
        return auc(labels, logits[:, 0] - logits[:, 1])

    return score


def teacher_split(graph: ScorerGraph, train_top_layers: int) -> SplitScorer:
    """Cut a teacher so that ``train_top_layers`` layers are trained (all of them for small models)."""
    layers = len(graph.body.layers)
    return SplitScorer(graph, max(0, layers - train_top_layers))


def cached_logits(split: SplitScorer, caches: dict[str, MemberHiddenCache]) -> dict[str, np.ndarray]:
    """(yes, no) logits of every cached split through the (current) top layers."""
    return {name: top_logits_multi(split, cache) for name, cache in caches.items()}


def distill(
    student: ScorerGraph,
    groups: list[MemberGroup],
    teacher_logits: np.ndarray,
    labels: np.ndarray,
    settings: DistillSettings,
    checkpoint: Path,
    desc: str,
) -> TrainReport:
    """Train the whole student on the teacher's 2-way distribution (and labels where known), multi-item
    over member ``groups`` (whose indices address ``teacher_logits`` and ``labels``); the forward runs at
    ``settings.precision`` (its label logits FP32 whatever it is)."""
    config = settings.train
    teacher = torch.from_numpy(teacher_logits)
    targets = torch.from_numpy(labels)
    scorer = MultiItemScorer(student)
    for parameter in student.parameters():
        parameter.requires_grad_(True)
    # Embeddings stay frozen: with tied weights they hold the LM head's label rows, which must keep
    # matching label_head (the exported model rebuilds it from the saved LM head).
    student.body.embed_tokens.requires_grad_(False)
    student.label_head.requires_grad_(False)

    def plan(epoch: int) -> list[np.ndarray]:
        return member_batches(groups, config.batch_size, shuffle=True, seed=config.seed + epoch)

    def loss_fn(chosen: np.ndarray) -> torch.Tensor:
        batch = multi_item_batch(groups, chosen)
        with precision.compute():
            logits = scorer.label_logits(*batch.tensors())[batch.valid]
        indices = torch.from_numpy(batch.indices)
        return distill_loss(
            logits, teacher[indices], settings.temperature, targets[indices], settings.label_weight
        )

    student.train()
    try:
        with precision.logged(settings.precision, desc):
            return train(list(student.parameters()), plan, loss_fn, config, checkpoint, desc=desc)
    finally:
        student.eval()
        for parameter in student.parameters():
            parameter.requires_grad_(False)
