"""Scoring prompts as token ids, exactly as the bundle's template says: the one function the build, the
export parity check, the benchmarks and the scoring service all call.

``scoring-v4`` (split) prompts are a member prefix and one item suffix per candidate, tokenized apart
(the prefix with the tokenizer's special tokens, the suffixes without) and cut to their budgets; the
model input of candidate i is ``prefix + items[i]``. ``scoring-v3`` (whole text) prompts are tokenized
as one text per candidate; they have no prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from . import prompts
from .bundle import PromptSplit
from .schema import Item, Member
from .tokenization import PromptTokenizer


@dataclass(frozen=True)
class ScoringTokens:
    """One member's candidates as tokens: the shared prefix (empty for whole-text templates) and the
    per-candidate part."""

    prefix: list[int]
    items: list[list[int]]

    def sequences(self) -> list[list[int]]:
        """The single-sequence model input of every candidate: ``prefix + item``."""
        return [self.prefix + item for item in self.items]


def is_split_template(template_version: str) -> bool:
    """Whether ``template_version`` tokenizes a member prefix and item suffixes apart."""
    return template_version not in prompts.WHOLE_TEXT_TEMPLATES


def encode_scoring(
    tokenizer: PromptTokenizer,
    member: Member,
    items: Sequence[Item],
    split: PromptSplit | None,
) -> ScoringTokens:
    """Tokens of ``member``'s prompts for ``items``: split by ``split``, or whole texts when None."""
    if split is None:
        texts = [prompts.render_scoring_prompt(member, item) for item in items]
        return ScoringTokens([], tokenizer.encode(texts))
    (prefix,) = tokenizer.encode_within(
        [prompts.render_member_prefix(member)], split.prefix_max_tokens, add_special_tokens=True
    )
    suffixes = tokenizer.encode_within(
        [prompts.render_item_suffix(member, item) for item in items],
        split.item_max_tokens,
        add_special_tokens=False,
    )
    return ScoringTokens(prefix, suffixes)
