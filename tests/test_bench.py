"""Benchmark plumbing: statistics against known data, and the latency command on the tiny model."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from slimserve.bench.latency import format_latency_table, measure_score_latency
from slimserve.bench.stats import LatencySummary


def test_percentiles_match_known_data():
    summary = LatencySummary.of([float(v) for v in range(1, 101)])  # 1..100 ms
    assert summary.count == 100
    assert summary.p50_ms == pytest.approx(50.5)
    assert summary.p90_ms == pytest.approx(90.1)
    assert summary.p95_ms == pytest.approx(95.05)
    assert summary.p99_ms == pytest.approx(99.01)
    assert summary.mean_ms == pytest.approx(50.5) and summary.max_ms == 100.0
    assert LatencySummary.of([7.0]).p99_ms == 7.0
    with pytest.raises(ValueError):
        LatencySummary.of([])
    assert np.isclose(LatencySummary.of([1.0, 3.0]).p50_ms, 2.0)


async def test_latency_bench_against_the_tiny_service(tiny_repository, tiny_triton):
    import asyncio

    from slimserve.serving.scoring.server import ScoringServer
    from tests.test_e2e_scoring import service_config

    server = ScoringServer(service_config(tiny_repository, tiny_triton.grpc_url))
    await server.start()
    try:
        assert await server.core.watcher.wait_until_ready(timeout=30)
        results = await asyncio.get_running_loop().run_in_executor(
            None, measure_score_latency, f"127.0.0.1:{server.port}", [1, 5], 5, 1
        )
    finally:
        await server.stop(grace=1)
    assert [r.candidates for r in results] == [1, 5]
    assert all(r.errors == 0 and r.summary.count == 5 and r.summary.p50_ms > 0 for r in results)
    table = format_latency_table(results)
    assert table.splitlines()[0].startswith("| candidates |") and len(table.splitlines()) == 4


def test_latency_bench_reports_unreachable_service():
    from slimserve.serving.triton.launcher import free_port

    with pytest.raises(grpc.RpcError):
        measure_score_latency(f"127.0.0.1:{free_port()}", [1], requests=1, warmup=1, timeout_s=1)
    with pytest.raises(grpc.RpcError):  # no warm-up: every measured call fails, the error is raised
        measure_score_latency(f"127.0.0.1:{free_port()}", [1], requests=2, warmup=0, timeout_s=1)
