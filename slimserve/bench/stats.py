"""Latency statistics: percentiles by linear interpolation (numpy's default), in milliseconds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LatencySummary:
    """Percentiles and mean of a latency sample (ms)."""

    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, latencies_ms: list[float]) -> LatencySummary:
        if not latencies_ms:
            raise ValueError("no latencies to summarize")
        values = np.asarray(latencies_ms, dtype=np.float64)
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        return cls(len(values), float(values.mean()), float(p50), float(p90), float(p99), float(values.max()))
