"""Validation of a plain Score request; every error names the field path (``candidates[3].id``).

Member and candidate records are checked by the shared ``slimserve.serving.validation``; here: there is
at least one and at most ``max_candidates`` candidates, with distinct ids. ``top_k`` is required (at
least 1); a ``top_k`` above the number of candidates is clamped (``effective_top_k``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from slimserve.schema import Item, Member

from ..errors import InvalidArgument
from ..validation import Limits as RecordLimits
from ..validation import validate_item, validate_member


class Limits(RecordLimits, Protocol):
    """The limits Score validation needs (``ScoringServiceConfig`` has them)."""

    max_candidates: int


def validate_score_request(
    member: Member | None, candidates: Sequence[Item], top_k: int, limits: Limits
) -> None:
    """Check a whole Score request (member, candidates, top_k)."""
    validate_member(member, limits)
    if not candidates:
        raise InvalidArgument("candidates", "at least one candidate is required")
    if len(candidates) > limits.max_candidates:
        raise InvalidArgument(
            "candidates", f"{len(candidates)} candidates, at most {limits.max_candidates} allowed"
        )
    seen: dict[str, int] = {}
    for index, item in enumerate(candidates):
        field = f"candidates[{index}]"
        validate_item(item, limits, field)
        first = seen.setdefault(item.id, index)
        if first != index:
            raise InvalidArgument(f"{field}.id", f"duplicate of candidates[{first}].id")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise InvalidArgument("top_k", f"must be at least 1 (it is required), got {top_k!r}")


def effective_top_k(top_k: int, n_candidates: int) -> int:
    """How many ranked items to return: ``top_k``, clamped to the number of candidates."""
    return min(top_k, n_candidates)
