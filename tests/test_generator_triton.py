"""The ``generator`` Triton model in the real tritonserver (tiny random Llama), over gRPC streaming.

One Triton stream per request (tritonclient's ``start_stream``), so stopping a stream cancels only its
request, as the ReasoningService does.
"""

from __future__ import annotations

import queue
import re
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from slimserve.export.generator_parity import encode_prompts, explanation_prompts, torch_greedy
from slimserve.export.generator_repository import build_tiny_generator_repository
from slimserve.models.teacher import load_teacher
from slimserve.serving.triton.launcher import TritonServer, TritonServerConfig
from slimserve.triton_models.generator import BatchEngine, GenerationRequest, OnnxDecoder
from slimserve.triton_models.generator import generate as run_engine

MODEL = "generator"
CHUNKED = "generator_chunked"  # the same model publishing every STREAM_INTERVAL tokens
SHORTLISTED = "generator_shortlist"  # the same model, its LM head scoring ids 0..999 and the prompt's
STREAM_INTERVAL = 3
MAX_ACTIVE = 2
MAX_QUEUED = 2
MAX_CONTEXT = 1024
LONG = 1000  # max_tokens of requests meant to outlive the test's actions
SHARED_TOKENS = 200  # long enough for two requests sent together to overlap
KEEP_TOKENS = 400  # the stream that must run on, undisturbed, while another is cancelled


@pytest.fixture(scope="module")
def tiny_model():
    return load_teacher("tiny", seed=0)


@pytest.fixture(scope="module")
def generator_triton(tmp_path_factory):
    repository = tmp_path_factory.mktemp("generator-repo")
    build_tiny_generator_repository(
        repository,
        max_context=MAX_CONTEXT,
        max_new_tokens_limit=LONG,
        max_active_sequences=MAX_ACTIVE,
        max_queued_requests=MAX_QUEUED,
    )
    build_tiny_generator_repository(repository, model_name=CHUNKED, stream_interval=STREAM_INTERVAL)
    build_tiny_generator_repository(repository, model_name=SHORTLISTED, output_vocab=1000)
    config = TritonServerConfig(
        model_repository=repository,
        model_control_mode="explicit",
        load_models=(MODEL, CHUNKED, SHORTLISTED),
        log_file=tmp_path_factory.mktemp("generator-log") / "tritonserver.log",
        startup_timeout_s=120,
        exit_timeout_s=5,
    )
    with TritonServer(config) as server:
        yield server


@pytest.fixture(scope="module")
def prompts(tiny_model):
    """Three explanation prompts of different lengths (token ids)."""
    sequences = encode_prompts(tiny_model.tokenizer_file, explanation_prompts(3))
    return [sequences[0], sequences[1][:150], sequences[2][:77]]


@dataclass
class Stream:
    """One request on its own Triton stream; collects responses as they arrive."""

    url: str
    responses: queue.Queue = field(default_factory=queue.Queue)
    tokens: list = field(default_factory=list)
    chunks: list = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    first_token_at: float | None = None
    done_at: float | None = None

    def __post_init__(self):
        self.client = grpcclient.InferenceServerClient(self.url)
        self.done = threading.Event()
        self.client.start_stream(callback=self._callback)

    def _callback(self, result, error):
        now = time.monotonic()
        if error is not None:
            self.error = str(error)
            self.done_at = now
            self.done.set()
            return
        tokens = result.as_numpy("token_ids").tolist()
        if tokens and self.first_token_at is None:
            self.first_token_at = now
        self.chunks.append(tokens)
        self.tokens.extend(tokens)
        reason = result.as_numpy("finish_reason")[0].decode()
        if reason:
            self.finish_reason = reason
            self.done_at = now
            self.done.set()

    def send(self, input_ids, max_tokens, model=MODEL, **options):
        inputs = [_tensor("input_ids", np.asarray(input_ids, np.int64), "INT64")]
        inputs.append(_tensor("max_tokens", np.array([max_tokens], np.int32), "INT32"))
        kinds = {
            "temperature": (np.float32, "FP32"),
            "top_p": (np.float32, "FP32"),
            "seed": (np.uint64, "UINT64"),
        }
        for name, value in options.items():
            if name == "stop_token_ids":
                inputs.append(_tensor(name, np.asarray(value, np.int64), "INT64"))
            else:
                dtype, triton_type = kinds[name]
                inputs.append(_tensor(name, np.array([value], dtype), triton_type))
        self.client.async_stream_infer(model, inputs)
        return self

    def wait(self, timeout=60.0):
        assert self.done.wait(timeout), (
            f"no final response within {timeout} s (tokens so far {len(self.tokens)})"
        )
        return self

    def wait_tokens(self, count, timeout=30.0):
        deadline = time.monotonic() + timeout
        while len(self.tokens) < count:
            assert not self.done.is_set(), (
                f"finished ({self.finish_reason}, {self.error}) before {count} tokens"
            )
            assert time.monotonic() < deadline, f"fewer than {count} tokens within {timeout} s"
            time.sleep(0.002)

    def cancel(self):
        self.client.stop_stream(cancel_requests=True)

    def close(self):
        self.client.stop_stream()
        self.client.close()


