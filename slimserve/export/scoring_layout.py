"""How a scorer is laid out for serving: single sequences per candidate, or one member prefix and the
candidates as item suffixes (multi-item), with the token budgets and buckets of each part.

One settings model shared by ``slimserve export`` and the build recipes' ``publish`` section.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from ..bundle import SCORING_MULTI_ITEM, PromptSplit


class ScoringLayout(BaseModel):
    """Scoring layout fields (mixed into a settings model that also has ``length_buckets``)."""

    scoring_mode: Literal["multi_item", "single"] = Field(
        "multi_item",
        description="multi_item: one member prefix per Score call, candidates as item suffixes; "
        "single: one full sequence per candidate",
    )
    prefix_max_tokens: int = Field(320, ge=8, description="Token budget of the member prefix")
    item_max_tokens: int = Field(128, ge=8, description="Token budget of one item suffix")
    item_length_buckets: tuple[int, ...] = Field(
        (32, 48, 64, 80, 96, 128),
        description="Multi-item: item-suffix length buckets (the largest >= item_max_tokens). Steps of 16 "
        "keep padding small: the cpu recipe's suffixes (about 67 tokens) pad to 80, not to 128",
    )
    max_items_per_request: int = Field(
        256, ge=1, description="Multi-item: candidates per Triton request (more are split into requests)"
    )
    max_members_per_batch: int = Field(
        8, ge=1, description="Multi-item: Triton max_batch_size, members stacked in one model execution"
    )

    @property
    def multi_item(self) -> bool:
        """Whether the scorer is served multi-item (one member prefix per call)."""
        return self.scoring_mode == SCORING_MULTI_ITEM

    def prompt_split(self) -> PromptSplit:
        """How scoring prompts are tokenized (member prefix and item suffixes apart)."""
        return PromptSplit(self.prefix_max_tokens, self.item_max_tokens)

    @model_validator(mode="after")
    def _budgets_fit(self):
        largest = max(self.length_buckets)  # type: ignore[attr-defined]
        if self.prefix_max_tokens + self.item_max_tokens > largest:
            raise ValueError(
                f"prefix_max_tokens + item_max_tokens ({self.prefix_max_tokens + self.item_max_tokens}) "
                f"exceeds the largest length bucket {largest}"
            )
        if max(self.item_length_buckets) < self.item_max_tokens:
            raise ValueError(
                f"item_length_buckets: the largest ({max(self.item_length_buckets)}) must hold "
                f"item_max_tokens ({self.item_max_tokens})"
            )
        return self
