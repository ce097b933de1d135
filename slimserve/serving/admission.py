"""Admission control by work: a budget of units in flight (candidates, streams), refused at once beyond it.

A ``WorkBudget`` counts units held by calls in flight. ``Admission`` says, per method, what one request
costs; the serving interceptor takes a request's cost before the servicer runs (so before any
tokenization) and gives it back when the call, or for ScoreStream that request's answer, is done. A
request that does not fit gets ``Overloaded`` (RESOURCE_EXHAUSTED) with a retry hint the interceptor sends
as ``grpc-retry-pushback-ms`` trailing metadata. Everything runs on the server's event loop: no locks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .errors import ResourceExhausted

RETRY_PUSHBACK_METADATA = "grpc-retry-pushback-ms"


class Overloaded(ResourceExhausted):
    """The service's admission budget is spent: retry after ``retry_after_ms``."""

    def __init__(self, message: str, retry_after_ms: int = 0):
        super().__init__(message)
        self.retry_after_ms = retry_after_ms

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((RETRY_PUSHBACK_METADATA, str(self.retry_after_ms)),)


@dataclass
class WorkBudget:
    """``limit`` units of work (e.g. candidates) shared by the calls in flight."""

    limit: int
    unit: str
    retry_after_ms: int = 100
    in_flight: int = 0
    refused: int = 0

    def acquire(self, cost: int) -> int:
        """Hold ``cost`` units (returned, for ``release``) or raise ``Overloaded`` at once.

        A request larger than the whole budget is admitted only when nothing else is in flight, so it
        can never wait forever.
        """
        cost = max(cost, 0)
        if self.in_flight + cost > self.limit and self.in_flight > 0:
            self.refused += 1
            raise Overloaded(
                f"over capacity: {self.in_flight} of {self.limit} {self.unit} in flight, this request "
                f"needs {cost}; retry after {self.retry_after_ms} ms",
                self.retry_after_ms,
            )
        self.in_flight += cost
        return cost

    def release(self, cost: int) -> None:
        self.in_flight = max(0, self.in_flight - cost)


Cost = Callable[[object], int]


def one(_request: object) -> int:
    """Cost of a request that is one unit (a stream)."""
    return 1


def candidates(request: object) -> int:
    """Cost of a Score request: its candidates."""
    return len(getattr(request, "candidates", ()))


@dataclass
class Admission:
    """Which methods (``Service/Method``) take from ``budget``, and at what cost per request."""

    budget: WorkBudget
    costs: Mapping[str, Cost] = field(default_factory=dict)

    def cost_of(self, method: str) -> Cost | None:
        return self.costs.get(method)
