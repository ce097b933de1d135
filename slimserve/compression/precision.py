"""The precision of the build's PyTorch training passes: FP32, or BF16 autocast where the CPU multiplies
BF16 in hardware.

A stage sets it (``using``, with its recipe setting: ``teacher.precision`` for the teacher's frozen-layer
cache and top-layer fine-tune, ``student.distill.precision`` and ``prune.redistill.precision`` for the
students' distillations) around passes whose forward runs inside ``compute()``. Autocast keeps the
weights, the optimizer state and the loss in FP32 and runs the matrix products in BF16. Evaluations,
soft labels, layer selection, pruning's calibration and every exported graph stay FP32.

``auto`` picks BF16 only where the CPU has BF16 dot-product instructions: Intel AMX tiles, or AVX-512
BF16 (``VDPBF16PS``: AMD Zen 4 and later, Intel Cooper Lake). Measured (README, "Precision"): a
4096x576 by 576x1536 product in an ad-hoc PyTorch loop on 2 cores ran at 1,413 GFLOP/s in BF16 against
177 in FP32 with AMX, and at 351 against 142 on an AMD EPYC with AVX-512 BF16. Without either, BF16 is
converted in software and can be slower than FP32, so ``auto`` stays FP32 there.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Literal

import torch

log = logging.getLogger(__name__)

Precision = Literal["auto", "fp32", "bf16"]

_autocast_dtype: torch.dtype | None = None


def has_bf16_matrix_units() -> bool:
    """True where this CPU multiplies BF16 in hardware: AMX tiles or AVX-512 BF16 instructions."""
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def resolve(precision: Precision) -> Literal["fp32", "bf16"]:
    """What ``precision`` means on this machine (``auto``: bf16 with AMX or AVX-512 BF16, else fp32)."""
    if precision == "auto":
        return "bf16" if has_bf16_matrix_units() else "fp32"
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision: {precision!r} is not one of auto, fp32, bf16")
    return precision


@contextlib.contextmanager
def using(precision: Precision) -> Iterator[Literal["fp32", "bf16"]]:
    """Within the block, ``compute()`` runs at ``precision`` (resolved, and yielded); the previous
    precision comes back after it. The training stages wrap their passes in one."""
    global _autocast_dtype
    chosen = resolve(precision)
    previous, _autocast_dtype = _autocast_dtype, (torch.bfloat16 if chosen == "bf16" else None)
    try:
        yield chosen
    finally:
        _autocast_dtype = previous


@contextlib.contextmanager
def logged(precision: Precision, what: str) -> Iterator[Literal["fp32", "bf16"]]:
    """``using(precision)``, logged as "<what> at bf16 (precision: auto)": a training stage's block."""
    with using(precision) as chosen:
        log.info("%s at %s (precision: %s)", what, chosen, precision)
        yield chosen


@contextlib.contextmanager
def compute() -> Iterator[None]:
    """Run the block's CPU matrix products at the configured precision (FP32: unchanged)."""
    if _autocast_dtype is None:
        yield
        return
    with torch.autocast("cpu", dtype=_autocast_dtype):
        yield
