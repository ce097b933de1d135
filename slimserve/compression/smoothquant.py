"""SmoothQuant (Xiao et al., ICML 2023, arXiv 2211.10438) for Llama-style decoders, before INT8 Q/DQ.

INT8 activations are quantized per tensor, so a few outlier channels waste the range of all the others.
SmoothQuant moves that difficulty into the weights, which are quantized per channel: for every input
channel ``j`` of the linears fed by an RMSNorm, ``s_j = max|X_j|^alpha / max|W_:,j|^(1 - alpha)``; the
norm's weight is divided by ``s`` and the linears' columns multiplied by it. The model computes the same
function (exactly, up to float rounding) and its activations become easy to quantize. Model Optimizer's
ONNX PTQ then adds the Q/DQ nodes to the smoothed graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import BuildError
from .batches import pad_right
from .surgery import decoder_layers


@dataclass(frozen=True)
class SmoothedPair:
    """One norm and the linears it feeds."""

    norm: nn.Module
    linears: tuple[nn.Linear, ...]
    name: str


def smoothing_pairs(model: nn.Module) -> list[SmoothedPair]:
    """(input_layernorm -> q/k/v) and (post_attention_layernorm -> gate/up) of every decoder layer."""
    pairs = []
    for index, layer in enumerate(decoder_layers(model)):
        try:
            attn, mlp = layer.self_attn, layer.mlp
            pairs.append(
                SmoothedPair(
                    layer.input_layernorm, (attn.q_proj, attn.k_proj, attn.v_proj), f"layers.{index}.attn"
                )
            )
            pairs.append(
                SmoothedPair(
                    layer.post_attention_layernorm, (mlp.gate_proj, mlp.up_proj), f"layers.{index}.mlp"
                )
            )
        except AttributeError as exc:
            raise BuildError(
                f"SmoothQuant supports Llama-style decoders (input_layernorm, q/k/v_proj, post_attention_layernorm, "
                f"gate/up_proj); layer {index} lacks {exc.name!r}: set tensorrt.smoothquant_alpha to 0"
            ) from None
    return pairs


@torch.no_grad()
def activation_absmax(
    model: nn.Module, pairs: list[SmoothedPair], sequences: Sequence[Sequence[int]], batch_size: int = 8
) -> list[torch.Tensor]:
    """Per-channel max |activation| at each pair's norm output, over the real (unpadded) tokens."""
    maxima: list[torch.Tensor | None] = [None] * len(pairs)
    current_mask: dict[str, torch.Tensor] = {}
    device = next(model.parameters()).device

    def hook(index):
        def record(_module, _inputs, output):
            real = output[current_mask["mask"].bool()].abs().float()
            value = real.amax(dim=0) if real.numel() else torch.zeros(output.shape[-1], device=output.device)
            maxima[index] = value if maxima[index] is None else torch.maximum(maxima[index], value)

        return record

    handles = [pair.norm.register_forward_hook(hook(i)) for i, pair in enumerate(pairs)]
    try:
        for start in range(0, len(sequences), batch_size):
            ids, mask = pad_right(sequences[start : start + batch_size])
            current_mask["mask"] = mask.to(device)
            model(input_ids=ids.to(device), attention_mask=current_mask["mask"], use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    if any(m is None for m in maxima):
        raise BuildError("SmoothQuant calibration saw no activations (no calibration prompts?)")
    return [m for m in maxima if m is not None]


@torch.no_grad()
def smooth_model(
    model: nn.Module, sequences: Sequence[Sequence[int]], alpha: float = 0.5, batch_size: int = 8
) -> dict[str, float]:
    """Smooth ``model`` in place on calibration ``sequences``; returns each pair's activation range ratio
    (max channel / median channel) after smoothing, a measure of how easy the activations now are."""
    if not 0 < alpha <= 1:
        raise ValueError(f"smoothquant alpha must be in (0, 1], got {alpha}")
    model.eval()
    pairs = smoothing_pairs(model)
    maxima = activation_absmax(model, pairs, sequences, batch_size)
    spread = {}
    for pair, act_max in zip(pairs, maxima, strict=True):
        weight_max = torch.cat([lin.weight.abs() for lin in pair.linears], dim=0).amax(dim=0).float()
        scales = (act_max.clamp(min=1e-5).pow(alpha) / weight_max.clamp(min=1e-5).pow(1 - alpha)).clamp(
            min=1e-5
        )
        pair.norm.weight.div_(scales.to(pair.norm.weight.dtype))
        for linear in pair.linears:
            linear.weight.mul_(scales.to(linear.weight.dtype)[None, :])
        smoothed = act_max / scales
        spread[pair.name] = float(smoothed.max() / smoothed.median().clamp(min=1e-12))
    return spread
