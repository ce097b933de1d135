"""A small, resumable training loop: AdamW, warmup + linear decay, gradient accumulation, checkpoints.

AdamW runs its fused kernel where the parameters live on the CPU or a CUDA GPU (one pass over each
tensor instead of several: up to 4% of a generator student's step on 2 cores, docs/build-times.md).

Batches are planned up front from a seed (``plan(epoch)`` returns the epoch's micro-batches), so a run
resumed from a checkpoint continues with exactly the batches it had not done yet.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from . import precision

log = logging.getLogger(__name__)


class TrainConfig(BaseModel):
    """Optimization settings of one training stage."""

    model_config = ConfigDict(extra="forbid")

    epochs: float = Field(1.0, gt=0, description="Passes over the data (fractions allowed)")
    batch_size: int = Field(8, ge=1, description="Examples per micro-batch")
    grad_accum: int = Field(1, ge=1, description="Micro-batches per optimizer step")
    lr: float = Field(2e-5, gt=0, description="Peak learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    warmup_ratio: float = Field(0.05, ge=0, lt=1, description="Share of steps with linear warmup")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm")
    checkpoint_every: int = Field(50, ge=1, description="Optimizer steps between checkpoints")
    # Bookkeeping, not a result: excluded from dumps, so it is no part of a stage's settings (changing it
    # re-runs nothing). Slow steps (the generator teacher's fine-tune: 58 steps of 10 s) would otherwise
    # reach no checkpoint_every step, and an interrupted stage would start over.
    checkpoint_seconds: float = Field(
        180.0, gt=0, exclude=True, description="Also checkpoint once this long has passed since the last save"
    )
    seed: int = Field(0, description="Seed of the batch order")


@dataclass
class TrainReport:
    """What a training run did."""

    steps: int = 0
    micro_batches: int = 0
    seconds: float = 0.0
    resumed_from_step: int = 0
    losses: list[float] = field(default_factory=list)
    epoch_scores: list[float] = field(default_factory=list)  # validation score after each epoch
    best_epoch: int | None = None  # the epoch whose weights were kept (1-based), when scored
    precision: str = "fp32"  # of the loss's compute() blocks: the precision block train() ran in

    def as_dict(self) -> dict:
        tail = self.losses[-20:]
        return {
            "steps": self.steps,
            "micro_batches": self.micro_batches,
            "seconds": round(self.seconds, 1),
            "resumed_from_step": self.resumed_from_step,
            "final_loss": sum(tail) / len(tail) if tail else None,
            "epoch_scores": [round(v, 4) for v in self.epoch_scores],
            "best_epoch": self.best_epoch,
            "precision": self.precision,
        }


class _BestWeights:
    """Keeps a copy of the parameters at their best validation score; restores it at the end."""

    def __init__(self, parameters, score_fn: Callable[[], float], report: TrainReport):
        self.parameters, self.score_fn, self.report = parameters, score_fn, report
        self.best: list[torch.Tensor] | None = None

    def epoch_end(self, epoch: int) -> None:
        score = float(self.score_fn())
        self.report.epoch_scores.append(score)
        log.info("epoch %d: validation score %.4f", epoch, score)
        if self.best is None or score > max(self.report.epoch_scores[:-1]):
            self.best = [p.detach().clone() for p in self.parameters]
            self.report.best_epoch = epoch

    def restore(self) -> None:
        if self.best is not None and self.report.best_epoch != len(self.report.epoch_scores):
            log.info("keeping the weights of epoch %d (best validation score)", self.report.best_epoch)
            for parameter, value in zip(self.parameters, self.best, strict=True):
                parameter.data.copy_(value)


def progress_bar(total: int, desc: str, unit: str = "prompt") -> tqdm:
    """A progress bar with an ETA; a line every 30 s when the output is not a terminal (a log file)."""
    interval = 0.2 if sys.stderr.isatty() else 30.0
    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, mininterval=interval)


def _schedule(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / max(1, warmup)
    return max(0.0, (total - step) / max(1, total - warmup))


def train(
    parameters: Sequence[torch.nn.Parameter],
    plan: Callable[[int], list],
    loss_fn: Callable[[object], torch.Tensor],
    config: TrainConfig,
    checkpoint: Path | None = None,
    desc: str = "train",
    validation_score: Callable[[], float] | None = None,
) -> TrainReport:
    """Run ``loss_fn`` over the planned micro-batches and optimize ``parameters``.

    ``plan(epoch)`` returns that epoch's micro-batch payloads (deterministic); ``loss_fn(payload)``
    returns a scalar loss. With ``checkpoint``, state is saved every ``checkpoint_every`` steps or
    ``checkpoint_seconds``, whichever comes first, and a later call resumes from it; the file is removed
    when training completes. With
    ``validation_score`` (higher is better), it is called after every whole epoch and the weights of
    the best epoch are kept (epochs scored before a resume are not remembered).
    """
    parameters = [p for p in parameters if p.requires_grad]
    fused = all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in parameters)
    optimizer = torch.optim.AdamW(parameters, lr=config.lr, weight_decay=config.weight_decay, fused=fused)
    whole_epochs = int(config.epochs) + (1 if config.epochs % 1 else 0)
    batches = []
    epoch_ends: dict[int, int] = {}  # optimizer step after which an epoch is complete -> epoch (1-based)
    for epoch in range(whole_epochs):
        epoch_batches = plan(epoch)
        if epoch == whole_epochs - 1 and config.epochs % 1:
            epoch_batches = epoch_batches[: max(1, int(len(epoch_batches) * (config.epochs % 1)))]
        batches.extend(epoch_batches)
        epoch_ends[max(1, len(batches) // config.grad_accum)] = epoch + 1
    total_steps = max(1, len(batches) // config.grad_accum)
    warmup = int(total_steps * config.warmup_ratio)
    report = TrainReport(precision=precision.active())
    best = _BestWeights(parameters, validation_score, report) if validation_score else None
    start_step = 0
    if checkpoint is not None and checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=False)
        for parameter, value in zip(parameters, state["parameters"], strict=True):
            parameter.data.copy_(value)
        optimizer.load_state_dict(state["optimizer"])
        start_step = report.resumed_from_step = state["step"]
        report.losses = state["losses"]
        log.info("%s: resuming from step %d of %d (%s)", desc, start_step, total_steps, checkpoint)
    started = last_save = time.perf_counter()
    step = start_step
    with progress_bar(total_steps, desc, unit="step") as bar:
        bar.update(start_step)
        for step in range(start_step, total_steps):
            for group in optimizer.param_groups:
                group["lr"] = config.lr * _schedule(step, total_steps, warmup)
            optimizer.zero_grad(set_to_none=True)
            step_loss = 0.0
            for micro in batches[step * config.grad_accum : (step + 1) * config.grad_accum]:
                loss = loss_fn(micro) / config.grad_accum
                loss.backward()
                step_loss += float(loss.detach())
                report.micro_batches += 1
            torch.nn.utils.clip_grad_norm_(parameters, config.max_grad_norm)
            optimizer.step()
            report.losses.append(step_loss)
            bar.set_postfix(loss=f"{step_loss:.4f}")
            bar.update(1)
            if best is not None and step + 1 in epoch_ends:
                best.epoch_end(epoch_ends[step + 1])
            due = (step + 1) % config.checkpoint_every == 0
            due = due or time.perf_counter() - last_save >= config.checkpoint_seconds
            if checkpoint is not None and due and step + 1 < total_steps:
                _save(checkpoint, parameters, optimizer, step + 1, report.losses)
                last_save = time.perf_counter()
    if best is not None:
        best.restore()
    report.steps = total_steps
    report.seconds = time.perf_counter() - started
    if checkpoint is not None and checkpoint.exists():
        checkpoint.unlink()
    return report


def _save(path: Path, parameters, optimizer, step: int, losses: list[float]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "parameters": [p.detach().clone() for p in parameters],
            "optimizer": optimizer.state_dict(),
            "step": step,
            "losses": losses,
        },
        tmp,
    )
    os.replace(tmp, path)
