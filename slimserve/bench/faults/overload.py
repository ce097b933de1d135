"""Overload: the capacity in closed loop, then open-loop arrivals at a multiple of it.

Capacity is the best throughput over the closed-loop concurrencies; the concurrency that first reaches
90% of it is the "capacity concurrency", whose p99 is the reference for accepted calls. The service under
overload gets an admission budget of that many calls' candidates (``overload_budget`` to choose another):
beyond it calls are refused at once with RESOURCE_EXHAUSTED, so the accepted ones wait no longer than at
capacity. Latency here is from send to answer; the open loop keeps sending whether or not answers came.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc

from ..grpc_load import LoadPoint, closed_loop, open_loop
from .config import FaultsConfig
from .load import OK, RecordedScore, codes, describe_codes, p99_ms, sampling_rss
from .report import CaseResult, below, info, zero
from .stack import Stack

WARMUP_CALLS = 8
CAPACITY_SHARE = 0.9
REFUSED = "RESOURCE_EXHAUSTED"
RSS_BOUND_PERCENT = 25.0  # "RSS bounded": the peak under overload within this much of the start


@dataclass(frozen=True)
class Capacity:
    """Closed-loop throughput (calls/s) at the capacity concurrency, and its p99 (ms)."""

    calls_per_s: float
    concurrency: int
    p99_ms: float
    points: tuple[LoadPoint, ...]

    def describe(self) -> str:
        return f"{self.calls_per_s:.1f} calls/s at concurrency {self.concurrency} (p99 {self.p99_ms:.0f} ms)"


MEASURING_DEADLINE_S = 30.0  # the capacity calls' deadline while the load's own is not sized yet
MIN_DEADLINE_S = 2.0
DEADLINE_P99_FACTOR = 3.0


def load_deadline(capacity: Capacity, workers: int) -> float:
    """A load deadline that calls at capacity meet with room to spare: ``DEADLINE_P99_FACTOR`` x the p99
    at the capacity concurrency, scaled up when ``workers`` keep more calls in flight than that."""
    scale = max(1.0, workers / max(capacity.concurrency, 1))
    return max(MIN_DEADLINE_S, DEADLINE_P99_FACTOR * capacity.p99_ms / 1000.0 * scale)


def pick_capacity(points: list[LoadPoint]) -> Capacity:
    """The best throughput, at the lowest concurrency reaching ``CAPACITY_SHARE`` of it."""
    best = max(p.requests_per_s for p in points)
    if best <= 0:
        raise RuntimeError("no call succeeded while measuring capacity: " + str([p.errors for p in points]))
    chosen = next(
        p for p in sorted(points, key=lambda p: p.load) if p.requests_per_s >= CAPACITY_SHARE * best
    )
    return Capacity(best, int(chosen.load), chosen.latency.p99_ms, tuple(points))


async def _measure(target: str, requests: list, config: FaultsConfig) -> Capacity:
    async with grpc.aio.insecure_channel(target) as channel:
        call = RecordedScore(channel, requests, config.deadline_s or MEASURING_DEADLINE_S)
        for index in range(WARMUP_CALLS):
            await call.safe(index)
        points = [
            await closed_loop(call, "Score", level, 1 << 40, config.capacity_seconds)
            for level in sorted(set(config.capacity_concurrency))
        ]
    return pick_capacity(points)


def measure_capacity(stack: Stack, config: FaultsConfig, requests: list) -> Capacity:
    """Capacity of a fresh service with its default settings."""
    with stack.service() as service:
        return asyncio.run(_measure(service.target, requests, config))


def overload_budget(config: FaultsConfig, capacity: Capacity) -> int:
    return config.overload_budget or capacity.concurrency * config.candidates


async def _overload(target: str, pid: int, requests: list, config: FaultsConfig, rate: float):
    async with grpc.aio.insecure_channel(target) as channel:
        call = RecordedScore(channel, requests, config.deadline_s or MEASURING_DEADLINE_S)
        for index in range(WARMUP_CALLS):
            await call.safe(index)
        call.outcomes.clear()
        async with sampling_rss(pid) as rss:
            point = await open_loop(
                call,
                "Score",
                rate,
                int(rate * config.overload_seconds) + 1,
                config.overload_seconds,
                config.seed,
            )
    return call.outcomes, point, rss


def run_overload(stack: Stack, config: FaultsConfig, requests: list, capacity: Capacity) -> CaseResult:
    """Open-loop arrivals at ``overload_factor`` x capacity for ``overload_seconds`` against a service whose
    admission budget is the candidates in flight at capacity."""
    rate = config.overload_factor * capacity.calls_per_s
    budget = overload_budget(config, capacity)
    limits = {"max_candidates_in_flight": budget, "max_candidates": min(budget, 500)}
    with stack.service(**limits) as service:
        outcomes, point, rss = asyncio.run(_overload(service.target, service.pid, requests, config, rate))
    accepted = [o for o in outcomes if o.code == OK]
    refused = [o for o in outcomes if o.code == REFUSED]
    late = [o for o in outcomes if o.code == "DEADLINE_EXCEEDED" or o.seconds > config.deadline_s]
    other = sum(n for code, n in codes(outcomes).items() if code not in (OK, REFUSED, "DEADLINE_EXCEEDED"))
    accepted_p99 = p99_ms(accepted)
    ratio = accepted_p99 / capacity.p99_ms if capacity.p99_ms > 0 else float("nan")
    start, peak = rss[0][1], max(b for _, b in rss)
    result = CaseResult("overload")
    result.figures = [
        info("capacity (closed loop)", capacity.describe()),
        info(
            "offered (open loop)",
            f"{rate:.1f} calls/s = {config.overload_factor:g}x for {config.overload_seconds:g} s",
        ),
        info("admission budget", f"{budget} candidates"),
        info("calls accepted / refused", f"{len(accepted)} / {len(refused)}"),
        below("refused p99", p99_ms(refused), 20.0, unit="ms"),
        info("accepted p99", accepted_p99, unit="ms"),
        below("accepted p99 / p99 at capacity", ratio, 2.0, unit="x", strict=False),
        zero("calls past their deadline", len(late)),
        zero("other failures", other),
        info("codes", describe_codes(codes(outcomes))),
        info(
            "service RSS start / peak / end",
            f"{start / 2**20:.0f} / {peak / 2**20:.0f} / {rss[-1][1] / 2**20:.0f} MiB",
        ),
        below(
            "service RSS peak growth", (peak - start) / start * 100 if start else None, RSS_BOUND_PERCENT, "%"
        ),
    ]
    if point.errors.get("CLIENT_OVERLOADED"):
        result.notes.append(
            f"{point.errors['CLIENT_OVERLOADED']} arrivals not sent: the load generator had 4096 calls in flight"
        )
    return result
