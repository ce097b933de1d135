"""A scorer cut in two: the frozen bottom layers run once per example, the top layers are trained.

Fine-tuning only the top layers of a 30-layer teacher on a CPU is affordable when the bottom layers'
output is computed once and kept (as float16), instead of on every epoch and every evaluation. The
cut reuses the model's own forward (its layers are swapped for the slice), so rotary embeddings and
masks are computed exactly as in the full model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from ..export.scorer_graph import ScorerGraph
from .batches import batch_indices, iterate_padded


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
