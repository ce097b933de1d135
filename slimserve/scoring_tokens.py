"""Scoring prompts as token ids, exactly as the bundle's template says: the one function the build, the
export parity check, the benchmarks and the scoring service all call.

Split prompts (``scoring-v5``, ``scoring-v4``) are a member prefix and one item suffix per candidate,
tokenized apart (the prefix with the tokenizer's special tokens, the suffixes without) and cut to their
budgets; the model input of candidate i is ``prefix + items[i]``. ``scoring-v3`` (whole text) prompts
are tokenized as one text per candidate; they have no prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import prompts
from .bundle import PromptSplit, TensorNames
from .schema import Item, Member
from .tokenization import PromptTokenizer, bucket_for, pad_multi_item


@dataclass(frozen=True)
class ScoringTokens:
    """One member's candidates as tokens: the shared prefix (empty for whole-text templates) and the
    per-candidate part."""

    prefix: list[int]
    items: list[list[int]]

    def sequences(self) -> list[list[int]]:
        """The single-sequence model input of every candidate: ``prefix + item``."""
        return [self.prefix + item for item in self.items]


def encode_scoring(
    tokenizer: PromptTokenizer,
    member: Member,
    items: Sequence[Item],
    split: PromptSplit | None,
    template_version: str = prompts.SCORING_TEMPLATE_VERSION,
) -> ScoringTokens:
    """Tokens of ``member``'s prompts for ``items`` in ``template_version`` (a bundle's; the build's
    own by default): split by ``split``, or whole texts when None."""
    if split is None:
        texts = [prompts.render_scoring_prompt(member, item, template_version) for item in items]
        return ScoringTokens([], tokenizer.encode(texts))
    (prefix,) = tokenizer.encode_within(
        [prompts.render_member_prefix(member, template_version)],
        split.prefix_max_tokens,
        add_special_tokens=True,
    )
    suffixes = tokenizer.encode_within(
        [prompts.render_item_suffix(member, item, template_version) for item in items],
        split.item_max_tokens,
        add_special_tokens=False,
    )
    return ScoringTokens(prefix, suffixes)


DEFAULT_TENSORS = TensorNames()


@dataclass(frozen=True)
class MultiItemRequest:
    """One multi-item model request: which candidates (by input index) and its tensors, one member:
    ``prefix_ids``/``prefix_mask`` [1, P], ``item_ids``/``item_mask`` [1, N, L]."""

    indices: tuple[int, ...]
    prefix_ids: np.ndarray
    prefix_mask: np.ndarray
    item_ids: np.ndarray
    item_mask: np.ndarray

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.prefix_ids, self.prefix_mask, self.item_ids, self.item_mask

    def feed(self, tensors: TensorNames = DEFAULT_TENSORS) -> dict[str, np.ndarray]:
        """The request as an ONNX Runtime feed of the multi-item graph (input name -> array)."""
        names = (tensors.prefix_ids, tensors.prefix_mask, tensors.item_ids, tensors.item_mask)
        return dict(zip(names, self.arrays(), strict=True))


def multi_item_requests(
    tokens: ScoringTokens, item_buckets: Sequence[int], max_items: int, pad_token_id: int = 0
) -> list[MultiItemRequest]:
    """The model requests of one Score call: the prefix once, the items in runs of ``max_items``, each
    run padded to the length bucket of its longest item.

    A run of one item is folded: all its tokens but the last join the prefix and the graph reads one
    item token. That is the same causal attention as the single sequence ``prefix + item``, unpadded,
    so a one-candidate call costs no more than the single-sequence graph (the graph's prefix must hold
    ``prefix_max_tokens + item_max_tokens - 1`` tokens; the layout check keeps that under the largest
    length bucket)."""
    if not tokens.prefix:
        raise ValueError("multi-item scoring needs a member prefix (a split prompt template)")
    requests = []
    for begin in range(0, len(tokens.items), max_items):
        part = tuple(range(begin, min(begin + max_items, len(tokens.items))))
        items = [tokens.items[i] for i in part]
        prefix = tokens.prefix
        if len(items) == 1 and items[0]:
            prefix, items, length = prefix + items[0][:-1], [items[0][-1:]], 1
        else:
            length = bucket_for(max(map(len, items)), item_buckets)
        arrays = pad_multi_item([prefix], [items], item_length=length, pad_token_id=pad_token_id)
        requests.append(MultiItemRequest(part, *arrays))
    return requests
