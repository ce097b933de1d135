"""Supervised fine-tuning of a generator on (prompt, answer) token pairs: the grounded teacher fine-tune.

The loss is the mean cross-entropy of the answer tokens (the prompt is context), on the shared resumable
trainer; embeddings (tied with the LM head) stay frozen, as in distillation, and so may the bottom layers
(``train_top_layers``: the backward pass then stops at the first trained layer). The answers are explanations
written from each pair's facts (``data.explanations``) and, optionally, the teacher's own answers to free
instructions, so that fine-tuning on one task does not erase the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from .batches import batch_indices
from .generator_distill import _run, response_batch, response_logprobs
from .precision import Precision
from .trainer import TrainConfig, TrainReport


def answer_loss(model, prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]]) -> torch.Tensor:
    """Mean ``-log q(token)`` over the answer tokens of a batch."""
    batch = response_batch(prompts, answers)
    logprobs = response_logprobs(model, batch, training=True)
    return -logprobs.gather(-1, batch.targets.to(logprobs.device)[:, None]).mean()


def finetune_on_answers(
    model,
    prompts: Sequence[Sequence[int]],
    answers: Sequence[Sequence[int]],
    config: TrainConfig,
    checkpoint: Path | None = None,
    train_top_layers: int | None = None,
    precision_setting: Precision = "fp32",
) -> TrainReport:
    """Fine-tune ``model`` in place to write ``answers[i]`` after ``prompts[i]``; only its top
    ``train_top_layers`` decoder layers (and the final norm) learn when that is set, all of them otherwise.
    The decoder's training forward runs at ``precision_setting`` (the LM head and the loss FP32)."""
    if len(prompts) != len(answers) or not prompts:
        raise ValueError("fine-tuning needs as many answers as prompts, and at least one")
    layers = len(model.get_decoder().layers)
    frozen = 0 if train_top_layers is None else max(0, layers - train_top_layers)
    lengths = [len(p) + len(a) for p, a in zip(prompts, answers, strict=True)]

    def plan(epoch: int):
        return batch_indices(lengths, config.batch_size, shuffle=True, seed=config.seed + epoch)

    def loss_fn(indices) -> torch.Tensor:
        return answer_loss(model, [prompts[i] for i in indices], [answers[i] for i in indices])

    return _run(
        model, plan, loss_fn, config, checkpoint, "generator teacher fine-tune", frozen, precision_setting
    )
