"""Held-out evaluation of a generator against its teacher: teacher-forced loss and KL, on the teacher's
text and on the model's own samples, and greedy decode speed.

All figures are means per response token over the full vocabulary (no top-k here):
``loss`` = -log q(token) of the text; ``kl`` = sum_v p_v (log p_v - log q_v) with p the teacher, q the model;
``top1_agreement`` = share of positions where both models' most likely token is the same.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from .. import atomic
from .generator_data import Sampling, generate
from .generator_distill import ResponseBatch, response_batch, response_hidden, response_logprobs


@dataclass
class TextMetrics:
    """Per-token means over a set of texts (nats)."""

    loss: float
    kl: float
    top1_agreement: float
    tokens: int


def token_sums(
    teacher_logprobs: torch.Tensor, model_logprobs: torch.Tensor, targets: torch.Tensor
) -> tuple[float, float, float]:
    """(sum of -log q(target), sum of KL(p || q), number of positions where argmax p == argmax q)."""
    loss = -model_logprobs.gather(-1, targets[:, None]).sum()
    kl = (teacher_logprobs.exp() * (teacher_logprobs - model_logprobs)).sum()
    agree = (teacher_logprobs.argmax(-1) == model_logprobs.argmax(-1)).sum()
    return float(loss), float(kl), float(agree)


@dataclass
class TeacherPositions:
    """The teacher's distribution ``p`` at each evaluated position (in ``evaluate_text``'s order), kept as
    what the KL to a model with the same LM head weight ``W`` needs. With ``q = softmax(W h)``,
    ``sum p log q = (p W) . h - logsumexp(W h) sum p``, so KL(p || q) needs ``sum p log p``, ``sum p``
    and the row ``p W`` per position: the cpu recipe's 2,800 or so take 13 MB, their full log-probs
    over 540 MB. The row and the log-sum-exp are float64: the two terms are about 20 each and their
    difference about 0.1, so FP32 would leave an error of about 1e-5 in a KL of 0.03. The students keep
    the teacher's (tied, frozen) embeddings, so their evaluations on the teacher's text need no teacher
    pass."""

    negentropy: np.ndarray  # [n] float64: sum p log p
    mass: np.ndarray  # [n] float64: sum p (1 but for rounding)
    expected_row: np.ndarray  # [n, hidden] float64: p W
    argmax: np.ndarray  # [n] int64: the teacher's most likely token
    targets: np.ndarray  # [n] int64: the text's token (a check that the text is the same)

    @classmethod
    def of(cls, logprobs: torch.Tensor, head_weight: torch.Tensor, targets: torch.Tensor) -> TeacherPositions:
        """The positions of one batch (``head_weight``: the LM head's [vocab, hidden] weight, float64)."""
        p = logprobs.exp().double()
        return cls(
            (p * logprobs.double()).sum(-1).cpu().numpy(),
            p.sum(-1).cpu().numpy(),
            (p @ head_weight).cpu().numpy(),
            logprobs.argmax(-1).cpu().numpy(),
            targets.cpu().numpy(),
        )

    @classmethod
    def joined(cls, parts: Sequence[TeacherPositions]) -> TeacherPositions:
        return cls(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)))

    def rows(self, start: int, count: int) -> TeacherPositions:
        return TeacherPositions(*(getattr(self, f.name)[start : start + count] for f in fields(self)))

    def __len__(self) -> int:
        return len(self.targets)

    def save(self, path: Path) -> None:
        stream = io.BytesIO()
        np.savez(stream, **{f.name: getattr(self, f.name) for f in fields(self)})
        atomic.write_bytes(path, stream.getvalue())

    @classmethod
    def load(cls, path: Path) -> TeacherPositions:
        with np.load(path) as arrays:
            return cls(*(arrays[f.name] for f in fields(cls)))


def shares_head(model, teacher) -> bool:
    """True when ``model``'s LM head is ``teacher``'s: the same weight and no bias (``TeacherPositions``)."""
    mine, theirs = model.get_output_embeddings(), teacher.get_output_embeddings()
    if getattr(mine, "bias", None) is not None or getattr(theirs, "bias", None) is not None:
        return False
    return mine.weight.shape == theirs.weight.shape and torch.equal(
        mine.weight, theirs.weight.to(mine.weight)
    )


def position_sums(model, batch: ResponseBatch, teacher: TeacherPositions) -> tuple[float, float, float]:
    """``token_sums`` of ``model`` on ``batch`` against the teacher's kept ``positions`` of it (their
    LM heads the same: ``shares_head``): no teacher pass."""
    if not np.array_equal(teacher.targets, batch.targets.numpy()):
        raise ValueError("the teacher's kept positions are not those of this text (its tokens differ)")
    hidden = response_hidden(model, batch)
    logits = model.get_output_embeddings()(hidden).float()
    logprobs = torch.log_softmax(logits, dim=-1)
    loss = -logprobs.gather(-1, batch.targets.to(logits.device)[:, None]).sum()
    as_tensor = lambda values: torch.from_numpy(values).to(logits.device)  # noqa: E731
    cross = (as_tensor(teacher.expected_row) * hidden.double()).sum(-1)
    cross -= torch.logsumexp(logits.double(), dim=-1) * as_tensor(teacher.mass)
    kl = (as_tensor(teacher.negentropy) - cross).sum()
    agree = (as_tensor(teacher.argmax) == logprobs.argmax(-1)).sum()
    return float(loss), float(kl), float(agree)


