"""A scorer cut in two: the frozen bottom layers run once per example, the top layers are trained.

Fine-tuning only the top layers of a 30-layer teacher on a CPU is affordable when the bottom layers'
output is computed once and kept (as float16), instead of on every epoch and every evaluation. The
cut reuses the model's own forward (its layers are swapped for the slice), so rotary embeddings and
masks are computed exactly as in the full model.

The build runs it multi-item (``MemberHiddenCache``, ``top_logits_multi``, ``multi_item_logits``): one
member prefix and that member's item suffixes per row, the prefix computed once (``MultiItemScorer``),
each item's logits equal to the single-sequence graph's on ``prefix + item``. The single-sequence
``HiddenCache``/``top_logits``/``graph_logits`` stay for code that scores plain sequences.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from ..models.multi_item import MultiItemScorer
from ..models.scorer_graph import ScorerGraph
from .batches import (
    MemberGroup,
    MultiItemBatch,
    batch_indices,
    iterate_member_batches,
    iterate_padded,
    member_batches,
)


@contextlib.contextmanager
def _swapped(body: nn.Module, layers: nn.ModuleList, norm: nn.Module):
    old_layers, old_norm = body.layers, body.norm
    body.layers, body.norm = layers, norm
    try:
        yield
    finally:
        body.layers, body.norm = old_layers, old_norm


class SplitScorer:
    """``graph`` cut after ``cut`` decoder layers (0 <= cut < number of layers)."""

    def __init__(self, graph: ScorerGraph, cut: int):
        layers = graph.body.layers
        if not 0 <= cut < len(layers):
            raise ValueError(f"cut: {cut} is outside [0, {len(layers) - 1}]")
        self.graph = graph
        self.cut = cut
        self.bottom_layers = nn.ModuleList(list(layers[:cut]))
        self.top_layers = nn.ModuleList(list(layers[cut:]))
        self._multi: MultiItemScorer | None = None

    @property
    def multi(self) -> MultiItemScorer:
        """The graph run multi-item (built on first use: it supports Llama-style decoders only)."""
        if self._multi is None:
            self._multi = MultiItemScorer(self.graph)
        return self._multi

    @torch.no_grad()
    def bottom_hidden_multi(self, batch: MultiItemBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefix [B, P, D] and item [B, N, L, D] hidden states after the bottom layers (no final norm)."""
        embed = self.graph.body.embed_tokens
        return self.multi.run_layers(
            embed(batch.prefix_ids),
            batch.prefix_mask,
            embed(batch.item_ids),
            batch.item_mask,
            self.bottom_layers,
        )

    def top_label_logits_multi(
        self, prefix_h: torch.Tensor, prefix_mask: torch.Tensor, item_h: torch.Tensor, item_mask: torch.Tensor
    ) -> torch.Tensor:
        """(yes, no) logits [B, N, 2] from bottom hidden states (gradients through prefix and items)."""
        _, item_out = self.multi.run_layers(
            prefix_h, prefix_mask, item_h, item_mask, self.top_layers, prefix_out=False
        )
        return self.multi.head_logits(item_out, item_mask)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The top layers and the final norm (the label rows stay tied to the LM head)."""
        return [*self.top_layers.parameters(), *self.graph.body.norm.parameters()]

    def freeze_bottom(self) -> None:
        """Only the top layers and the final norm keep ``requires_grad``."""
        for parameter in self.graph.parameters():
            parameter.requires_grad_(False)
        for parameter in self.trainable_parameters():
            parameter.requires_grad_(True)

    @torch.no_grad()
    def bottom_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Hidden states after the bottom layers (before the final norm) [batch, seq, hidden]."""
        body = self.graph.body
        with _swapped(body, self.bottom_layers, nn.Identity()):
            return body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state

    def top_label_logits(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(yes, no) logits [batch, 2] from bottom hidden states."""
        body = self.graph.body
        with _swapped(body, self.top_layers, body.norm):
            out = body(inputs_embeds=hidden, attention_mask=attention_mask, use_cache=False).last_hidden_state
        last = attention_mask.sum(dim=1) - 1
        rows = torch.arange(out.shape[0], device=out.device)
        return self.graph.label_head(out[rows, last]) * self.graph.logit_scale


class HiddenCache:
    """Bottom-layer outputs of many sequences, each trimmed to its length, stored as float16."""

    def __init__(
        self, split: SplitScorer, sequences: Sequence[Sequence[int]], batch_size: int = 16, progress=None
    ):
        self.hidden: list[torch.Tensor] = [torch.empty(0)] * len(sequences)
        lengths = [len(s) for s in sequences]
        for indices, ids, mask in iterate_padded(
            sequences, batch_indices(lengths, batch_size, shuffle=False)
        ):
            states = split.bottom_hidden(ids, mask)
            for row, index in enumerate(indices):
                self.hidden[index] = states[row, : lengths[index]].to(torch.float16).clone()
            if progress is not None:
                progress(len(indices))

    def __len__(self) -> int:
        return len(self.hidden)

    def batch(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden [b, max_len, d] float32, attention_mask [b, max_len]) right-padded."""
        rows = [self.hidden[i] for i in indices]
        length = max(r.shape[0] for r in rows)
        hidden = torch.zeros((len(rows), length, rows[0].shape[1]), dtype=torch.float32)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for row, states in enumerate(rows):
            hidden[row, : states.shape[0]] = states.float()
            mask[row, : states.shape[0]] = 1
        return hidden, mask

    def lengths(self) -> list[int]:
        return [h.shape[0] for h in self.hidden]


@torch.no_grad()
def top_logits(split: SplitScorer, cache: HiddenCache, batch_size: int = 32) -> np.ndarray:
    """(yes, no) logits [n, 2] of every cached example through the top layers."""
    out = np.zeros((len(cache), 2), dtype=np.float32)
    for indices in batch_indices(cache.lengths(), batch_size, shuffle=False):
        hidden, mask = cache.batch(indices)
        out[indices] = split.top_label_logits(hidden, mask).numpy()
    return out


@torch.no_grad()
def graph_logits(
    graph: ScorerGraph, sequences: Sequence[Sequence[int]], batch_size: int = 16, progress=None
) -> np.ndarray:
    """(yes, no) logits [n, 2] of the full scorer on token sequences (length-sorted batches)."""
    graph.eval()
    out = np.zeros((len(sequences), 2), dtype=np.float32)
    lengths = [len(s) for s in sequences]
    for indices, ids, mask in iterate_padded(sequences, batch_indices(lengths, batch_size, shuffle=False)):
        out[indices] = graph.label_logits(ids, mask).numpy()
        if progress is not None:
            progress(len(indices))
    return out


class MemberHiddenCache:
    """Bottom-layer outputs per member group: the prefix's states [P, D] once and each item's [L, D],
    trimmed to their lengths and stored as ``dtype`` (float16: half the memory, about 1e-3 on logits)."""

    def __init__(
        self,
        split: SplitScorer,
        groups: Sequence[MemberGroup],
        batch_size: int = 32,
        progress=None,
        dtype: torch.dtype = torch.float16,
    ):
        self.groups = list(groups)
        self.prefix: list[torch.Tensor] = [torch.empty(0)] * len(self.groups)
        self.items: list[list[torch.Tensor]] = [[] for _ in self.groups]
        chosen_batches = member_batches(self.groups, batch_size, shuffle=False)
        for chosen, batch in zip(
            chosen_batches, iterate_member_batches(self.groups, chosen_batches), strict=True
        ):
            prefix_h, item_h = split.bottom_hidden_multi(batch)
            for row, g in enumerate(chosen):
                group = self.groups[g]
                self.prefix[g] = prefix_h[row, : len(group.prefix)].to(dtype).clone()
                self.items[g] = [
                    item_h[row, j, : len(t)].to(dtype).clone() for j, t in enumerate(group.items)
                ]
            if progress is not None:
                progress(len(batch.indices))

    def __len__(self) -> int:
        """Examples cached (items of every group)."""
        return sum(len(g) for g in self.groups)

    def batch(self, chosen: Sequence[int]):
        """(example indices, prefix_h [B, P, D] float32, prefix_mask [B, P], item_h [B, N, L, D],
        item_mask [B, N, L], valid [B, N]) right-padded, for groups ``chosen``."""
        prefixes = [self.prefix[g] for g in chosen]
        items = [self.items[g] for g in chosen]
        hidden = prefixes[0].shape[1]
        plen = max(p.shape[0] for p in prefixes)
        count = max(len(i) for i in items)
        length = max(t.shape[0] for group in items for t in group)
        prefix_h = torch.zeros((len(chosen), plen, hidden), dtype=torch.float32)
        prefix_mask = torch.zeros((len(chosen), plen), dtype=torch.long)
        item_h = torch.zeros((len(chosen), count, length, hidden), dtype=torch.float32)
        item_mask = torch.zeros((len(chosen), count, length), dtype=torch.long)
        valid = torch.zeros((len(chosen), count), dtype=torch.bool)
        for row, (prefix, group) in enumerate(zip(prefixes, items, strict=True)):
            prefix_h[row, : prefix.shape[0]] = prefix.float()
            prefix_mask[row, : prefix.shape[0]] = 1
            for j, states in enumerate(group):
                item_h[row, j, : states.shape[0]] = states.float()
                item_mask[row, j, : states.shape[0]] = 1
            valid[row, : len(group)] = True
        indices = np.concatenate([self.groups[g].indices for g in chosen])
        return indices, prefix_h, prefix_mask, item_h, item_mask, valid


@torch.no_grad()
def top_logits_multi(split: SplitScorer, cache: MemberHiddenCache, batch_size: int = 32) -> np.ndarray:
    """(yes, no) logits [n, 2] of every cached example (by its index) through the top layers."""
    out = np.zeros((len(cache), 2), dtype=np.float32)
    for chosen in member_batches(cache.groups, batch_size, shuffle=False):
        indices, prefix_h, prefix_mask, item_h, item_mask, valid = cache.batch(chosen)
        logits = split.top_label_logits_multi(prefix_h, prefix_mask, item_h, item_mask)
        out[indices] = logits[valid].numpy()
    return out


@torch.no_grad()
def multi_item_logits(
    graph: ScorerGraph, groups: Sequence[MemberGroup], batch_size: int = 32, progress=None
) -> np.ndarray:
    """(yes, no) logits [n, 2] of the full scorer run multi-item over member groups (one prefix pass per
    member); row ``i`` is example ``i`` (the groups' indices cover 0..n-1)."""
    graph.eval()
    scorer = MultiItemScorer(graph)
    out = np.zeros((sum(len(g) for g in groups), 2), dtype=np.float32)
    for batch in iterate_member_batches(groups, member_batches(groups, batch_size, shuffle=False)):
        out[batch.indices] = scorer.label_logits(*batch.tensors())[batch.valid].numpy()
        if progress is not None:
            progress(len(batch.indices))
    return out
