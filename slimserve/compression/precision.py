"""The precision of the teacher stage's PyTorch passes: FP32, or BF16 autocast where the CPU multiplies
BF16 in hardware.

The teacher stage sets it (``using``, with the recipe's ``teacher.precision``) around its frozen-layer
cache and its top-layer fine-tune, whose forward passes run inside ``compute()``. Autocast keeps the
weights, the optimizer state and the loss in FP32 and runs the matrix products in BF16. The evaluations,
the soft labels and every student stage stay FP32: measured on a 2-core AMX VM, BF16 made the cache 1.8x
and the fine-tune 1.5x faster with the teacher's test AUC unchanged or better, but cost the scoring
student 0.006 test AUC when its distillation ran in BF16, and was no faster for the pruned student, the
generator's teacher text or its fine-tune's quality-checked budget (README, "Precision").

``auto`` picks BF16 only where it is known to be fast: Intel AMX tiles (BF16 products about 8x the FP32
rate on those 2 cores). Without them BF16 runs in AVX-512 or is emulated, which can be slower than FP32,
so ``auto`` stays FP32 there.
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
    """True where this CPU has AMX tiles (BF16 matrix products in hardware)."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe and probe())


def resolve(precision: Precision) -> Literal["fp32", "bf16"]:
    """What ``precision`` means on this machine (``auto``: bf16 with AMX, else fp32)."""
    if precision == "auto":
        return "bf16" if has_bf16_matrix_units() else "fp32"
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision: {precision!r} is not one of auto, fp32, bf16")
    return precision


@contextlib.contextmanager
def using(precision: Precision) -> Iterator[Literal["fp32", "bf16"]]:
    """Within the block, ``compute()`` runs at ``precision`` (resolved, and yielded); the previous
    precision comes back after it. A build wraps its stages in one."""
    global _autocast_dtype
    chosen = resolve(precision)
    previous, _autocast_dtype = _autocast_dtype, (torch.bfloat16 if chosen == "bf16" else None)
    try:
        yield chosen
    finally:
        _autocast_dtype = previous


def current() -> Literal["fp32", "bf16"]:
    """The precision ``compute()`` runs at now."""
    return "fp32" if _autocast_dtype is None else "bf16"


@contextlib.contextmanager
def compute() -> Iterator[None]:
    """Run the block's CPU matrix products at the configured precision (FP32: unchanged)."""
    if _autocast_dtype is None:
        yield
        return
    with torch.autocast("cpu", dtype=_autocast_dtype):
        yield
