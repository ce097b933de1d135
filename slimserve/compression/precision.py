"""The precision of the teacher stage's PyTorch passes: FP32, or BF16 autocast where the CPU multiplies
BF16 in hardware.

The teacher stage sets it (``using``, with the recipe's ``teacher.precision``, default fp32) around its
frozen-layer cache and its top-layer fine-tune, whose forward passes run inside ``compute()``. Autocast
keeps the weights, the optimizer state and the loss in FP32 and runs the matrix products in BF16. The
evaluations, the soft labels and every student stage stay FP32. Measured on a 2-core AMX VM (README,
"Precision"): BF16 made the teacher stage 1.4x faster with its own test AUC unchanged or better, but the
students distilled from it ended 0.005 test AUC lower; it was slower for generation and for the pruned
student, which therefore never use it.

``auto`` picks BF16 only where it is known to be fast: Intel AMX tiles (a 4096x576 by 576x1536 product
ran at 1,413 GFLOP/s in BF16 against 177 in FP32 on those 2 cores, in an ad-hoc PyTorch loop beside a
build; ``slimserve bench floor`` measures both peaks for a BF16 teacher stage). Without them BF16 runs in
AVX-512 or is emulated, which can be slower than FP32, so ``auto`` stays FP32 there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

import torch

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
    precision comes back after it. The teacher stage wraps its passes in one."""
    global _autocast_dtype
    chosen = resolve(precision)
    previous, _autocast_dtype = _autocast_dtype, (torch.bfloat16 if chosen == "bf16" else None)
    try:
        yield chosen
    finally:
        _autocast_dtype = previous


@contextlib.contextmanager
def compute() -> Iterator[None]:
    """Run the block's CPU matrix products at the configured precision (FP32: unchanged)."""
    if _autocast_dtype is None:
        yield
        return
    with torch.autocast("cpu", dtype=_autocast_dtype):
        yield
