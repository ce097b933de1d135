"""End to end on the real Triton binary: exported tiny scorer -> Triton -> ScoringService -> gRPC client.

The service tests run for both scorer layouts (single-sequence and multi-item)."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import numpy as np
import onnxruntime as ort
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from slimserve.bundle import bundle_dir_for, load_bundle
from slimserve.client import build_request
from slimserve.examples import EXAMPLE_MEMBER, example_candidates
from slimserve.export.triton_config import check_against_onnx, onnx_io_specs, parse_config_pbtxt
from slimserve.scoring_tokens import encode_scoring
from slimserve.serving.scoring.config import ScoringServiceConfig
from slimserve.serving.scoring.server import ScoringServer
from slimserve.serving.triton.client import TritonScorerClient
from slimserve.tokenization import PromptTokenizer, bucket_for, pad_batch, pad_multi_item
from slimserve.v1 import scoring_pb2_grpc


def service_config(repository, triton_url: str, **overrides) -> ScoringServiceConfig:
    return ScoringServiceConfig(
        port=0,
        metrics_port=-1,
        triton_url=triton_url,
        bundle_dir=bundle_dir_for(repository, "scorer"),
        health_poll_interval_s=0.2,
        drain_grace_s=5,
        **overrides,
    )


@pytest.fixture(params=["single", "multi_item"])
def layout(request):
    """(repository, triton) of one scorer layout."""
    if request.param == "single":
        return request.getfixturevalue("tiny_repository"), request.getfixturevalue("tiny_triton")
    return (
        request.getfixturevalue("tiny_multi_item_repository"),
        request.getfixturevalue("tiny_multi_item_triton"),
    )


@pytest.fixture
async def service(layout):
    repository, triton = layout
    server = ScoringServer(service_config(repository, triton.grpc_url, max_candidates=100))
    await server.start()
    assert await server.core.watcher.wait_until_ready(timeout=30)
    yield server
    await server.stop(grace=1)


@pytest.fixture
async def stub(service):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        yield scoring_pb2_grpc.ScoringServiceStub(channel)


def direct_onnx_scores(repository, candidates) -> np.ndarray:
    """What ONNX Runtime says for each candidate alone (the multi-item graph: the prefix and that one
    item), tokenized as the bundle says."""
    bundle_dir = bundle_dir_for(repository, "scorer")
    bundle = load_bundle(bundle_dir)
    tokenizer = PromptTokenizer(bundle_dir / "tokenizer.json", bundle.max_length)
    session = ort.InferenceSession(str(bundle_dir.parent / "model.onnx"), providers=["CPUExecutionProvider"])
    scores = []
    for item in candidates:
        tokens = encode_scoring(tokenizer, EXAMPLE_MEMBER, [item], bundle.prompt_split)
        if bundle.multi_item:
            arrays = pad_multi_item([tokens.prefix], [tokens.items])
            feed = dict(zip(("prefix_ids", "prefix_mask", "item_ids", "item_mask"), arrays, strict=True))
        else:
            (ids,) = tokens.sequences()
            input_ids, mask = pad_batch([ids], bucket_for(len(ids), bundle.length_buckets))
            feed = {"input_ids": input_ids, "attention_mask": mask}
        scores.append(session.run(None, feed)[0].ravel()[0])
    return np.array(scores)


def test_generated_config_matches_the_onnx_graph(tiny_repository):
    config = parse_config_pbtxt((tiny_repository / "scorer" / "config.pbtxt").read_text())
    onnx_path = bundle_dir_for(tiny_repository, "scorer").parent / "model.onnx"
    inputs, outputs = onnx_io_specs(onnx_path)
    assert (
        [(i.name, i.data_type) for i in inputs]
        == [(t.name, "TYPE_INT64") for t in config.input]
        == [("input_ids", "TYPE_INT64"), ("attention_mask", "TYPE_INT64")]
    )
    assert [(o.name, o.data_type) for o in outputs] == [("score", "TYPE_FP32")]
    assert {o.name for o in config.output} == {"score", "compute_ms"}
    bundle = load_bundle(bundle_dir_for(tiny_repository, "scorer"))
    assert config.parameters["slimserve_bundle_hash"].string_value == bundle.content_hash
    from slimserve.export.scorer_model import scorer_triton_spec

    check_against_onnx(
        scorer_triton_spec("scorer", 64, bundle.length_buckets), onnx_path, extra_outputs=("compute_ms",)
    )


async def test_service_scores_equal_direct_onnx_runtime(stub, layout):
    tiny_repository, _ = layout
    candidates = example_candidates(30)
    # a long description sends some candidates to a bigger length bucket
    candidates[3] = dataclasses.replace(candidates[3], description="Long text. " * 60)
    response = await stub.Score(build_request(EXAMPLE_MEMBER, candidates), timeout=60)
    expected = direct_onnx_scores(tiny_repository, candidates)
    got = {item.item_id: item.score for item in response.items}
    scores = np.array([got[c.id] for c in candidates])
    np.testing.assert_allclose(scores, expected, atol=1e-4)
    expected_order = [candidates[i].id for i in np.argsort(-expected, kind="stable")]
    assert [item.item_id for item in response.items] == expected_order
    assert [item.rank for item in response.items] == list(range(1, 31))
    meta = response.metadata
    assert meta.model_name == "scorer" and meta.model_version == "1"
    assert meta.bundle_hash == load_bundle(bundle_dir_for(tiny_repository, "scorer")).content_hash
    assert meta.total_ms > 0 and meta.inference_ms > 0
    assert meta.queue_ms + meta.inference_ms <= meta.total_ms  # the slowest call, inside the total


async def test_top_k_cuts_the_ranking(stub):
    candidates = example_candidates(12)
    full = await stub.Score(build_request(EXAMPLE_MEMBER, candidates), timeout=60)
    top = await stub.Score(build_request(EXAMPLE_MEMBER, candidates, top_k=3), timeout=60)
    assert [i.item_id for i in top.items] == [i.item_id for i in full.items[:3]]


async def test_dynamic_batching_merges_concurrent_score_calls(stub, layout):
    repository, triton = layout
    # Single-sequence: one Triton inference per candidate; multi-item: one per call (one member), and
    # calls of different members (different prefixes) are merged too.
    per_call = 1 if load_bundle(bundle_dir_for(repository, "scorer")).multi_item else 2
    async with TritonScorerClient(triton.grpc_url, model_name="scorer") as client:
        before = await client.model_statistics()
        candidates = example_candidates(2)
        members = [
            dataclasses.replace(EXAMPLE_MEMBER, id=f"m{i}", skills=EXAMPLE_MEMBER.skills[: 1 + i % 4])
            for i in range(64)
        ]
        calls = [stub.Score(build_request(member, candidates), timeout=60) for member in members]
        responses = await asyncio.gather(*calls)
        after = await settled_statistics(client, before.inference_count + 64 * per_call)
    assert all(len(r.items) == 2 for r in responses)
    inferences = after.inference_count - before.inference_count
    executions = after.execution_count - before.execution_count
    assert inferences == 64 * per_call
    assert executions < inferences, f"{executions} executions for {inferences} inferences: no batching"


async def settled_statistics(client, inference_count: int, timeout_s: float = 10.0):
    """Triton updates its statistics just after sending responses: poll until they include ours."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        stats = await client.model_statistics()
        if stats.inference_count >= inference_count or asyncio.get_running_loop().time() > deadline:
            return stats
        await asyncio.sleep(0.05)


