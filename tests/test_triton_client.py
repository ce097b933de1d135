"""The Triton scoring client against one real tritonserver per module, plus its error table."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from triton_fixtures import (  # noqa: F401  (the *_fixture imports register fixtures)
    SCORER,
    SMALL_QUEUE_SCORER,
    TEST_BUNDLE_HASH,
    marker,
    scorer_repository_fixture,
    triton_cache_fixture,
    triton_server_fixture,
    wait_for_file,
)
from tritonclient.grpc import InferInput
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from slimserve.bundle import BUNDLE_HASH_PARAMETER, TensorNames
from slimserve.serving.errors import (
    Cancelled,
    DeadlineExceeded,
    InternalError,
    ResourceExhausted,
    Unavailable,
)
from slimserve.serving.triton.client import TritonScorerClient, map_triton_error
from slimserve.serving.triton.launcher import free_port


def batch(rows: int, length: int = 8, sleep_ms: int = 0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random token ids with right-padded masks; a negative first id makes the test model sleep."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 1000, size=(rows, length), dtype=np.int64)
    lengths = rng.integers(1, length + 1, size=rows)
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int64)
    if sleep_ms:
        ids[0, 0] = -sleep_ms
    return ids, mask


@pytest.fixture
async def client(triton_server):
    scorer = TritonScorerClient(triton_server.grpc_url, model_name=SCORER)
    yield scorer
    await scorer.close()


@pytest.fixture
async def small_queue_client(triton_server):
    scorer = TritonScorerClient(triton_server.grpc_url, model_name=SMALL_QUEUE_SCORER)
    yield scorer
    await scorer.close()


async def test_infer_scores_values_and_timings(client: TritonScorerClient):
    ids, mask = batch(5, seed=1)
    result = await client.infer_scores(ids, mask, timeout_s=10, request_id="values")
    assert result.scores.dtype == np.float32 and result.scores.shape == (5,)
    np.testing.assert_array_equal(result.scores, mask.sum(axis=1).astype(np.float32))
    assert result.compute_ms is not None and result.compute_ms > 0
    assert result.round_trip_ms >= result.compute_ms


async def test_model_ready_and_parameters(client: TritonScorerClient, triton_server):
    assert await client.model_ready() is True
    parameters = await client.model_parameters()
    assert parameters[BUNDLE_HASH_PARAMETER] == TEST_BUNDLE_HASH
    unknown = TritonScorerClient(triton_server.grpc_url, model_name="no_such_model")
    assert await unknown.model_ready() is False
    with pytest.raises(Unavailable):  # Triton says NOT_FOUND
        await unknown.infer_scores(*batch(1))
    with pytest.raises(Unavailable):
        await unknown.model_parameters()
    await unknown.close()


async def test_statistics_count_and_dynamic_batching_merges_concurrent_calls(client: TritonScorerClient):
    before = await client.model_statistics()
    results = await asyncio.gather(*(client.infer_scores(*batch(1, seed=i)) for i in range(64)))
    assert len(results) == 64
    # Triton records statistics just after the responses are sent: poll until they settle.
    deadline = time.monotonic() + 5
    after = await client.model_statistics()
    while after.success_count - before.success_count < 64 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        after = await client.model_statistics()
    assert after.inference_count - before.inference_count == 64
    assert after.success_count - before.success_count == 64
    executions = after.execution_count - before.execution_count
    assert 1 <= executions < 64
    assert after.queue_ns > before.queue_ns and after.compute_infer_ns > before.compute_infer_ns


async def test_queue_full_is_resource_exhausted(
    small_queue_client: TritonScorerClient, scorer_repository: Path
):
    busy = asyncio.create_task(small_queue_client.infer_scores(*batch(1, sleep_ms=1000), request_id="busy-1"))
    await wait_for_file(marker(scorer_repository, SMALL_QUEUE_SCORER, "started", "busy-1"))
    results = await asyncio.gather(
        *(small_queue_client.infer_scores(*batch(1, seed=i)) for i in range(8)), return_exceptions=True
    )
    await busy
    rejected = [r for r in results if isinstance(r, ResourceExhausted)]
    assert rejected, results
    assert all(isinstance(r, ResourceExhausted) or hasattr(r, "scores") for r in results)
    assert isinstance(rejected[0].__cause__, InferenceServerException)


async def test_deadline_exceeded_within_bounded_time_and_cancels_in_triton(
    small_queue_client: TritonScorerClient, scorer_repository: Path
):
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        await small_queue_client.infer_scores(
            *batch(1, sleep_ms=3000), timeout_s=0.3, request_id="deadline-1"
        )
    assert time.monotonic() - start < 1.0
    # The gRPC deadline reaches the model as a cancellation (request.is_cancelled()).
    await wait_for_file(marker(scorer_repository, SMALL_QUEUE_SCORER, "cancelled", "deadline-1"))


async def test_cancelling_the_task_cancels_the_grpc_call(
    small_queue_client: TritonScorerClient, scorer_repository: Path
):
    task = asyncio.create_task(
        small_queue_client.infer_scores(*batch(1, sleep_ms=3000), request_id="cancel-1")
    )
    await wait_for_file(marker(scorer_repository, SMALL_QUEUE_SCORER, "started", "cancel-1"))
    task.cancel()
    start = time.monotonic()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - start < 0.5
    await wait_for_file(marker(scorer_repository, SMALL_QUEUE_SCORER, "cancelled", "cancel-1"))
    # The channel is still usable after a cancelled call.
    assert (await small_queue_client.infer_scores(*batch(1))).scores.shape == (1,)


async def test_triton_queue_timeout_is_unavailable_with_known_text_and_maps_to_deadline(
    small_queue_client: TritonScorerClient, triton_server, scorer_repository: Path
):
    """Triton 2.51 reports an expired queue timeout as UNAVAILABLE; this pins the text we map by."""
    busy = asyncio.create_task(small_queue_client.infer_scores(*batch(1, sleep_ms=800), request_id="busy-2"))
    await wait_for_file(marker(scorer_repository, SMALL_QUEUE_SCORER, "started", "busy-2"))
    ids, mask = batch(1, length=9)
    inputs = []
    for name, array in (("input_ids", ids), ("attention_mask", mask)):
        tensor = InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    raw = InferenceServerClient(triton_server.grpc_url)
    try:
        # Triton's queue timeout (100 ms) shorter than the gRPC deadline (10 s): Triton rejects it.
        with pytest.raises(InferenceServerException) as info:
            await raw.infer(SMALL_QUEUE_SCORER, inputs, timeout=100_000, client_timeout=10)
    finally:
        await raw.close()
        await busy
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    assert isinstance(map_triton_error(info.value, "infer"), DeadlineExceeded)


async def test_invalid_argument_from_triton_is_our_internal_error(triton_server):
    wrong = TritonScorerClient(
        triton_server.grpc_url, model_name=SCORER, tensors=TensorNames(attention_mask="not_an_input")
    )
    with pytest.raises(InternalError) as info:
        await wrong.infer_scores(*batch(1))
    assert info.value.__cause__.status() == "StatusCode.INVALID_ARGUMENT"
    await wrong.close()


async def test_unreachable_triton_is_unavailable_fast():
    unreachable = TritonScorerClient(f"127.0.0.1:{free_port()}", model_name=SCORER)
    start = time.monotonic()
    assert await unreachable.model_ready() is False
    with pytest.raises(Unavailable):
        await unreachable.infer_scores(*batch(1), timeout_s=5)
    with pytest.raises(Unavailable):
        await unreachable.model_statistics()
    assert time.monotonic() - start < 3
    await unreachable.close()


def _exc(status: str | None, message: str = "boom") -> InferenceServerException:
    return InferenceServerException(msg=message, status=status)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            _exc("StatusCode.UNAVAILABLE", "[request id: <id_unknown>] Exceeds maximum queue size"),
            ResourceExhausted,
        ),
        (_exc("StatusCode.UNAVAILABLE", "Request timeout expired"), DeadlineExceeded),
        (_exc("StatusCode.UNAVAILABLE", "failed to connect to all addresses"), Unavailable),
        (_exc("StatusCode.UNAVAILABLE", "Stub process 'scorer_0_0' is not healthy."), Unavailable),
        (_exc("StatusCode.DEADLINE_EXCEEDED", "Deadline Exceeded"), DeadlineExceeded),
        (_exc("StatusCode.CANCELLED", "Locally cancelled by application!"), Cancelled),
        (_exc("StatusCode.NOT_FOUND", "Request for unknown model: 'x' is not found"), Unavailable),
        (_exc("StatusCode.RESOURCE_EXHAUSTED"), ResourceExhausted),
        (_exc("StatusCode.INVALID_ARGUMENT", "Exceeds maximum queue size"), InternalError),
        (_exc("StatusCode.INTERNAL", "Request timeout expired"), InternalError),
        (_exc("StatusCode.UNKNOWN"), InternalError),
        (_exc(None, "model version must be a string"), InternalError),
        (ValueError("not a triton error"), InternalError),
    ],
)
def test_error_table(error: BaseException, expected: type):
    mapped = map_triton_error(error, "infer")
    assert type(mapped) is expected
    assert mapped.code == expected.code
    assert "boom" not in mapped.message  # Triton's text stays in the chained exception and the logs


def test_error_table_accepts_raw_grpc_errors():
    error = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), details="connection refused"
    )
    assert isinstance(map_triton_error(error, "infer"), Unavailable)
