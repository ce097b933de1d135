"""Token-level distillation of a generator: forward KL to the teacher on teacher text (off-policy) and on
text the student samples itself (on-policy).

Both stages minimise the same per-token loss, the forward KL(teacher || student) with the teacher's
distribution restricted to its ``top_k`` tokens and renormalised (``sparse_forward_kl``; exact when
``top_k`` is the vocabulary size). Off-policy targets come cached from the teacher's generation pass;
on-policy targets come from a teacher forward over the student's samples. Only response tokens count;
the prompt is context.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from . import precision
from .batches import batch_indices, pad_right
from .generator_data import Sampling, TeacherText, generate
from .trainer import TrainConfig, TrainReport, train

log = logging.getLogger(__name__)


@dataclass
class ResponseBatch:
    """Prompt + response sequences, right-padded; ``rows``/``cols`` index the positions whose output
    predicts a response token, ``targets`` holds those tokens (in sequence order)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    targets: torch.Tensor


def response_batch(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> ResponseBatch:
    """The batch of ``prompt + response`` sequences and where each response token is predicted."""
    ids, mask = pad_right([list(p) + list(r) for p, r in zip(prompts, responses, strict=True)])
    rows, cols, targets = [], [], []
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        if not prompt:
            raise ValueError("every sequence needs a prompt of at least one token")
        rows += [row] * len(response)
        cols += range(len(prompt) - 1, len(prompt) - 1 + len(response))
        targets += list(response)
    as_long = lambda values: torch.tensor(values, dtype=torch.long)  # noqa: E731
    return ResponseBatch(ids, mask, as_long(rows), as_long(cols), as_long(targets))


# The attention of training passes. Measured on 2 cores (docs/build-times.md, "Where a generator training
# step goes"): the CPU's fused SDPA kernel's backward is a sixth of a generator student's step; the plain
# product-softmax-product ran the whole step up to 7% faster at BF16, the same at FP32. Decoding keeps
# SDPA (faster there: 108 ms against 129 ms a step of the teacher, 32 sequences).
TRAINING_ATTENTION = "eager"


@contextlib.contextmanager
def attention(model, implementation: str) -> Iterator[None]:
    """``model`` computes attention with ``implementation`` (a Hugging Face attention name) within the
    block; its own comes back after it."""
    previous = model.config._attn_implementation
    if previous == implementation:
        yield
        return
    model.set_attn_implementation(implementation)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


@contextlib.contextmanager
def _training_forward(model) -> Iterator[None]:
    with precision.compute(), attention(model, TRAINING_ATTENTION):
        yield


def response_hidden(model, batch: ResponseBatch, training: bool = False) -> torch.Tensor:
    """The decoder's last hidden states [response tokens, hidden] (FP32, on the model's device) at the
    positions predicting each response token: what the LM head reads. ``training``: the decoder runs at
    the training stage's precision (``precision.compute``) with ``TRAINING_ATTENTION``."""
    device = model.device
    with _training_forward(model) if training else contextlib.nullcontext():
        hidden = model.get_decoder()(
            input_ids=batch.input_ids.to(device),
            attention_mask=batch.attention_mask.to(device),
            use_cache=False,
        ).last_hidden_state
    return hidden[batch.rows.to(device), batch.cols.to(device)].float()


def response_logprobs(model, batch: ResponseBatch, training: bool = False) -> torch.Tensor:
    """Log-probs over the vocabulary [response tokens, vocab] at the positions predicting each response
    token (``response_hidden``); the LM head runs only there. The LM head and the log-softmax are FP32
    whatever the decoder's precision (a BF16 logit's rounding, about 0.06 at 16, is as large as the
    differences the KL is made of)."""
    logits = model.get_output_embeddings()(response_hidden(model, batch, training))
    return torch.log_softmax(logits.float(), dim=-1)


def topk_targets(logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest log-probs per position and their token ids."""
    return logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)


def sparse_forward_kl(
    student_logprobs: torch.Tensor, teacher_topk_logprobs: torch.Tensor, teacher_topk_ids: torch.Tensor
) -> torch.Tensor:
    """Per-position KL(p || q) with ``p`` the teacher restricted to its top-k tokens and renormalised, ``q``
    the student's full distribution: ``sum_k p_k (log p_k - log q_k)`` (>= 0; exact KL when k = vocab)."""
    teacher = torch.log_softmax(teacher_topk_logprobs.float(), dim=-1)
    student = student_logprobs.gather(-1, teacher_topk_ids.long())
    return (teacher.exp() * (teacher - student)).sum(-1)


@dataclass
class OnPolicySettings:
    """How stage (b) mixes the student's own samples with teacher text."""

    sampling: Sampling
    share: float  # share of micro-batches that are on-policy
    top_k: int
    end_ids: list[int] = field(default_factory=list)
    rollout_batches: int = 1  # on-policy micro-batches whose samples are drawn together (_onpolicy_plan)


@dataclass
class OnPolicyLog:
    """What the on-policy stage sampled (kept to show that the student wrote it)."""

    batches: int = 0
    sampled_tokens: int = 0
    ended: int = 0  # samples that stopped on an end token
    samples: list[dict] = field(default_factory=list)  # the first few, for inspection


def _trainable(student, frozen_layers: int = 0) -> list[torch.nn.Parameter]:
    """Every parameter but the (tied) embeddings and the bottom ``frozen_layers`` decoder layers, which
    stay frozen (autograd then never runs the backward pass below the first trained layer)."""
    for parameter in student.parameters():
        parameter.requires_grad_(True)
    student.get_input_embeddings().requires_grad_(False)
    student.get_output_embeddings().requires_grad_(False)
    for layer in student.get_decoder().layers[:frozen_layers]:
        layer.requires_grad_(False)
    return [p for p in student.parameters() if p.requires_grad]


def _run(
    student,
    plan,
    loss_fn,
    config: TrainConfig,
    checkpoint: Path | None,
    desc: str,
    frozen_layers: int = 0,
    precision_setting: precision.Precision = "fp32",
) -> TrainReport:
    """Train ``student``'s parameters (``_trainable``) with ``loss_fn``, whose student forwards run at
    ``precision_setting`` on the student's device (``response_logprobs(..., training=True)``)."""
    parameters = _trainable(student, frozen_layers)
    student.train()
    try:
        with precision.logged(precision_setting, desc, student.device.type):
            return train(parameters, plan, loss_fn, config, checkpoint, desc=desc)
    finally:
        student.eval()
        for parameter in student.parameters():
            parameter.requires_grad_(False)


def _offpolicy_loss(student, text: TeacherText, indices: Sequence[int]) -> torch.Tensor:
    batch = response_batch([text.prompts[i] for i in indices], [text.responses[i] for i in indices])
    targets = [text.generated.targets(int(i)) for i in indices]
    values = torch.cat([t[0] for t in targets]).to(student.device)
    ids = torch.cat([t[1] for t in targets]).to(student.device)
    return sparse_forward_kl(response_logprobs(student, batch, training=True), values, ids).mean()


def _lengths(text: TeacherText) -> list[int]:
    return [len(p) + len(r) for p, r in zip(text.prompts, text.responses, strict=True)]


def distill_offpolicy(
    student,
    text: TeacherText,
    config: TrainConfig,
    checkpoint: Path | None = None,
    precision_setting: precision.Precision = "fp32",
) -> TrainReport:
    """Stage (a): forward KL to the teacher's cached top-k distributions on the teacher's own text (the
    student's forward at ``precision_setting``)."""
    if text.generated.topk_logprobs is None:
        raise ValueError("the teacher text carries no top-k targets (generate it with top_k)")
    lengths = _lengths(text)

    def plan(epoch: int) -> list[np.ndarray]:
        return batch_indices(lengths, config.batch_size, shuffle=True, seed=config.seed + epoch)

    return _run(
        student,
        plan,
        lambda idx: _offpolicy_loss(student, text, idx),
        config,
        checkpoint,
        "generator (a)",
        precision_setting=precision_setting,
    )


def _onpolicy_plan(
    lengths: list[int], config: TrainConfig, share: float, epoch: int, rollout_batches: int = 1
) -> list[tuple]:
    """Micro-batches as (kind, indices, seed, rollout); ``round(share * n)`` of them on-policy, seeded
    positions. An on-policy micro-batch's ``rollout`` lists (indices, seed) of the ``rollout_batches``
    consecutive on-policy micro-batches it is sampled with (itself included, in plan order)."""
    batches = batch_indices(lengths, config.batch_size, shuffle=True, seed=config.seed + epoch)
    rng = np.random.default_rng(config.seed * 7919 + epoch)
    on = set(rng.permutation(len(batches))[: round(share * len(batches))].tolist())
    seeds = [config.seed * 1_000_003 + epoch * 10_007 + i for i in range(len(batches))]
    on_order = sorted(on)
    rollouts = {
        i: tuple((batches[j], seeds[j]) for j in on_order[start : start + rollout_batches])
        for start in range(0, len(on_order), rollout_batches)
        for i in on_order[start : start + rollout_batches]
    }
    return [
        ("on", indices, seeds[i], rollouts[i]) if i in on else ("off", indices, seeds[i], ())
        for i, indices in enumerate(batches)
    ]


class _Rollouts:
    """The student's samples for on-policy micro-batches, drawn a rollout at a time: the first micro-batch
    of a rollout to be trained on samples it and the rollout's later ones in one batched generation (one
    decode instead of ``rollout_batches``; after a resume, the rest of the rollout only)."""

    def __init__(self, student, text: TeacherText, settings: OnPolicySettings):
        self.student, self.text, self.settings = student, text, settings
        self.drawn: dict[int, list[list[int]]] = {}  # seed -> responses

    def responses(self, seed: int, rollout: tuple) -> list[list[int]]:
        if seed not in self.drawn:
            ahead = rollout[[s for _, s in rollout].index(seed) :]
            prompts = [self.text.prompts[i] for indices, _ in ahead for i in indices]
            sampling = replace(self.settings.sampling, seed=seed)
            drawn = generate(self.student, prompts, sampling, self.settings.end_ids, batch_size=len(prompts))
            offset = 0
            for indices, later_seed in ahead:
                self.drawn[later_seed] = drawn.responses[offset : offset + len(indices)]
                offset += len(indices)
        return self.drawn.pop(seed)


def distill_onpolicy(
    student,
    teacher,
    text: TeacherText,
    settings: OnPolicySettings,
    config: TrainConfig,
    checkpoint: Path | None = None,
    keep_samples: int = 8,
    precision_setting: precision.Precision = "fp32",
) -> tuple[TrainReport, OnPolicyLog]:
    """Stage (b): on a ``settings.share`` of the micro-batches the student samples continuations of the
    prompts (``settings.sampling``) and learns the teacher's distribution on them; the other micro-batches
    are teacher text as in stage (a). With ``settings.rollout_batches`` above 1 the student samples that
    many on-policy micro-batches at once, before it learns from the first (``_Rollouts``): one batched
    decode, for samples up to ``rollout_batches - 1`` on-policy micro-batches older. The student's
    training forward runs at ``precision_setting``; its sampling and the teacher's targets at
    ``settings.sampling.precision`` (the decoder's weights; the LM heads FP32), like the teacher's
    targets of stage (a), which come from its text's generation."""
    lengths = _lengths(text)
    record = OnPolicyLog()
    teacher = precision.decoding_copy(teacher.eval(), settings.sampling.precision)
    rollouts = _Rollouts(student, text, settings)

    def loss_fn(payload) -> torch.Tensor:
        kind, indices, seed, rollout = payload
        if kind == "off":
            return _offpolicy_loss(student, text, indices)
        prompts = [text.prompts[i] for i in indices]
        responses = rollouts.responses(seed, rollout)
        _log_samples(record, text, indices, responses, settings.end_ids, keep_samples)
        batch = response_batch(prompts, responses)
        with torch.no_grad():
            values, ids = topk_targets(response_logprobs(teacher, batch), settings.top_k)
        student_logprobs = response_logprobs(student, batch, training=True)
        return sparse_forward_kl(student_logprobs, values.to(student.device), ids.to(student.device)).mean()

    report = _run(
        student,
        lambda epoch: _onpolicy_plan(lengths, config, settings.share, epoch, settings.rollout_batches),
        loss_fn,
        config,
        checkpoint,
        "generator (b)",
        precision_setting=precision_setting,
    )
    return report, record


def _log_samples(record: OnPolicyLog, text: TeacherText, indices, responses, end_ids, keep: int) -> None:
    record.batches += 1
    record.sampled_tokens += sum(len(r) for r in responses)
    record.ended += sum(1 for r in responses if r and r[-1] in end_ids)
    for index, response in zip(indices, responses, strict=True):
        if len(record.samples) < keep:
            record.samples.append(
                {"key": text.keys[int(index)], "prompt_index": int(index), "response": response}
            )
