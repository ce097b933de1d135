"""Training and scoring batches: examples -> token sequences -> length-sorted, right-padded tensors.

Two layouts: single sequences (``prefix + item`` per example, what the single-sequence graph, the ONNX
export and INT8 use) and member groups (one member prefix and the item suffixes of that member's
examples, what multi-item scoring runs: one prefix pass per member).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..tokenization import PromptTokenizer, pad_multi_item


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


@dataclass(frozen=True)
class MemberGroup:
    """One member's examples of a split: the member prefix, the item suffix of each example (order kept)
    and the examples' indices in the split. The model input of ``indices[j]`` is ``prefix + items[j]``."""

    prefix: list[int]
    items: list[list[int]]
    indices: np.ndarray

    def __len__(self) -> int:
        return len(self.items)

    def shifted(self, offset: int) -> MemberGroup:
        """The same group with its indices moved by ``offset`` (splits concatenated)."""
        return replace(self, indices=self.indices + offset)


def encode_member_groups(
    examples: Sequence, tokenizer: PromptTokenizer, split
) -> tuple[list[MemberGroup], list[list[int]]]:
    """Examples grouped by member (groups in order of first appearance, examples in their order), each
    tokenized by ``encode_scoring`` with ``split``; also every example's single sequence ``prefix + item``,
    exactly ``encode_scoring(...).sequences()``, in example order."""
    from ..scoring_tokens import encode_scoring

    by_member: dict[object, list[int]] = {}
    for index, example in enumerate(examples):
        by_member.setdefault(example.member, []).append(index)
    groups: list[MemberGroup] = []
    sequences: list[list[int]] = [[] for _ in examples]
    for member, indices in by_member.items():
        tokens = encode_scoring(tokenizer, member, [examples[i].item for i in indices], split)
        for index, sequence in zip(indices, tokens.sequences(), strict=True):
            sequences[index] = sequence
        groups.append(MemberGroup(tokens.prefix, tokens.items, np.asarray(indices, dtype=np.int64)))
    return groups, sequences


def merge_groups(groups: Sequence[MemberGroup]) -> list[MemberGroup]:
    """Groups with the same prefix tokens joined into one (a member's labelled examples and its pool
    pairs then share one prefix pass); first-appearance order kept."""
    merged: dict[tuple[int, ...], list[MemberGroup]] = {}
    for group in groups:
        merged.setdefault(tuple(group.prefix), []).append(group)
    return [
        parts[0]
        if len(parts) == 1
        else MemberGroup(
            parts[0].prefix,
            [item for part in parts for item in part.items],
            np.concatenate([part.indices for part in parts]),
        )
        for parts in merged.values()
    ]


def pack_groups(sizes: Sequence[int], order: Sequence[int], batch_size: int) -> list[np.ndarray]:
    """Consecutive groups of ``order`` packed into batches of at most ``batch_size`` examples (a group
    larger than that is a batch alone)."""
    batches: list[np.ndarray] = []
    current: list[int] = []
    count = 0
    for group in order:
        size = int(sizes[group])
        if current and count + size > batch_size:
            batches.append(np.asarray(current, dtype=np.int64))
            current, count = [], 0
        current.append(int(group))
        count += size
    if current:
        batches.append(np.asarray(current, dtype=np.int64))
    return batches


def member_batches(
    groups: Sequence[MemberGroup],
    batch_size: int,
    *,
    shuffle: bool,
    seed: int = 0,
    bucket_window: int = 50,
) -> list[np.ndarray]:
    """Batches of whole member groups (group indices), about ``batch_size`` examples each.

    Groups are sorted by (item count, prefix length, longest item) so a batch pads little: globally
    without ``shuffle``; with it, within random windows of ``bucket_window`` batches, then the batch order
    is shuffled (seeded, like ``batch_indices``). Every group is in exactly one batch.
    """
    sizes = np.asarray([len(g) for g in groups])
    keys = [(len(g), len(g.prefix), max(map(len, g.items))) for g in groups]
    if not shuffle:
        order = sorted(range(len(groups)), key=keys.__getitem__)
        return pack_groups(sizes, order, batch_size)
    rng = np.random.default_rng(seed)
    permuted = rng.permutation(len(groups)).tolist()
    mean = max(1.0, float(sizes.mean())) if len(groups) else 1.0
    window = max(1, round(batch_size * bucket_window / mean))
    order = []
    for start in range(0, len(permuted), window):
        order += sorted(permuted[start : start + window], key=keys.__getitem__)
    batches = pack_groups(sizes, order, batch_size)
    np.random.default_rng(seed + 1).shuffle(batches)
    return batches


@dataclass
class MultiItemBatch:
    """Member groups as multi-item tensors (int64, right-padded): ``prefix_ids``/``prefix_mask`` [B, P],
    ``item_ids``/``item_mask`` [B, N, L]; ``indices`` are the examples of the real items in row-major
    (member, item) order, which is the order of ``logits[valid]`` for [B, N, ...] outputs."""

    indices: np.ndarray
    prefix_ids: torch.Tensor
    prefix_mask: torch.Tensor
    item_ids: torch.Tensor
    item_mask: torch.Tensor
    valid: torch.Tensor  # [B, N] bool: real items

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.prefix_ids, self.prefix_mask, self.item_ids, self.item_mask


def multi_item_batch(groups: Sequence[MemberGroup], chosen: Sequence[int]) -> MultiItemBatch:
    """The tensors of groups ``chosen``."""
    parts = [groups[g] for g in chosen]
    arrays = pad_multi_item([p.prefix for p in parts], [p.items for p in parts])
    prefix_ids, prefix_mask, item_ids, item_mask = (torch.from_numpy(a) for a in arrays)
    valid = torch.zeros(item_mask.shape[:2], dtype=torch.bool)
    for row, part in enumerate(parts):
        valid[row, : len(part)] = True
    indices = np.concatenate([p.indices for p in parts])
    return MultiItemBatch(indices, prefix_ids, prefix_mask, item_ids, item_mask, valid)


def iterate_member_batches(
    groups: Sequence[MemberGroup], batches: list[np.ndarray]
) -> Iterator[MultiItemBatch]:
    for chosen in batches:
        yield multi_item_batch(groups, chosen)
