"""Training and scoring batches: examples -> token sequences -> length-sorted, right-padded tensors."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from ..prompts import render_scoring_prompt
from ..tokenization import PromptTokenizer


def encode_examples(examples: Sequence, tokenizer: PromptTokenizer) -> list[list[int]]:
    """Token ids of each example's scoring prompt (examples have ``member`` and ``item``)."""
    return tokenizer.encode([render_scoring_prompt(e.member, e.item) for e in examples])


def pad_right(sequences: Sequence[Sequence[int]], pad_token_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) int64, right-padded to the longest sequence."""
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    return ids, mask


def batch_indices(
    lengths: Sequence[int], batch_size: int, *, shuffle: bool, seed: int = 0, bucket_window: int = 50
) -> list[np.ndarray]:
    """Index batches of similar length (little padding). With ``shuffle``, lengths are sorted within
    random windows of ``bucket_window`` batches and the batch order is shuffled; else sorted by length."""
    lengths = np.asarray(lengths)
    if not shuffle:
        order = np.argsort(lengths, kind="stable")
    else:
        rng = np.random.default_rng(seed)
        order = rng.permutation(len(lengths))
        window = batch_size * bucket_window
        for start in range(0, len(order), window):
            chunk = order[start : start + window]
            order[start : start + window] = chunk[np.argsort(lengths[chunk], kind="stable")]
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if shuffle:
        np.random.default_rng(seed + 1).shuffle(batches)
    return batches


def iterate_padded(
    sequences: Sequence[Sequence[int]], batches: list[np.ndarray]
) -> Iterator[tuple[np.ndarray, torch.Tensor, torch.Tensor]]:
    """(indices, input_ids, attention_mask) per index batch."""
    for indices in batches:
        ids, mask = pad_right([sequences[i] for i in indices])
        yield indices, ids, mask
