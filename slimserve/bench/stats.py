"""Latency statistics: percentiles by linear interpolation (numpy's default), in milliseconds."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class LatencySummary:
    """Percentiles and mean of a latency sample (ms)."""

    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, latencies_ms: list[float]) -> LatencySummary:
        if len(latencies_ms) == 0:
            raise ValueError("no latencies to summarize")
        values = np.asarray(latencies_ms, dtype=np.float64)
        p50, p90, p95, p99 = np.percentile(values, PERCENTILES)
        return cls(
            len(values),
            float(values.mean()),
            float(p50),
            float(p90),
            float(p95),
            float(p99),
            float(values.max()),
        )

    @classmethod
    def empty(cls) -> LatencySummary:
        """The summary of no sample (all NaN): a load point where every request failed."""
        nan = float("nan")
        return cls(0, nan, nan, nan, nan, nan, nan)

    @classmethod
    def of_or_empty(cls, latencies_ms: list[float]) -> LatencySummary:
        return cls.of(latencies_ms) if len(latencies_ms) else cls.empty()

    def as_dict(self) -> dict:
        return asdict(self)
