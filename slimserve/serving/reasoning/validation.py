"""Validation of plain Explain and Generate requests; every error names the field (``options.top_p``).

Members and items follow the shared record rules (``slimserve.serving.validation``). Options: max_tokens
0 means the service's default and may not exceed the limit (the config's ``max_tokens_limit``, never
above the model's ``max_new_tokens_limit``); temperature in [0, ``max_temperature``] (0 = greedy);
top_p in (0, 1]; repetition_penalty in [1, ``max_repetition_penalty``] (None: the config's default);
at most ``max_stop_strings`` non-empty stop strings of at most ``max_stop_chars``.
A prompt is required, at most ``max_prompt_chars``, without control characters but tab and newlines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from slimserve.schema import Item, Member

from ..errors import InvalidArgument
from ..validation import check_text, validate_item, validate_member
from .config import ReasoningServiceConfig

# Highest seed the model's UINT64 input holds.
MAX_SEED = 2**64 - 1


@dataclass(frozen=True)
class GenerationOptions:
    """Decoding options as a client sent them (0 / None = the default)."""

    max_tokens: int = 0
    temperature: float = 0.0
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    repetition_penalty: float | None = None


@dataclass(frozen=True)
class ResolvedOptions:
    """Checked options with defaults filled in; ``explicit_max_tokens`` says whether the client set it."""

    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    explicit_max_tokens: bool
    repetition_penalty: float = 1.0


def _finite(value: object, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidArgument(field, f"must be a finite number, got {value!r}")
    return float(value)


def max_tokens_limit(config: ReasoningServiceConfig, model_limit: int) -> int:
    """The most tokens one request may ask for."""
    return model_limit if config.max_tokens_limit is None else min(config.max_tokens_limit, model_limit)


def resolve_options(
    options: GenerationOptions,
    config: ReasoningServiceConfig,
    model_limit: int,
    field: str = "options",
    default_penalty: float | None = None,
) -> ResolvedOptions:
    """Check ``options`` against the limits and fill in defaults; raise ``InvalidArgument``. An unset
    repetition_penalty becomes ``default_penalty`` (None: ``config.default_repetition_penalty``)."""
    limit = max_tokens_limit(config, model_limit)
    max_tokens = options.max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise InvalidArgument(f"{field}.max_tokens", f"must be a whole number >= 0, got {max_tokens!r}")
    if max_tokens > limit:
        raise InvalidArgument(f"{field}.max_tokens", f"{max_tokens} is over the limit of {limit}")
    temperature = _finite(options.temperature, f"{field}.temperature")
    if not 0.0 <= temperature <= config.max_temperature:
        raise InvalidArgument(
            f"{field}.temperature", f"{temperature:g} is outside [0, {config.max_temperature:g}]"
        )
    top_p = 1.0 if options.top_p is None else _finite(options.top_p, f"{field}.top_p")
    if not 0.0 < top_p <= 1.0:
        raise InvalidArgument(f"{field}.top_p", f"{top_p:g} is outside (0, 1]")
    seed = options.seed
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED
    ):
        raise InvalidArgument(f"{field}.seed", f"must be a whole number in [0, 2^64), got {seed!r}")
    check_stops(options.stop, config, f"{field}.stop")
    if default_penalty is None:
        default_penalty = config.default_repetition_penalty
    penalty = (
        default_penalty
        if options.repetition_penalty is None
        else _finite(options.repetition_penalty, f"{field}.repetition_penalty")
    )
    if not 1.0 <= penalty <= config.max_repetition_penalty:
        raise InvalidArgument(
            f"{field}.repetition_penalty", f"{penalty:g} is outside [1, {config.max_repetition_penalty:g}]"
        )
    return ResolvedOptions(
        max_tokens=max_tokens or min(config.default_max_tokens, limit),
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        stop=tuple(options.stop),
        explicit_max_tokens=max_tokens > 0,
        repetition_penalty=penalty,
    )


def check_stops(stops: Sequence[str], config: ReasoningServiceConfig, field: str) -> None:
    """At most ``max_stop_strings`` stop strings, each non-empty and at most ``max_stop_chars`` long."""
    if isinstance(stops, str):
        raise InvalidArgument(field, "expected a list of strings")
    if len(stops) > config.max_stop_strings:
        raise InvalidArgument(field, f"{len(stops)} stop strings, at most {config.max_stop_strings} allowed")
    for index, stop in enumerate(stops):
        where = f"{field}[{index}]"
        if not isinstance(stop, str) or not stop:
            raise InvalidArgument(where, "must be a non-empty string")
        if len(stop) > config.max_stop_chars:
            raise InvalidArgument(where, f"{len(stop)} characters, at most {config.max_stop_chars} allowed")


def validate_prompt(prompt: object, config: ReasoningServiceConfig, field: str = "prompt") -> None:
    """A Generate prompt: required, bounded, no control characters but tab and newlines."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidArgument(field, "required (empty)")
    if len(prompt) > config.max_prompt_chars:
        raise InvalidArgument(field, f"{len(prompt)} characters, at most {config.max_prompt_chars} allowed")
    check_text(prompt, field, _PromptLimits(config.max_prompt_chars))


def validate_explain(member: Member | None, item: Item | None, config: ReasoningServiceConfig) -> None:
    """An Explain request's member and item (both required)."""
    validate_member(member, config)
    if item is None:
        raise InvalidArgument("item", "required")
    validate_item(item, config, "item")


@dataclass(frozen=True)
class _PromptLimits:
    max_text_chars: int
