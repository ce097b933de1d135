"""Calibration statistics for pruning: input Gram matrices of linear layers and layer-skip importance.

Batches are ``(input_ids, attention_mask)`` int64 [batch, seq] pairs (right-padded); only real tokens
(``mask == 1``) count. Activations are never stored: hooks fold each batch into float64 Grams.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)

CalibrationBatch = tuple[torch.Tensor, torch.Tensor]


def as_batches(batches: Iterable) -> list[CalibrationBatch]:
    """Normalise ``(ids, mask)`` pairs or ``{"input_ids", "attention_mask"}`` mappings to int64 tensors."""
    result = []
    for batch in batches:
        ids, mask = (batch["input_ids"], batch["attention_mask"]) if isinstance(batch, Mapping) else batch
        ids, mask = torch.as_tensor(ids, dtype=torch.long), torch.as_tensor(mask, dtype=torch.long)
        if ids.shape != mask.shape or ids.dim() != 2:
            raise ValueError(f"calibration batch shapes {tuple(ids.shape)} and {tuple(mask.shape)} differ")
        result.append((ids, mask))
    if not result or not sum(int(mask.sum()) for _, mask in result):
        raise ValueError("calibration_batches holds no real tokens")
    return result


def token_count(batches: Sequence[CalibrationBatch]) -> int:
    return sum(int(mask.sum()) for _, mask in batches)


def first_tokens(batches: Sequence[CalibrationBatch], tokens: int) -> list[CalibrationBatch]:
    """The leading batches that hold at least ``tokens`` real tokens (all of them if fewer)."""
    chosen, seen = [], 0
    for batch in batches:
        if seen >= tokens:
            break
        chosen.append(batch)
        seen += int(batch[1].sum())
    return chosen


def batches_from_prompts(
    tokenizer_file: Path, prompts: Sequence[str], batch_size: int = 8, max_length: int = 256
) -> list[CalibrationBatch]:
    """Tokenize ``prompts`` (serving tokenizer, head+tail truncation) into right-padded batches."""
    from ..tokenization import PromptTokenizer, pad_batch

    sequences = PromptTokenizer(tokenizer_file, max_length=max_length).encode(list(prompts))
    batches = []
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start : start + batch_size]
        ids, mask = pad_batch(chunk, max(len(s) for s in chunk))
        batches.append((torch.from_numpy(ids), torch.from_numpy(mask)))
    return batches


def decoder_of(model: nn.Module) -> nn.Module:
    return model.get_decoder() if hasattr(model, "get_decoder") else model.model


@torch.no_grad()
def input_grams(
    model: nn.Module, batches: Sequence[CalibrationBatch], modules: Mapping[str, nn.Module]
) -> dict[str, torch.Tensor]:
    """``G = X^T X`` (float64) of each module's input ``X`` [real tokens, in_features], one pass."""
    grams: dict[str, torch.Tensor] = {}
    state: dict[str, torch.Tensor] = {}

    def hook_for(name: str):
        def hook(_module, args):
            x = args[0][state["mask"]].double()
            if name not in grams:
                grams[name] = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64)
            grams[name].addmm_(x.T, x)

        return hook

    handles = [module.register_forward_pre_hook(hook_for(name)) for name, module in modules.items()]
    try:
        decoder = decoder_of(model)
        for index, (ids, mask) in enumerate(batches):
            state["mask"] = mask.bool()
            decoder(input_ids=ids, attention_mask=mask, use_cache=False)
            log.info("calibration batch %d/%d (%d tokens)", index + 1, len(batches), int(mask.sum()))
    finally:
        for handle in handles:
            handle.remove()
    return grams


def _hidden(output) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


@torch.no_grad()
def layer_skip_importance(model: nn.Module, batches: Sequence[CalibrationBatch]) -> list[float]:
    """Per decoder layer: relative error of the final (normed) hidden states when that layer is skipped.

    One pass records every layer's input; skipping layer ``l`` then re-runs only layers ``l+1..`` from
    the recorded input of ``l`` (about L/2 forward passes in all, not L).
    """
    decoder = decoder_of(model)
    layers = list(decoder.layers)
    errors = [0.0] * len(layers)
    energy = 0.0
    for ids, mask in batches:
        inputs: list[torch.Tensor] = []
        calls: dict[str, object] = {}

        def record(_module, args, kwargs, inputs=inputs, calls=calls):
            inputs.append(args[0] if args else kwargs["hidden_states"])
            calls.setdefault("args", args[1:])
            calls.setdefault("kwargs", {k: v for k, v in kwargs.items() if k != "hidden_states"})

        handles = [layer.register_forward_pre_hook(record, with_kwargs=True) for layer in layers]
        try:
            base = decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        finally:
            for handle in handles:
                handle.remove()
        real = mask.bool()
        energy += float((base[real].double() ** 2).sum())
        for skipped in range(len(layers)):
            hidden = inputs[skipped]
            for layer in layers[skipped + 1 :]:
                hidden = _hidden(layer(hidden, *calls["args"], **calls["kwargs"]))
            diff = decoder.norm(hidden)[real].double() - base[real].double()
            errors[skipped] += float((diff**2).sum())
    return [error / max(energy, 1e-300) for error in errors]
