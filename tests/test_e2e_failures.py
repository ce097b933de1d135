"""Failure paths end to end: Triton killed under load and restarted; bundle-hash mismatch refused."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from slimserve.bundle import BUNDLE_FILE, bundle_dir_for, load_bundle
from slimserve.client import build_request
from slimserve.examples import EXAMPLE_MEMBER, example_candidates
from slimserve.serving.scoring.server import ScoringServer
from tests.conftest import start_triton
from tests.test_e2e_scoring import service_config

HEALTHY = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def health_status(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status


async def wait_for_health(port: int, status: int, timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if await health_status(port) == status:
            return time.monotonic() - started
        await asyncio.sleep(0.1)
    raise AssertionError(f"health did not become {status} within {timeout_s} s")


async def score_loop(stub, stop: asyncio.Event, outcomes: list, deadline_s: float = 3.0) -> None:
    """Score until ``stop``; record (status code, seconds) of every call."""
    request = build_request(EXAMPLE_MEMBER, example_candidates(4))
    while not stop.is_set():
        started = time.monotonic()
        try:
            await stub.Score(request, timeout=deadline_s)
            code = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
        outcomes.append((code, time.monotonic() - started, started))
        if code != grpc.StatusCode.OK:
            await asyncio.sleep(0.02)


async def test_triton_killed_under_load_then_restarted(tiny_repository, free_tcp_port):
    from slimserve.v1 import scoring_pb2_grpc

    triton = start_triton(tiny_repository, grpc_port=free_tcp_port)
    server = ScoringServer(service_config(tiny_repository, triton.grpc_url))
    try:
        await server.start()
        await wait_for_health(server.port, HEALTHY, 30)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = scoring_pb2_grpc.ScoringServiceStub(channel)
            stop, outcomes = asyncio.Event(), []
            workers = [asyncio.create_task(score_loop(stub, stop, outcomes)) for _ in range(8)]
            await asyncio.sleep(1.0)
            killed_at = time.monotonic()
            os.killpg(triton.pid, signal.SIGKILL)  # the server and its python stubs, no goodbye
            await asyncio.get_running_loop().run_in_executor(None, triton.stop)  # reap
            not_serving_after = await wait_for_health(server.port, NOT_SERVING, 10)
            await asyncio.sleep(1.0)
            during_outage = [o for o in outcomes if o[2] > killed_at + not_serving_after]

            triton = start_triton(tiny_repository, grpc_port=free_tcp_port)
            recovered_after = await wait_for_health(server.port, HEALTHY, 30)
            await asyncio.sleep(0.5)
            stop.set()
            await asyncio.gather(*workers)

        assert any(code == grpc.StatusCode.OK for code, _, t in outcomes if t < killed_at)
        assert during_outage, "no call was made while Triton was down"
        assert {code for code, _, _ in during_outage} == {grpc.StatusCode.UNAVAILABLE}
        assert max(seconds for _, seconds, _ in during_outage) < 1.0, "calls did not fail fast"
        assert max(seconds for _, seconds, _ in outcomes) < 3.0 + 1.0, "a call outlived its deadline"
        assert not_serving_after < 5.0
        assert recovered_after < 30
        response = await _score_once(server.port)
        assert len(response.items) == 4  # recovered without restarting the service
    finally:
        await server.stop(grace=1)
        triton.stop()


async def _score_once(port: int):
    from slimserve.v1 import scoring_pb2_grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = scoring_pb2_grpc.ScoringServiceStub(channel)
        return await stub.Score(build_request(EXAMPLE_MEMBER, example_candidates(4)), timeout=10)


async def test_bundle_hash_mismatch_is_refused(tiny_repository, tiny_triton, tmp_path):
    original = bundle_dir_for(tiny_repository, "scorer")
    forged = tmp_path / "bundle"
    forged.mkdir()
    for name in ("tokenizer.json", BUNDLE_FILE):
        (forged / name).write_bytes((original / name).read_bytes())
    bundle = dataclasses.replace(load_bundle(original), content_hash="0" * 64)
    (forged / BUNDLE_FILE).write_text(json.dumps(bundle.manifest()))

    config = service_config(tiny_repository, tiny_triton.grpc_url).model_copy(update={"bundle_dir": forged})
    server = ScoringServer(config)
    await server.start()
    try:
        await asyncio.sleep(1.0)
        assert await health_status(server.port) == NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _score_once(server.port)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "serving bundle" in info.value.details()
    finally:
        await server.stop(grace=1)
