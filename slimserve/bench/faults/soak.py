"""Soak: open-loop arrivals at half the capacity for ``soak_minutes``; memory growth and errors.

RSS is sampled every few seconds; growth is measured from the end of the warm-up (``soak_warmup_minutes``,
at most half the soak: caches, arenas and connection buffers fill during it) to the end.
"""

from __future__ import annotations

import asyncio

import grpc

from ..grpc_load import open_loop
from .config import FaultsConfig
from .load import OK, RecordedScore, codes, describe_codes, p99_ms, sampling_rss
from .overload import Capacity
from .report import CaseResult, below, info, zero
from .stack import Stack

SOAK_SHARE = 0.5
RSS_INTERVAL_S = 5.0


async def _soak(target: str, pid: int, requests: list, config: FaultsConfig, rate: float, seconds: float):
    async with grpc.aio.insecure_channel(target) as channel:
        call = RecordedScore(channel, requests, config.deadline_s)
        async with sampling_rss(pid, min(RSS_INTERVAL_S, seconds / 10)) as rss:
            await open_loop(call, "Score", rate, int(rate * seconds) + 1, seconds, config.seed)
    return call.outcomes, rss


def run_soak(stack: Stack, config: FaultsConfig, requests: list, capacity: Capacity) -> CaseResult:
    seconds = config.soak_minutes * 60
    warmup_s = min(config.soak_warmup_minutes * 60, seconds / 2)
    rate = SOAK_SHARE * capacity.calls_per_s
    with stack.service() as service:
        outcomes, rss = asyncio.run(_soak(service.target, service.pid, requests, config, rate, seconds))
    begin = rss[0][0]
    after_warmup = next(b for t, b in rss if t - begin >= warmup_s)
    growth = (rss[-1][1] - after_warmup) / after_warmup * 100 if after_warmup else None
    result = CaseResult("soak")
    result.figures = [
        info("load", f"{rate:.1f} calls/s (half the capacity) for {config.soak_minutes:g} min"),
        info("calls", len(outcomes)),
        zero("errors", sum(1 for o in outcomes if o.code != OK)),
        info("codes", describe_codes(codes(outcomes))),
        info("p99", p99_ms([o for o in outcomes if o.code == OK]), unit="ms"),
        info(
            "service RSS after warm-up / end",
            f"{after_warmup / 2**20:.0f} / {rss[-1][1] / 2**20:.0f} MiB (warm-up {warmup_s / 60:.1f} min)",
        ),
        below("service RSS growth after warm-up", growth, 5.0, unit="%"),
    ]
    return result
