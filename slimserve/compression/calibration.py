"""Calibration statistics for pruning: input Gram matrices of linear layers and layer-skip importance.

Batches are ``(input_ids, attention_mask)`` int64 [batch, seq] pairs (right-padded), or
``MultiItemCalibration`` batches (member prefixes and their item suffixes, run multi-item: one prefix
pass per member). Only real tokens (mask == 1) count, prefix and item tokens alike. Activations are
never stored: hooks fold each batch into float64 Grams.

Multi-item batches call each layer's ``o_proj`` and MLP twice, prefix first, then the items
(``MultiItemScorer._layer``); the Gram hooks count the calls per module to take the matching mask and
check its shape.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)


@dataclass
class MultiItemCalibration:
    """Member prefixes [B, P] and their item suffixes [B, N, L] (int64, right-padded)."""

    prefix_ids: torch.Tensor
    prefix_mask: torch.Tensor
    item_ids: torch.Tensor
    item_mask: torch.Tensor

    def real_tokens(self) -> int:
        return int(self.prefix_mask.sum()) + int(self.item_mask.sum())


CalibrationBatch = tuple[torch.Tensor, torch.Tensor] | MultiItemCalibration


def _real_tokens(batch: CalibrationBatch) -> int:
    return batch.real_tokens() if isinstance(batch, MultiItemCalibration) else int(batch[1].sum())


def _multi_item(batch: MultiItemCalibration) -> MultiItemCalibration:
    parts = [torch.as_tensor(t, dtype=torch.long) for t in (batch.prefix_ids, batch.prefix_mask)]
    items = [torch.as_tensor(t, dtype=torch.long) for t in (batch.item_ids, batch.item_mask)]
    if parts[0].shape != parts[1].shape or parts[0].dim() != 2:
        raise ValueError(
            f"calibration prefix shapes {tuple(parts[0].shape)} and {tuple(parts[1].shape)} differ"
        )
    if items[0].shape != items[1].shape or items[0].dim() != 3 or items[0].shape[0] != parts[0].shape[0]:
        raise ValueError(
            f"calibration item shapes {tuple(items[0].shape)} and {tuple(items[1].shape)} do not match "
            f"prefixes {tuple(parts[0].shape)}"
        )
    return MultiItemCalibration(*parts, *items)


def as_batches(batches: Iterable) -> list[CalibrationBatch]:
    """Normalise ``(ids, mask)`` pairs, ``{"input_ids", "attention_mask"}`` mappings and
    ``MultiItemCalibration`` batches to int64 tensors."""
    result: list[CalibrationBatch] = []
    for batch in batches:
        if isinstance(batch, MultiItemCalibration):
            result.append(_multi_item(batch))
            continue
        ids, mask = (batch["input_ids"], batch["attention_mask"]) if isinstance(batch, Mapping) else batch
        ids, mask = torch.as_tensor(ids, dtype=torch.long), torch.as_tensor(mask, dtype=torch.long)
        if ids.shape != mask.shape or ids.dim() != 2:
            raise ValueError(f"calibration batch shapes {tuple(ids.shape)} and {tuple(mask.shape)} differ")
        result.append((ids, mask))
    if not result or not sum(_real_tokens(b) for b in result):
        raise ValueError("calibration_batches holds no real tokens")
    return result


def token_count(batches: Sequence[CalibrationBatch]) -> int:
    return sum(_real_tokens(b) for b in batches)


def first_tokens(batches: Sequence[CalibrationBatch], tokens: int) -> list[CalibrationBatch]:
    """The leading batches that hold at least ``tokens`` real tokens (all of them if fewer)."""
    chosen, seen = [], 0
    for batch in batches:
        if seen >= tokens:
            break
        chosen.append(batch)
        seen += _real_tokens(batch)
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


class _Decoder(nn.Module):
    """A decoder in the shape ``MultiItemScorer`` reads (``.body``); no label head is needed."""

    def __init__(self, decoder: nn.Module):
        super().__init__()
        self.body = decoder


def _multi_item_scorer(decoder: nn.Module):
    from ..models.multi_item import MultiItemScorer

    return MultiItemScorer(_Decoder(decoder))


def _run_multi_item(scorer, batch: MultiItemCalibration, layers):
    embed = scorer.body.embed_tokens
    return scorer.run_layers(
        embed(batch.prefix_ids), batch.prefix_mask, embed(batch.item_ids), batch.item_mask, layers
    )


@torch.no_grad()
def input_grams(
    model: nn.Module, batches: Sequence[CalibrationBatch], modules: Mapping[str, nn.Module]
) -> dict[str, torch.Tensor]:
    """``G = X^T X`` (float64) of each module's input ``X`` [real tokens, in_features], one pass."""
    grams: dict[str, torch.Tensor] = {}
    state: dict = {}
    calls: dict[str, int] = {}

    def hook_for(name: str):
        def hook(_module, args):
            masks = state["masks"]
            mask = masks[calls[name] % len(masks)]  # multi-item: prefix call, then the items' call
            calls[name] += 1
            if tuple(args[0].shape[:-1]) != tuple(mask.shape):
                raise RuntimeError(
                    f"calibration hook on {name}: input {tuple(args[0].shape)} does not match the "
                    f"expected token layout {tuple(mask.shape)}"
                )
            x = args[0][mask].double()
            if name not in grams:
                grams[name] = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float64)
            grams[name].addmm_(x.T, x)

        return hook

    handles = [module.register_forward_pre_hook(hook_for(name)) for name, module in modules.items()]
    try:
        decoder = decoder_of(model)
        scorer = None
        for index, batch in enumerate(batches):
            calls.update(dict.fromkeys(modules, 0))
            if isinstance(batch, MultiItemCalibration):
                scorer = scorer or _multi_item_scorer(decoder)
                item_mask = batch.item_mask.reshape(-1, batch.item_mask.shape[-1])
                state["masks"] = (batch.prefix_mask.bool(), item_mask.bool())
                _run_multi_item(scorer, batch, decoder.layers)
            else:
                ids, mask = batch
                state["masks"] = (mask.bool(),)
                decoder(input_ids=ids, attention_mask=mask, use_cache=False)
            expected = len(state["masks"])
            if any(count != expected for count in calls.values()):
                raise RuntimeError(f"calibration hooks saw {calls} calls per module, expected {expected}")
            log.info("calibration batch %d/%d (%d tokens)", index + 1, len(batches), _real_tokens(batch))
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
    multi = [b for b in batches if isinstance(b, MultiItemCalibration)]
    if multi:
        energy, errors = _multi_item_skip_errors(decoder, multi)
    for batch in batches:
        if isinstance(batch, MultiItemCalibration):
            continue
        ids, mask = batch
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


