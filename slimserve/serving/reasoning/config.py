"""Configuration of the reasoning service (``slimserve serve-reasoning``): one pydantic model.

Environment variables ``SLIMSERVE_REASONING_<FIELD>``; precedence defaults < file < environment < flags.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from ..config import RecordLimitsConfig


class ReasoningServiceConfig(RecordLimitsConfig):
    """Configuration of the reasoning service (Explain, Generate)."""

    env_prefix: ClassVar[str] = "SLIMSERVE_REASONING_"

    port: int = Field(50052, ge=0, le=65535, description="gRPC port; 0 picks a free port.")
    metrics_port: int = Field(
        9091, ge=-1, le=65535, description="Prometheus metrics port; 0 picks a free port, -1 turns it off."
    )
    model_name: str = Field("generator", description="Name of the generator model in the repository.")
    default_timeout_s: float = Field(
        120.0, gt=0, description="Time budget of a request whose caller sends no deadline (seconds)."
    )
    default_max_tokens: int = Field(
        128, ge=1, description="max_tokens of a request that sets none (capped by the model's room)."
    )
    max_tokens_limit: int | None = Field(
        None,
        ge=1,
        description="Most tokens a request may ask for; unset = the bundle's max_new_tokens_limit "
        "(never above it).",
    )
    max_prompt_chars: int = Field(8000, ge=1, description="Longest Generate prompt (characters).")
    max_streams_in_flight: int | None = Field(
        64,
        ge=1,
        description="Admission budget: Explain and Generate streams in flight (decoding or queued); one "
        "more gets RESOURCE_EXHAUSTED at once (before tokenizing). Unset = no limit.",
    )
    max_temperature: float = Field(2.0, gt=0, le=5.0, description="Highest sampling temperature allowed.")
    default_repetition_penalty: float = Field(
        1.15,
        ge=1.0,
        le=10.0,
        description="repetition_penalty of a Generate request that sets none (1: off; 1.15 keeps small models "
        "out of loops on free prompts).",
    )
    explain_repetition_penalty: float = Field(
        1.0,
        ge=1.0,
        le=10.0,
        description="repetition_penalty of an Explain request that sets none (1: off). A grounded explanation "
        "repeats its facts' words ('you', 'It is', skill names), which a penalty pushes the student off: the "
        "build gates the published graph's explanations at this value (docs/reasoning.md).",
    )
    explain_copy_names: bool = Field(
        True,
        description="Explain sends the names its prompt states (skills, title, company, cities, industries) "
        "to a generator that takes them: once the model starts copying one, it finishes it as the prompt "
        "spells it ('postgresql', not 'postresql'). The build gates the published graph decoding this way "
        "(docs/reasoning.md).",
    )
    max_repetition_penalty: float = Field(
        2.0, ge=1.0, le=10.0, description="Highest repetition_penalty a request may set."
    )
    max_stop_strings: int = Field(4, ge=0, description="Most stop strings one request may give.")
    max_stop_chars: int = Field(64, ge=1, description="Longest stop string (characters).")
