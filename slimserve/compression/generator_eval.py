"""Held-out evaluation of a generator against its teacher: teacher-forced loss and KL, on the teacher's
text and on the model's own samples, and greedy decode speed.

All figures are means per response token over the full vocabulary (no top-k here):
``loss`` = -log q(token) of the text; ``kl`` = sum_v p_v (log p_v - log q_v) with p the teacher, q the model;
``top1_agreement`` = share of positions where both models' most likely token is the same.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .generator_data import Sampling, generate
from .generator_distill import response_batch, response_logprobs


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


@torch.no_grad()
def evaluate_text(
    model,
    teacher,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    batch_size: int = 4,
    progress: Callable[[int], object] | None = None,
    teacher_cache: list[torch.Tensor] | None = None,
) -> TextMetrics:
    """Teacher-forced metrics of ``model`` on ``responses`` continuing ``prompts`` (``model`` may be the
    teacher itself: then KL is 0 and agreement 1). ``teacher_cache``, when given, keeps the teacher's
    log-probs per batch: filled by the first call, read by later ones on the same texts and batch size."""
    model.eval()
    teacher.eval()
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(responses[i]))
    totals = [0.0, 0.0, 0.0]
    tokens = 0
    for number, start in enumerate(range(0, len(order), batch_size)):
        chunk = order[start : start + batch_size]
        batch = response_batch([prompts[i] for i in chunk], [responses[i] for i in chunk])
        if teacher_cache is not None and number < len(teacher_cache):
            teacher_lp = teacher_cache[number]
        else:
            teacher_lp = response_logprobs(teacher, batch)
            if teacher_cache is not None:
                teacher_cache.append(teacher_lp)
        model_lp = teacher_lp if model is teacher else response_logprobs(model, batch).to(teacher_lp.device)
        for index, value in enumerate(token_sums(teacher_lp, model_lp, batch.targets.to(teacher_lp.device))):
            totals[index] += value
        tokens += len(batch.targets)
        if progress is not None:
            progress(len(chunk))
    if not tokens:
        raise ValueError("no response tokens to evaluate")
    return TextMetrics(totals[0] / tokens, totals[1] / tokens, totals[2] / tokens, tokens)


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
