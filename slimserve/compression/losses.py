"""Losses on the two label logits (yes, no): the label loss and the distillation KL."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def label_loss(label_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the 2-way (yes, no) distribution against 0/1 labels (1 = yes)."""
    target = (1 - labels.long()).clamp(0, 1)  # class 0 is "yes"
    return F.cross_entropy(label_logits.float(), target)


def distill_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    temperature: float = 1.0,
    labels: torch.Tensor | None = None,
    label_weight: float = 0.0,
) -> torch.Tensor:
    """Forward KL(teacher || student) of the tempered 2-way distributions, times T^2, optionally mixed
    with the label loss on examples that have labels (``labels`` < 0 marks unlabelled ones)."""
    t = temperature
    teacher = F.log_softmax(teacher_logits.float() / t, dim=-1)
    student = F.log_softmax(student_logits.float() / t, dim=-1)
    kl = F.kl_div(student, teacher, log_target=True, reduction="batchmean") * (t * t)
    if labels is None or label_weight <= 0:
        return kl
    labelled = labels >= 0
    if not bool(labelled.any()):
        return kl
    supervised = label_loss(student_logits[labelled], labels[labelled])
    return (1 - label_weight) * kl + label_weight * supervised