def _multi_item_skip_errors(decoder: nn.Module, batches: Sequence[MultiItemCalibration]):
    """``layer_skip_importance``'s sums (energy, error per layer) on multi-item batches: every layer's
    input recorded in one pass, then layers ``l+1..`` re-run from layer ``l``'s input."""
    scorer = _multi_item_scorer(decoder)
    layers = list(decoder.layers)
    errors = [0.0] * len(layers)
    energy = 0.0
    for batch in batches:
        embed = decoder.embed_tokens
        hidden = (embed(batch.prefix_ids), embed(batch.item_ids))
        inputs = []
        for layer in layers:
            inputs.append(hidden)
            hidden = scorer.run_layers(hidden[0], batch.prefix_mask, hidden[1], batch.item_mask, [layer])
        prefix_real, item_real = batch.prefix_mask.bool(), batch.item_mask.bool()

        def final(states, prefix_real=prefix_real, item_real=item_real):
            prefix_h, item_h = states
            return torch.cat([decoder.norm(prefix_h)[prefix_real], decoder.norm(item_h)[item_real]]).double()

        base = final(hidden)
        energy += float((base**2).sum())
        for skipped in range(len(layers)):
            prefix_h, item_h = inputs[skipped]
            states = scorer.run_layers(
                prefix_h, batch.prefix_mask, item_h, batch.item_mask, layers[skipped + 1 :]
            )
            errors[skipped] += float(((final(states) - base) ** 2).sum())
    return energy, errors
