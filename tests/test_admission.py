"""Admission by work and undecodable bodies, on the real grpc.aio scoring server (port 0, no Triton).

Work held by calls in flight is taken from the server's budget directly (no fake core): a call that
does not fit must be refused RESOURCE_EXHAUSTED with ``grpc-retry-pushback-ms`` before the servicer runs
(an invalid request is refused for capacity, not for its fields); one that fits reaches the servicer
(UNAVAILABLE: no Triton) and gives its units back. A body that does not decode is INVALID_ARGUMENT
naming the message type, never UNKNOWN with a Python class name.
"""

from __future__ import annotations

import grpc
import pytest

from slimserve.serving.admission import RETRY_PUSHBACK_METADATA, Overloaded, WorkBudget, candidates
from slimserve.serving.reasoning.config import ReasoningServiceConfig
from slimserve.serving.scoring.config import ScoringServiceConfig
from slimserve.serving.scoring.server import ScoringServer
from slimserve.settings import ConfigError, load_config
from slimserve.v1 import scoring_pb2, scoring_pb2_grpc
from tests import test_scoring_service_unit
from tests.test_scoring_service_unit import config_for, make_bundle, score_request

SCORE = "/slimserve.v1.ScoringService/Score"
SCORE_STREAM = "/slimserve.v1.ScoringService/ScoreStream"
GARBAGE = b"\xff\xff\xff\xff\x0f not a protobuf"
channel = test_scoring_service_unit.channel  # the fixture, on this module's server


@pytest.fixture
async def server(tmp_path):
    server = ScoringServer(
        config_for(
            make_bundle(tmp_path), max_candidates=10, max_candidates_in_flight=10, retry_pushback_ms=250
        )
    )
    await server.start()
    yield server
    await server.stop(grace=0.5)


async def failure(call) -> tuple[grpc.StatusCode, str, dict]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details(), dict(await call.trailing_metadata())


async def test_over_budget_refused_at_once_with_pushback(server, channel):
    stub = scoring_pb2_grpc.ScoringServiceStub(channel)
    held = server.budget.acquire(8)  # calls in flight hold 8 of the 10 candidates
    try:
        bad = score_request(3)
        bad.candidates[2].id = "j0"  # a duplicate: the servicer would say INVALID_ARGUMENT
        code, details, trailer = await failure(stub.Score(bad, timeout=5))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (
            details == "over capacity: 8 of 10 candidates in flight, this request needs 3; retry after 250 ms"
        )
        assert trailer[RETRY_PUSHBACK_METADATA] == "250" and trailer["x-request-id"]
        code, _, _ = await failure(stub.Score(score_request(2), timeout=5))  # 2 still fit
        assert code == grpc.StatusCode.UNAVAILABLE
    finally:
        server.budget.release(held)
    assert server.budget.in_flight == 0 and server.budget.refused == 1
    code, _, _ = await failure(stub.Score(score_request(10), timeout=5))
    assert code == grpc.StatusCode.UNAVAILABLE  # admitted again once the work is done


async def test_stream_requests_admitted_one_by_one(server, channel):
    stub = scoring_pb2_grpc.ScoringServiceStub(channel)
    held = server.budget.acquire(9)
    try:
        call = stub.ScoreStream(iter([score_request(3)]), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in call:
                pass
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert dict(await call.trailing_metadata())[RETRY_PUSHBACK_METADATA] == "250"
    finally:
        server.budget.release(held)
    call = stub.ScoreStream(iter([score_request(2), score_request(2)]), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert server.budget.in_flight == 0


async def test_admission_metrics(server, channel):
    held = server.budget.acquire(4)
    try:
        text = "\n".join(
            f"{m.name} {s.value}" for m in server.metrics.registry.collect() for s in m.samples if s.name.startswith("slimserve_admission")
        )  # fmt: skip
    finally:
        server.budget.release(held)
    assert "slimserve_admission_in_flight 4.0" in text and "slimserve_admission_limit 10.0" in text


async def test_undecodable_body_is_invalid_argument_naming_the_message(channel):
    score = channel.unary_unary(SCORE)  # raw bytes: no serializer
    code, details, trailer = await failure(score(GARBAGE, timeout=5))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details == "request is not a valid ScoreRequest"
    assert "x-request-id" in trailer
    stream = channel.stream_stream(SCORE_STREAM)
    call = stream(iter([GARBAGE]), timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "request is not a valid ScoreRequest"


async def test_valid_bytes_still_decode(channel):
    score = channel.unary_unary(SCORE)
    code, _, _ = await failure(score(score_request(2).SerializeToString(), timeout=5))
    assert code == grpc.StatusCode.UNAVAILABLE
    empty = scoring_pb2.ScoreRequest().SerializeToString()  # an empty body is a valid, empty message
    code, details, _ = await failure(score(empty, timeout=5))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details != "request is not a valid ScoreRequest"


def test_work_budget():
    budget = WorkBudget(10, "candidates", retry_after_ms=50)
    assert budget.acquire(6) == 6
    with pytest.raises(Overloaded) as info:
        budget.acquire(5)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info.value.trailing_metadata() == ((RETRY_PUSHBACK_METADATA, "50"),)
    budget.acquire(4)
    budget.release(10)
    assert budget.acquire(25) == 25  # larger than the budget: admitted alone, so it never waits forever
    with pytest.raises(Overloaded):
        budget.acquire(1)
    budget.release(25)
    assert budget.in_flight == 0 and budget.refused == 2
    assert candidates(score_request(3)) == 3


def test_budget_config():
    assert ScoringServiceConfig().max_candidates_in_flight >= ScoringServiceConfig().max_candidates
    with pytest.raises(ConfigError, match="max_candidates_in_flight"):
        load_config(ScoringServiceConfig, overrides={"max_candidates_in_flight": 100}, environ={})
    env = {"SLIMSERVE_SCORING_MAX_CANDIDATES_IN_FLIGHT": "none"}
    assert load_config(ScoringServiceConfig, environ=env).max_candidates_in_flight is None
    assert ReasoningServiceConfig().max_streams_in_flight == 64