def _evaluated(
    prompts,
    responses,
    batch_size: int,
    progress: Callable[[int], object] | None,
    sums_of: Callable[[ResponseBatch, int], tuple[float, float, float]],
) -> TextMetrics:
    """The per-token means of ``sums_of(batch, offset)`` (``token_sums``' three sums; ``offset``: the
    response tokens of the batches before) over the evaluation's batches, shortest sequences first."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(responses[i]))
    totals, tokens = [0.0, 0.0, 0.0], 0
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        batch = response_batch([prompts[i] for i in chunk], [responses[i] for i in chunk])
        totals = [total + value for total, value in zip(totals, sums_of(batch, tokens), strict=True)]
        tokens += len(batch.targets)
        if progress is not None:
            progress(len(chunk))
    if not tokens:
        raise ValueError("no response tokens to evaluate")
    return TextMetrics(totals[0] / tokens, totals[1] / tokens, totals[2] / tokens, tokens)


@torch.no_grad()
def evaluate_text(
    model,
    teacher,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    batch_size: int = 4,
    progress: Callable[[int], object] | None = None,
    positions: TeacherPositions | None = None,
) -> TextMetrics:
    """Teacher-forced metrics of ``model`` on ``responses`` continuing ``prompts`` (``model`` may be the
    teacher itself: then KL is 0 and agreement 1). ``positions``, the teacher's kept positions of these
    texts (``summarise_teacher``, the same batch size), replace the teacher's pass when ``model`` has the
    teacher's LM head."""
    model.eval()
    teacher.eval()
    kept = positions if positions is not None and shares_head(model, teacher) else None

    def sums_of(batch: ResponseBatch, offset: int) -> tuple[float, float, float]:
        if kept is not None:
            return position_sums(model, batch, kept.rows(offset, len(batch.targets)))
        teacher_lp = response_logprobs(teacher, batch)
        model_lp = teacher_lp if model is teacher else response_logprobs(model, batch).to(teacher_lp.device)
        return token_sums(teacher_lp, model_lp, batch.targets.to(teacher_lp.device))

    metrics = _evaluated(prompts, responses, batch_size, progress, sums_of)
    if kept is not None and metrics.tokens != len(kept):
        raise ValueError(f"the teacher's kept positions are {len(kept)}, this text has {metrics.tokens}")
    return metrics


@torch.no_grad()
def summarise_teacher(
    teacher,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    batch_size: int = 4,
    progress: Callable[[int], object] | None = None,
) -> tuple[TextMetrics, TeacherPositions]:
    """``evaluate_text(teacher, teacher, ...)`` and, from the same pass, the teacher's positions that later
    evaluations of models with its LM head read instead of running it (``TeacherPositions``)."""
    teacher.eval()
    head = teacher.get_output_embeddings().weight.double()
    parts: list[TeacherPositions] = []

    def sums_of(batch: ResponseBatch, _offset: int) -> tuple[float, float, float]:
        logprobs = response_logprobs(teacher, batch)
        targets = batch.targets.to(logprobs.device)
        parts.append(TeacherPositions.of(logprobs, head, targets))
        return token_sums(logprobs, logprobs, targets)

    metrics = _evaluated(prompts, responses, batch_size, progress, sums_of)
    return metrics, TeacherPositions.joined(parts)


def evaluate_own_samples(
    model,
    teacher,
    prompts: Sequence[Sequence[int]],
    sampling: Sampling,
    end_ids: Sequence[int],
    batch_size: int = 8,
    progress: Callable[[int], object] | None = None,
) -> tuple[TextMetrics, list[list[int]]]:
    """The model continues ``prompts`` itself (seeded sampling) and the teacher scores those continuations:
    the KL the model meets when it generates (what on-policy distillation trains on)."""
    samples = generate(model, prompts, sampling, end_ids, batch_size=batch_size).responses
    return evaluate_text(model, teacher, prompts, samples, progress=progress), samples


@torch.no_grad()
def decode_tokens_per_s(model, prompt: Sequence[int], tokens: int) -> float:
    """Greedy single-stream decode speed in PyTorch (``tokens`` new tokens, end tokens not honoured)."""
    from transformers import GenerationConfig

    ids = torch.tensor([list(prompt)], dtype=torch.long, device=model.device)
    mask = torch.ones_like(ids)

    def run(count: int) -> float:
        config = GenerationConfig(
            max_new_tokens=count, min_new_tokens=count, do_sample=False, pad_token_id=0, eos_token_id=None
        )
        started = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started

    model.eval()
    run(2)  # warm-up
    prefill = run(1)
    return (tokens - 1) / max(run(tokens) - prefill, 1e-9)
