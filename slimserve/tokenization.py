"""Prompt tokenization and length-bucket padding, shared by the export and the services.

Uses the fast Rust ``tokenizers`` library only (no transformers), so the services stay small. Sequences
are right-padded to the smallest bucket that holds them; Triton's dynamic batcher only merges requests
of equal shape, so a few buckets keep batches large.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

# Tokens kept from the end of an over-long prompt: the question and the answer cue must survive.
TAIL_TOKENS = 24
# Words the tokenizer's BPE cache keeps (the library's default, 10,000, let a service's resident memory grow
# by about 30 MiB under varied input, e.g. the fuzz case of `bench faults`; the prompt templates' words
# still hit this many). docs/faults.md, "Where the fuzz case's RSS growth came from".
WORD_CACHE_CAPACITY = 1000
# Most values of the generator model's ``copy_names`` input (its ``MAX_COPY_NAME_IDS``).
MAX_COPY_NAME_VALUES = 2048


def load_tokenizer(tokenizer_file: Path) -> Tokenizer:
    """A ``tokenizers`` tokenizer without padding or truncation, its word cache bounded."""
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    resize = getattr(tokenizer.model, "_resize_cache", None)  # BPE and Unigram models have a word cache
    if resize is not None:
        resize(WORD_CACHE_CAPACITY)
    return tokenizer


def copy_name_ids(tokenizer: Tokenizer, words, max_values: int = MAX_COPY_NAME_VALUES) -> list[list[int]]:
    """The generator's ``copy_names``: each word's token ids as running text spells it (after a space), as
    many words as fit in ``max_values`` (each name's ids and its end mark; the model refuses more)."""
    names, used = [], 0
    for word in words:
        ids = tokenizer.encode(" " + word, add_special_tokens=False).ids
        used += len(ids) + 1
        if used > max_values:
            break
        names.append(ids)
    return names


class PromptTokenizer:
    """Encodes prompts to token ids within a maximum length (head + tail kept when too long)."""

    def __init__(self, tokenizer_file: Path, max_length: int, pad_token_id: int = 0):
        self._tokenizer = load_tokenizer(tokenizer_file)
        self.max_length = max_length
        self.pad_token_id = pad_token_id

    def token_id(self, text: str) -> int:
        """The id of a text that must be exactly one token (a label word)."""
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        if len(ids) != 1:
            raise ValueError(f"{text!r} is {len(ids)} tokens in this tokenizer, expected exactly 1")
        return ids[0]

    def encode(self, prompts: list[str]) -> list[list[int]]:
        """Token ids per prompt, truncated to ``max_length`` keeping head and tail."""
        return self.encode_within(prompts, self.max_length, add_special_tokens=True)

    def encode_within(
        self, texts: list[str], max_length: int, *, add_special_tokens: bool
    ) -> list[list[int]]:
        """Token ids per text, truncated to ``max_length`` keeping head and tail (prompt parts: a member
        prefix starts a sequence and gets the special tokens, an item suffix continues one and does not)."""
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
        return [truncate_head_tail(e.ids, max_length) for e in encodings]


def truncate_head_tail(ids: list[int], max_length: int, tail: int = TAIL_TOKENS) -> list[int]:
    """Cut the middle of a too-long sequence so its start and its last ``tail`` tokens remain."""
    if len(ids) <= max_length:
        return list(ids)
    tail = min(tail, max_length // 2)
    return list(ids[: max_length - tail]) + list(ids[-tail:])


def bucket_for(length: int, buckets: tuple[int, ...] | list[int]) -> int:
    """Smallest bucket holding ``length`` tokens."""
    for bucket in sorted(buckets):
        if length <= bucket:
            return bucket
    raise ValueError(f"sequence of {length} tokens exceeds the largest bucket {max(buckets)}")


def group_by_bucket(sequences: list[list[int]], buckets: tuple[int, ...] | list[int]) -> dict[int, list[int]]:
    """Indices of ``sequences`` grouped by the bucket each one pads to."""
    groups: dict[int, list[int]] = defaultdict(list)
    for index, seq in enumerate(sequences):
        groups[bucket_for(len(seq), buckets)].append(index)
    return dict(groups)


def pad_batch(
    sequences: list[list[int]], length: int, pad_token_id: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad sequences to ``length``: (input_ids, attention_mask), both int64 [n, length]."""
    input_ids = np.full((len(sequences), length), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((len(sequences), length), dtype=np.int64)
    for row, seq in enumerate(sequences):
        if len(seq) > length:
            raise ValueError(f"sequence of {len(seq)} tokens does not fit length {length}")
        input_ids[row, : len(seq)] = seq
        attention_mask[row, : len(seq)] = 1
    return input_ids, attention_mask


def pad_multi_item(
    prefixes: list[list[int]],
    items: list[list[list[int]]],
    item_length: int | None = None,
    pad_token_id: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Multi-item tensors for B members: ``prefix_ids``/``prefix_mask`` [B, P] (P the longest prefix)
    and ``item_ids``/``item_mask`` [B, N, L] (N the most items, L ``item_length`` or the longest item),
    all int64 and right-padded; a member with fewer items gets all-zero mask rows."""
    if not prefixes or len(prefixes) != len(items):
        raise ValueError(f"need one item list per prefix, got {len(prefixes)} prefixes, {len(items)} lists")
    if any(not p for p in prefixes) or any(not group for group in items):
        raise ValueError("every member needs a non-empty prefix and at least one item")
    prefix_ids, prefix_mask = pad_batch(prefixes, max(map(len, prefixes)), pad_token_id)
    longest = max(len(seq) for group in items for seq in group)
    length = longest if item_length is None else item_length
    count = max(map(len, items))
    item_ids = np.full((len(items), count, length), pad_token_id, dtype=np.int64)
    item_mask = np.zeros((len(items), count, length), dtype=np.int64)
    for row, group in enumerate(items):
        ids, mask = pad_batch(group, length, pad_token_id)
        item_ids[row, : len(group)] = ids
        item_mask[row, : len(group)] = mask
    return prefix_ids, prefix_mask, item_ids, item_mask