def _tensor(name, array, triton_type):
    tensor = grpcclient.InferInput(name, list(array.shape), triton_type)
    tensor.set_data_from_numpy(array)
    return tensor


def generate(server, input_ids, max_tokens, **options) -> Stream:
    stream = Stream(server.grpc_url).send(input_ids, max_tokens, **options).wait()
    stream.close()
    return stream


def metrics(server, model=MODEL) -> dict[str, float]:
    """``model``'s custom metrics (name{labels} -> value) from Triton's metrics port."""
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    found = {}
    for line in text.splitlines():
        match = re.match(r"(slimserve_generator_\w+)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if match and f'model="{model}"' in (match.group(2) or ""):
            labels = match.group(2)
            reason = re.search(r'finish_reason="(\w+)"', labels)
            found[match.group(1) + (f"[{reason.group(1)}]" if reason else "")] = float(match.group(3))
    return found


def settled_metrics(server, timeout_s: float = 10.0) -> dict[str, float]:
    """The metrics once two reads 0.3 s apart agree (the model flushes its counters when idle)."""
    deadline = time.monotonic() + timeout_s
    previous = metrics(server)
    while time.monotonic() < deadline:
        time.sleep(0.3)
        current = metrics(server)
        if current == previous:
            return current
        previous = current
    return previous


def test_greedy_tokens_stream_in_order_and_equal_pytorch(generator_triton, tiny_model, prompts):
    expected = torch_greedy(tiny_model.model, [prompts[0]], 12)[0]
    stream = generate(generator_triton, prompts[0], 12)
    assert stream.error is None
    assert stream.finish_reason == "length"
    assert stream.tokens == expected
    assert len(stream.chunks) == 12  # one token per decoding step, in order, the last one final


def test_a_shortlisted_head_streams_what_its_engine_writes_in_process(generator_triton, prompts):
    version = generator_triton.config.model_repository / SHORTLISTED / "1"
    engine = BatchEngine(OnnxDecoder(version / "model.onnx", 1))
    assert engine.decoder.shortlist is not None
    for prompt in prompts[:2]:
        (expected,) = run_engine(engine, [GenerationRequest(tuple(prompt), 12)])
        stream = generate(generator_triton, prompt, 12, model=SHORTLISTED)
        assert stream.error is None and stream.finish_reason == "length"
        assert stream.tokens == expected


@pytest.mark.parametrize("max_tokens, sizes", [(10, [1, 3, 3, 3]), (9, [1, 3, 3, 2])])
def test_stream_interval_sends_the_first_token_then_chunks(
    generator_triton, tiny_model, prompts, max_tokens, sizes
):
    """With ``stream_interval`` 3 the first token comes alone (time to first token), then three at a
    time; the final response carries the rest. The tokens are the same as one at a time."""
    expected = torch_greedy(tiny_model.model, [prompts[1]], max_tokens)[0]
    stream = Stream(generator_triton.grpc_url).send(prompts[1], max_tokens, model=CHUNKED).wait()
    stream.close()
    assert stream.error is None and stream.finish_reason == "length"
    assert [len(c) for c in stream.chunks] == sizes
    assert stream.tokens == expected


def test_concurrent_requests_share_decoding_steps(generator_triton, tiny_model, prompts):
    before = settled_metrics(generator_triton)
    expected = torch_greedy(tiny_model.model, prompts[:2], SHARED_TOKENS)
    streams = [Stream(generator_triton.grpc_url) for _ in range(2)]  # connect first, then send together
    for stream, prompt in zip(streams, prompts[:2], strict=True):
        stream.send(prompt, SHARED_TOKENS)
    for stream in streams:
        stream.wait().close()
    assert [s.tokens for s in streams] == expected  # batching does not change anyone's tokens
    after = settled_metrics(generator_triton)
    steps = after["slimserve_generator_steps_total"] - before["slimserve_generator_steps_total"]
    tokens = after["slimserve_generator_tokens_total"] - before["slimserve_generator_tokens_total"]
    assert tokens == 2 * SHARED_TOKENS
    assert tokens / steps > 1.2, f"{tokens} tokens in {steps} steps: requests did not share steps"
    assert (
        after["slimserve_generator_requests_total[length]"]
        - before["slimserve_generator_requests_total[length]"]
        == 2
    )


def test_cancelling_one_stream_frees_its_slot_and_spares_the_others(generator_triton, tiny_model, prompts):
    before = settled_metrics(generator_triton)
    keep = Stream(generator_triton.grpc_url).send(prompts[1], KEEP_TOKENS)
    victim = Stream(generator_triton.grpc_url).send(prompts[2], LONG - 200)
    keep.wait_tokens(1)
    victim.wait_tokens(1)
    waiting = Stream(generator_triton.grpc_url).send(prompts[0][:20], 5)  # both slots are taken: queued
    time.sleep(0.05)
    assert waiting.first_token_at is None, "a third request ran although max_active_sequences is 2"
    victim.cancel()
    waiting.wait(30)
    assert waiting.finish_reason == "length" and len(waiting.tokens) == 5
    assert not keep.done.is_set(), "the queued request ran only after the other stream finished"
    keep.wait(120).close()
    assert keep.finish_reason == "length"
    assert keep.tokens == torch_greedy(tiny_model.model, [prompts[1]], KEEP_TOKENS)[0]
    waiting.close()
    after = settled_metrics(generator_triton)
    assert (
        after["slimserve_generator_requests_total[cancelled]"]
        - before["slimserve_generator_requests_total[cancelled]"]
        == 1
    )
    assert after["slimserve_generator_active_sequences"] == 0


def test_queue_full_is_an_error(generator_triton, prompts):
    running = [Stream(generator_triton.grpc_url).send(prompts[0][:30], LONG - 100) for _ in range(MAX_ACTIVE)]
    for stream in running:
        stream.wait_tokens(1)
    queued = [Stream(generator_triton.grpc_url).send(prompts[0][:30], 5) for _ in range(MAX_QUEUED)]
    time.sleep(0.05)
    rejected = Stream(generator_triton.grpc_url).send(prompts[0][:30], 5).wait(10)
    assert rejected.error is not None and "queue full" in rejected.error
    for stream in running:
        stream.cancel()
    for stream in queued:
        stream.wait(30).close()
        assert stream.finish_reason == "length"
    rejected.close()


@pytest.mark.parametrize(
    ("input_ids", "max_tokens", "options", "field"),
    [
        ([], 5, {}, "input_ids"),
        ([5, 6, 7], LONG + 1, {}, "max_tokens"),
        ([5] * (MAX_CONTEXT - 10), 20, {}, "input_ids"),
        ([5, 6, 7], 0, {}, "max_tokens"),
        ([5, 6, 7], 5, {"temperature": 9.0}, "temperature"),
        ([5, 6, 7], 5, {"top_p": 0.0}, "top_p"),
        ([5, 10**9], 5, {}, "input_ids"),
    ],
)
def test_bad_input_gets_an_error_naming_the_field(generator_triton, input_ids, max_tokens, options, field):
    stream = generate(generator_triton, input_ids, max_tokens, **options)
    assert stream.error is not None and repr(field) in stream.error
    assert stream.tokens == []


def test_sampling_is_per_request_and_seeded(generator_triton, prompts):
    first = generate(generator_triton, prompts[2], 16, temperature=1.0, top_p=0.9, seed=7)
    again = generate(generator_triton, prompts[2], 16, temperature=1.0, top_p=0.9, seed=7)
    other = generate(generator_triton, prompts[2], 16, temperature=1.0, top_p=0.9, seed=8)
    greedy = generate(generator_triton, prompts[2], 16)
    assert first.tokens == again.tokens
    assert first.tokens != other.tokens
    assert first.tokens != greedy.tokens


def test_stop_token_ends_a_request(generator_triton, tiny_model, prompts):
    expected = torch_greedy(tiny_model.model, [prompts[1]], 20)[0]
    stop = next((t for t in expected[1:] if t != expected[0]), expected[0])
    stream = generate(generator_triton, prompts[1], 20, stop_token_ids=[stop])
    assert stream.finish_reason == "stop"
    assert stream.tokens == expected[: expected.index(stop)]


def test_unloading_finalizes_cleanly_and_reload_serves(generator_triton, prompts):
    """Unload while a stream runs: the stream ends (its tokens or an error), the model unloads, and a
    reload serves again."""
    running = Stream(generator_triton.grpc_url).send(prompts[0][:30], 300)
    running.wait_tokens(1)
    client = grpcclient.InferenceServerClient(generator_triton.grpc_url)
    try:
        client.unload_model(MODEL)
        running.wait(60)
        assert running.finish_reason == "length" or running.error is not None
        deadline = time.monotonic() + 60
        while client.is_model_ready(MODEL):
            assert time.monotonic() < deadline, "the generator did not unload"
            time.sleep(0.1)
        client.load_model(MODEL)
        assert generate(generator_triton, prompts[0][:30], 3).finish_reason == "length"
    finally:
        running.close()
        client.close()
