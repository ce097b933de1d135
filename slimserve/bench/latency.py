"""``slimserve bench latency``: Score latency of a running service, one request at a time.

Closed loop with one client: each request waits for the previous one, so the figures are the service's
unloaded latency (tokenize, Triton queue and inference, ranking, gRPC) for each candidate count.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import grpc

from ..channel import ClientSecurity, open_channel
from ..client import build_request
from ..examples import EXAMPLE_MEMBER, example_candidates
from .stats import LatencySummary


@dataclass(frozen=True)
class LatencyResult:
    """Latency of Score for one candidate count."""

    candidates: int
    summary: LatencySummary
    errors: int

    def as_dict(self) -> dict:
        return {"candidates": self.candidates, "errors": self.errors, **asdict(self.summary)}


def measure_score_latency(
    target: str,
    candidate_counts: list[int],
    requests: int = 100,
    warmup: int = 5,
    timeout_s: float = 30.0,
    security: ClientSecurity | None = None,
) -> list[LatencyResult]:
    """Send ``requests`` sequential Score calls per candidate count; return latency summaries."""
    from ..v1 import scoring_pb2_grpc

    results = []
    with open_channel(target, security) as channel:
        stub = scoring_pb2_grpc.ScoringServiceStub(channel)
        for count in candidate_counts:
            request = build_request(EXAMPLE_MEMBER, example_candidates(count))
            for _ in range(warmup):
                stub.Score(request, timeout=timeout_s)
            latencies, errors = [], 0
            for _ in range(requests):
                started = time.perf_counter()
                try:
                    stub.Score(request, timeout=timeout_s)
                except grpc.RpcError as exc:
                    errors, last_error = errors + 1, exc
                    continue
                latencies.append((time.perf_counter() - started) * 1000)
            if not latencies:  # every call failed: the service's answer, not a summary of nothing
                raise last_error
            results.append(LatencyResult(count, LatencySummary.of(latencies), errors))
    return results


def format_latency_table(results: list[LatencyResult]) -> str:
    """Markdown table of latency results."""
    lines = [
        "| candidates | requests | p50 ms | p90 ms | p99 ms | mean ms | errors |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        s = r.summary
        lines.append(
            f"| {r.candidates} | {s.count} | {s.p50_ms:.1f} | {s.p90_ms:.1f} | {s.p99_ms:.1f} | "
            f"{s.mean_ms:.1f} | {r.errors} |"
        )
    return "\n".join(lines)
