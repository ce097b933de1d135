"""The real grpc.aio scoring server on port 0, its Triton URL pointing at a closed port.

No Triton and no fake: health must say NOT_SERVING, Score must fail fast with UNAVAILABLE, bad input
must still be INVALID_ARGUMENT naming the field, reflection and metrics must answer, stop must return.
"""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tokenizers import Tokenizer, models, pre_tokenizers

from slimserve import prompts, schema
from slimserve.bundle import (
    BundleError,
    ServingBundle,
    compute_content_hash,
    load_bundle,
    sha256_file,
    write_bundle,
)
from slimserve.client_convert import item_to_proto, member_to_proto
from slimserve.serving.errors import Unavailable
from slimserve.serving.scoring.config import ScoringServiceConfig
from slimserve.serving.scoring.core import SERVICE_NAME, ScoringCore, rank
from slimserve.serving.scoring.server import ScoringServer
from slimserve.v1 import scoring_pb2, scoring_pb2_grpc

WORDS = ["Member", "headline", "skills", "Candidate", "job", "Answer", "Question", "Yes", "No"]


def make_tokenizer(path: Path) -> Path:
    """A tiny byte-level word tokenizer in which " Yes" and " No" are single tokens."""
    vocab = {"[UNK]": 0}
    for word in WORDS:
        for text in (word, "Ġ" + word):
            vocab.setdefault(text, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.save(str(path))
    return path


def make_bundle(root: Path, template: str = prompts.SCORING_TEMPLATE_VERSION) -> Path:
    tokenizer_file = make_tokenizer(root / "tokenizer-src.json")
    tok = Tokenizer.from_file(str(tokenizer_file))
    bundle = ServingBundle(
        model_name="scorer",
        model_version=1,
        task="scoring",
        prompt_template_version=template,
        yes_token_id=tok.token_to_id("ĠYes"),
        no_token_id=tok.token_to_id("ĠNo"),
        length_buckets=(64, 128, 256),
        max_batch_size=8,
        tokenizer_sha256=sha256_file(tokenizer_file),
    )
    bundle = ServingBundle(**{**bundle.__dict__, "content_hash": compute_content_hash(bundle, {})})
    directory = root / "repo" / "scorer" / "1" / "bundle"
    write_bundle(bundle, directory, tokenizer_file)
    return root / "repo"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def config_for(repo: Path, **changes) -> ScoringServiceConfig:
    values = dict(
        port=0,
        metrics_port=0,
        metrics_host="127.0.0.1",
        model_repository=repo,
        triton_url=f"127.0.0.1:{closed_port()}",
        health_poll_interval_s=0.2,
        drain_grace_s=1.0,
    )
    return ScoringServiceConfig(**{**values, **changes})


@pytest.fixture
async def server(tmp_path):
    server = ScoringServer(config_for(make_bundle(tmp_path)))
    await server.start()
    yield server
    await server.stop(grace=0.5)


@pytest.fixture
async def channel(server):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield channel


MEMBER = schema.Member(id="m1", headline="Data engineer", skills=("python",), years_experience=3)


def score_request(n: int = 3, **fields) -> scoring_pb2.ScoreRequest:
    items = [item_to_proto(schema.Item(id=f"j{k}", title=f"Job {k}")) for k in range(n)]
    fields.setdefault("top_k", n)
    return scoring_pb2.ScoreRequest(member=member_to_proto(MEMBER), candidates=items, **fields)


async def test_health_not_serving_without_triton(server, channel):
    stub = health_pb2_grpc.HealthStub(channel)
    for name in ("", SERVICE_NAME):
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
    assert not server.core.watcher.ready and server.core.watcher.last_error


async def test_score_is_unavailable_not_hanging(server, channel):
    stub = scoring_pb2_grpc.ScoringServiceStub(channel)
    call = stub.Score(score_request(request_id="req-7"), timeout=10)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert ("x-request-id", "req-7") in tuple(await call.trailing_metadata())


async def test_bad_input_named_even_while_unavailable(channel):
    stub = scoring_pb2_grpc.ScoringServiceStub(channel)
    request = score_request(3)
    request.candidates[2].id = "j0"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Score(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "candidates[2].id: duplicate of candidates[0].id"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Score(scoring_pb2.ScoreRequest(candidates=request.candidates), timeout=10)
    assert info.value.details() == "member: required"


async def test_stream_ends_with_the_failing_message_named(channel):
    stub = scoring_pb2_grpc.ScoringServiceStub(channel)
    bad = score_request(2)
    bad.member.id = ""
    call = stub.ScoreStream(iter([bad, score_request(2)]), timeout=10)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("requests[0].member.id: ")


async def test_stream_unavailable(channel):
    stub = scoring_pb2_grpc.ScoringServiceStub(channel)
    call = stub.ScoreStream(iter([score_request(2)]), timeout=10)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            pass
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert info.value.details().startswith("requests[0]: ")


async def test_reflection_lists_the_service(channel):
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    names = set()
    async for reply in stub.ServerReflectionInfo(iter([request]), timeout=10):
        names |= {s.name for s in reply.list_services_response.service}
    assert {SERVICE_NAME, "grpc.health.v1.Health"} <= names


async def test_metrics_endpoint_counts_requests(server, channel):
    stub = scoring_pb2_grpc.ScoringServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.Score(score_request(), timeout=10)
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    assert 'slimserve_grpc_requests_total{code="UNAVAILABLE",method="ScoringService/Score"} 1.0' in text
    assert "slimserve_grpc_request_duration_seconds_bucket" in text
    assert "slimserve_grpc_requests_in_flight" in text


async def test_stop_returns_and_refuses_new_calls(tmp_path):
    server = ScoringServer(config_for(make_bundle(tmp_path)))
    port = await server.start()
    await asyncio.wait_for(server.stop(grace=1.0), timeout=30)  # a guard against hanging, not a benchmark
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await scoring_pb2_grpc.ScoringServiceStub(channel).Score(score_request(), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def _until(condition, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_the_drain_answers_new_calls_unavailable_while_one_is_in_flight(tmp_path):
    """After drain_delay_s the interceptor refuses new calls itself (UNAVAILABLE, a retry hint), so
    the server's stop has nothing left to cut; the call in flight keeps running and ends the drain."""
    server = ScoringServer(config_for(make_bundle(tmp_path), drain_delay_s=0.05))
    port = await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = scoring_pb2_grpc.ScoringServiceStub(channel)
        stream = stub.ScoreStream()
        await _until(lambda: server.gate.in_flight == 1)
        stopping = asyncio.create_task(server.stop(grace=30))
        await _until(lambda: server.gate.closed)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Score(score_request(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in info.value.details()
        assert not stopping.done()  # the stream is still in flight
        await stream.done_writing()
        assert [response async for response in stream] == []
        await asyncio.wait_for(stopping, timeout=30)
    assert server.gate.in_flight == 0


async def test_core_refuses_without_waiting_and_notices_triton(tmp_path):
    core = ScoringCore.from_config(config_for(make_bundle(tmp_path)))
    try:
        assert await core.watcher.check_once() is False
        with pytest.raises(Unavailable):
            await core.score(MEMBER, [schema.Item(id="a")], timeout_s=5)
        assert await core.watcher.wait_until_ready(timeout=0.1) is False
    finally:
        await core.close()


def test_prepare_buckets_and_chunks(tmp_path):
    core = ScoringCore.from_config(config_for(make_bundle(tmp_path), triton_chunk_size=4))
    items = [schema.Item(id=f"j{k}", description="word " * (k * 20)) for k in range(10)]
    chunks = core.prepare(MEMBER, items)
    assert sorted(i for c in chunks for i in c.indices) == list(range(10))
    for chunk in chunks:
        assert len(chunk.indices) <= 4
        assert chunk.input_ids.shape == chunk.attention_mask.shape
        assert chunk.input_ids.shape[1] in (64, 128, 256)
        lengths = chunk.attention_mask.sum(axis=1)
        assert lengths.max() <= chunk.input_ids.shape[1]


def test_template_version_mismatch_is_refused(tmp_path):
    repo = make_bundle(tmp_path, template="scoring-v0")
    with pytest.raises(BundleError, match="scoring-v0"):
        ScoringCore.from_config(config_for(repo))
    assert load_bundle(repo / "scorer" / "1" / "bundle").prompt_template_version == "scoring-v0"


def test_older_templates_are_served_with_their_own_text(tmp_path):
    cores = {}
    for version in ("scoring-v3", "scoring-v4", prompts.SCORING_TEMPLATE_VERSION):
        (tmp_path / version).mkdir()
        cores[version] = ScoringCore.from_config(
            config_for(make_bundle(tmp_path / version, template=version))
        )
    items = [schema.Item(id="j1", title="Job 1")]
    ids = {v: core.prepare(MEMBER, items)[0].attention_mask.sum() for v, core in cores.items()}
    assert ids["scoring-v3"] == ids["scoring-v4"] != ids[prompts.SCORING_TEMPLATE_VERSION]


def test_rank_orders_by_score_stable_and_cuts():
    items = [schema.Item(id=k) for k in "abcde"]
    scores = np.array([0.5, 2.0, 0.5, np.nan, 3.0], dtype=np.float32)
    ranked = rank(items, scores)
    assert [r.item_id for r in ranked] == ["e", "b", "a", "c", "d"]
    assert [r.rank for r in ranked] == [1, 2, 3, 4, 5]
    assert [r.item_id for r in rank(items, scores, top_k=2)] == ["e", "b"]
    assert len(rank(items, scores, top_k=99)) == 5
