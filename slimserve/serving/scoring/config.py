"""Configuration of the scoring service (``slimserve serve``): one pydantic model.

Environment variables ``SLIMSERVE_SCORING_<FIELD>``; precedence defaults < file < environment < flags.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from ..config import RecordLimitsConfig


class ScoringServiceConfig(RecordLimitsConfig):
    """Configuration of the scoring service (``slimserve serve``)."""

    env_prefix: ClassVar[str] = "SLIMSERVE_SCORING_"

    model_name: str = Field("scorer", description="Name of the scoring model in the repository.")
    max_candidates: int = Field(500, ge=1, description="Most candidates one Score request may carry.")
    triton_chunk_size: int = Field(8, ge=1, description="Candidates per Triton request (sent concurrently).")
    max_candidates_in_flight: int | None = Field(
        4000,
        ge=1,
        description="Admission budget: candidates of all Score calls in flight; a call that would pass it "
        "gets RESOURCE_EXHAUSTED at once (before tokenizing). Unset = no limit; at least max_candidates.",
    )

    @model_validator(mode="after")
    def _budget_holds_one_call(self) -> ScoringServiceConfig:
        budget = self.max_candidates_in_flight
        if budget is not None and budget < self.max_candidates:
            raise ValueError(
                f"max_candidates_in_flight ({budget}) must be at least max_candidates ({self.max_candidates})"
            )
        return self
