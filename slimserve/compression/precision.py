"""The precision of the build's PyTorch training passes: FP32, or BF16 autocast where the device multiplies
BF16 in hardware.

A stage sets it (``using``, with its recipe setting: ``teacher.precision`` for the teacher's frozen-layer
cache and top-layer fine-tune, ``student.distill.precision`` and ``prune.redistill.precision`` for the
students' distillations, ``generator.finetune/offpolicy/onpolicy.precision`` for the generator's) around
passes whose forward runs inside ``compute()``. Autocast keeps the
weights, the optimizer state and the loss in FP32 and runs the matrix products in BF16. Evaluations,
soft labels, layer selection, pruning's calibration and every exported graph stay FP32. Text generation
has its own setting (``generator.generation_precision``): ``decoding_copy`` gives the model that decodes.

``auto`` picks BF16 only where the device has BF16 units: on a CUDA GPU compute capability 8.0 and
later (the generator's stages with ``generator.device`` cuda); on the CPU Intel AMX tiles, or AVX-512
BF16 (``VDPBF16PS``: AMD Zen 4 and later, Intel Cooper Lake). Measured (README, "Precision"): a
4096x576 by 576x1536 product in an ad-hoc PyTorch loop on 2 cores ran at 1,413 GFLOP/s in BF16 against
177 in FP32 with AMX, and at 351 against 142 on an AMD EPYC with AVX-512 BF16. Without either, BF16 is
converted in software and can be slower than FP32, so ``auto`` stays FP32 there.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from typing import Literal

import torch

log = logging.getLogger(__name__)

Precision = Literal["auto", "fp32", "bf16"]

Device = Literal["cpu", "cuda"]

_autocast: tuple[Device, torch.dtype] | None = None  # (device type, dtype) of compute() blocks


def has_bf16_matrix_units() -> bool:
    """True where this CPU multiplies BF16 in hardware: AMX tiles or AVX-512 BF16 instructions."""
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def has_bf16(device: Device = "cpu") -> bool:
    """True where ``device`` multiplies BF16 in hardware: the CPU's units above, or a CUDA GPU with BF16
    (compute capability 8.0 and later, ``torch.cuda.is_bf16_supported``)."""
    if device == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return has_bf16_matrix_units()


def resolve(precision: Precision, device: Device = "cpu") -> Literal["fp32", "bf16"]:
    """What ``precision`` means on this machine's ``device`` (``auto``: bf16 where it has BF16 units)."""
    if precision == "auto":
        return "bf16" if has_bf16(device) else "fp32"
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision: {precision!r} is not one of auto, fp32, bf16")
    return precision


@contextlib.contextmanager
def using(precision: Precision, device: Device = "cpu") -> Iterator[Literal["fp32", "bf16"]]:
    """Within the block, ``compute()`` runs ``device``'s matrix products at ``precision`` (resolved for
    that device, and yielded); the previous setting comes back after it. The training stages wrap
    their passes in one."""
    global _autocast
    chosen = resolve(precision, device)
    previous, _autocast = _autocast, ((device, torch.bfloat16) if chosen == "bf16" else None)
    try:
        yield chosen
    finally:
        _autocast = previous


def active() -> Literal["fp32", "bf16"]:
    """The precision ``compute()`` blocks run at now (the innermost ``using`` block's)."""
    return "fp32" if _autocast is None else "bf16"


@contextlib.contextmanager
def logged(precision: Precision, what: str, device: Device = "cpu") -> Iterator[Literal["fp32", "bf16"]]:
    """``using(precision, device)``, logged as "<what> at bf16 on cpu (precision: auto)": a training
    stage's block."""
    with using(precision, device) as chosen:
        log.info("%s at %s on %s (precision: %s)", what, chosen, device, precision)
        yield chosen


@contextlib.contextmanager
def compute() -> Iterator[None]:
    """Run the block's matrix products on the configured device at the configured precision (FP32:
    unchanged; other devices' operations: unchanged)."""
    if _autocast is None:
        yield
        return
    device, dtype = _autocast
    with torch.autocast(device, dtype=dtype):
        yield


def decoding_copy(model, setting: Precision = "fp32"):
    """The model that generates text for ``model`` at ``setting`` (resolved on its device): ``model``
    itself at FP32; at BF16 a copy whose decoder holds BF16 weights while its LM head stays FP32 on the
    original weight (a BF16 logit's rounding, about 0.06 at 16, would reorder near-ties and blur the
    teacher's top-k targets). Autocast would cast every weight at every step; a copy casts them once.
    Only parameters are cast: buffers such as the rotary frequencies stay FP32 (in BF16 a frequency's
    rounding, up to 2^-9 of it, turns into an angle error that grows with the position)."""
    if resolve(setting, model.device.type) == "fp32":
        return model
    head = model.get_output_embeddings()
    bf16 = copy.deepcopy(model)
    for parameter in bf16.parameters():
        parameter.data = parameter.data.to(torch.bfloat16)
    fp32_head = torch.nn.Linear(head.in_features, head.out_features, bias=False, device=model.device)
    fp32_head.weight = head.weight  # shared, not copied: the copy lives for one generation pass
    if head.bias is not None:
        fp32_head.bias = head.bias
    fp32_head.register_forward_pre_hook(lambda _module, args: (args[0].float(), *args[1:]))
    bf16.set_output_embeddings(fp32_head)
    bf16.config.tie_word_embeddings = False
    return bf16.eval()