def _bad_requests():
    good = example_candidates(3)
    huge = dataclasses.replace(good[0], description="x" * 5000)
    return {
        "candidates": build_request(EXAMPLE_MEMBER, [], top_k=1),
        "candidates ": build_request(EXAMPLE_MEMBER, example_candidates(101)),  # over max_candidates=100
        "member": _without_member(build_request(EXAMPLE_MEMBER, good)),
        "member.id": build_request(dataclasses.replace(EXAMPLE_MEMBER, id=""), good),
        "member.headline": build_request(dataclasses.replace(EXAMPLE_MEMBER, headline="h" * 5000), good),
        "candidates[0].description": build_request(EXAMPLE_MEMBER, [huge, *good[1:]]),
        "candidates[2].id": build_request(EXAMPLE_MEMBER, [good[0], good[1], good[0]]),
        "candidates[1].id": build_request(EXAMPLE_MEMBER, [good[0], dataclasses.replace(good[1], id="")]),
        "top_k": _with_top_k(build_request(EXAMPLE_MEMBER, good), 0),
    }


def _without_member(request):
    request.ClearField("member")
    return request


def _with_top_k(request, top_k):
    request.top_k = top_k
    return request


@pytest.mark.parametrize("field", list(_bad_requests()))
async def test_bad_input_is_invalid_argument_naming_the_field_and_service_stays_healthy(stub, service, field):
    request = _bad_requests()[field]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Score(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(field.strip() + ":"), info.value.details()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    response = await stub.Score(build_request(EXAMPLE_MEMBER, example_candidates(3)), timeout=30)
    assert len(response.items) == 3


async def test_score_stream_answers_in_order(stub):
    requests = [
        build_request(EXAMPLE_MEMBER, example_candidates(2 + i % 3), request_id=f"r{i}") for i in range(10)
    ]
    responses = [r async for r in stub.ScoreStream(iter(requests), timeout=60)]
    assert [r.metadata.request_id for r in responses] == [f"r{i}" for i in range(10)]
    assert [len(r.items) for r in responses] == [2 + i % 3 for i in range(10)]
