"""ReasoningService end to end on the real Triton binary with the tiny generator repository.

The tiny generator is a random 2-layer Llama with SmolLM2's tokenizer: its text is gibberish, but it is
the real export (ONNX decoder with KV cache), the real decoupled python-backend model with
iteration-level batching, and real token streams. Sampled requests (temperature 1, seeded) decode about
1 ms per token here, so a 512-token request runs long enough to be cancelled in flight.
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
import tritonclient.grpc.aio as triton_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tokenizers import Tokenizer

from slimserve.bundle import TOKENIZER_FILE
from slimserve.client_convert import item_to_proto, member_to_proto
from slimserve.examples import EXAMPLE_MEMBER, example_candidates
from slimserve.generator_bundle import generator_bundle_dir
from slimserve.prompts import explain_names, render_explain_request
from slimserve.reasoning_client import build_options, explain_request, generate_request
from slimserve.serving.reasoning.config import ReasoningServiceConfig
from slimserve.serving.reasoning.server import ReasoningServer
from slimserve.serving.triton.client import GenerationRequest, TritonGeneratorClient
from slimserve.serving.triton.launcher import TritonServer, TritonServerConfig, free_port
from slimserve.tokenization import copy_name_ids
from slimserve.v1 import reasoning_pb2, reasoning_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
LONG = 512  # tokens of a request meant to be still running when it is cancelled (the model's limit)
ITEM = example_candidates(3)[1]


def start_generator_triton(repository: Path, load: bool = True) -> TritonServer:
    config = TritonServerConfig(
        model_repository=repository,
        model_control_mode="explicit",
        load_models=("generator",) if load else (),
        startup_timeout_s=120,
    )
    return TritonServer(config).start()


@pytest.fixture(scope="module")
def triton(generator_repository):
    server = start_generator_triton(generator_repository)
    yield server
    server.stop()


def service_config(repository: Path, triton_url: str, **overrides) -> ReasoningServiceConfig:
    values = dict(
        port=0,
        metrics_port=-1,
        triton_url=triton_url,
        model_repository=repository,
        health_poll_interval_s=0.2,
        drain_grace_s=10,
    )
    return ReasoningServiceConfig(**{**values, **overrides})


@pytest.fixture
async def service(generator_repository, triton):
    server = ReasoningServer(service_config(generator_repository, triton.grpc_url))
    await server.start()
    assert await server.core.watcher.wait_until_ready(timeout=30)
    yield server
    await server.stop(grace=1)


@pytest.fixture
async def stub(service):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        yield reasoning_pb2_grpc.ReasoningServiceStub(channel)


def tokenizer_of(repository: Path) -> Tokenizer:
    return Tokenizer.from_file(str(generator_bundle_dir(repository) / TOKENIZER_FILE))


async def collect(call) -> tuple[list[reasoning_pb2.TextChunk], str, reasoning_pb2.GenerationMetadata]:
    chunks = [chunk async for chunk in call]
    assert [c.index for c in chunks] == list(range(len(chunks))), "chunks out of order"
    assert all(not c.HasField("metadata") for c in chunks[:-1]) and chunks[-1].HasField("metadata")
    return chunks, "".join(c.text for c in chunks), chunks[-1].metadata


def sampled(max_tokens: int = LONG, seed: int = 1, stop: tuple[str, ...] = ()):
    return build_options(max_tokens=max_tokens, temperature=1.0, seed=seed, stop=stop)


def generator_metric(triton: TritonServer, finish_reason: str) -> float:
    text = urllib.request.urlopen(triton.metrics_url, timeout=5).read().decode()
    pattern = rf'^slimserve_generator_requests_total{{[^}}]*finish_reason="{finish_reason}"[^}}]*}} (\S+)$'
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def wait_for_metric(triton: TritonServer, finish_reason: str, at_least: float, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while (value := generator_metric(triton, finish_reason)) < at_least:
        assert time.monotonic() < deadline, f"{finish_reason} requests stayed at {value}, expected {at_least}"
        await asyncio.sleep(0.05)


async def test_explain_streams_the_models_greedy_text_in_order(generator_repository, stub, service):
    from slimserve.export.generator_parity import onnx_greedy

    request = explain_request(EXAMPLE_MEMBER, ITEM, build_options(max_tokens=24, repetition_penalty=1.0))
    _, text, meta = await collect(stub.Explain(request, timeout=30))
    prompt_ids = service.core.encode(render_explain_request(EXAMPLE_MEMBER, ITEM))
    onnx_path = generator_bundle_dir(generator_repository).parent / "model.onnx"
    (greedy,) = onnx_greedy(onnx_path, [prompt_ids], meta.tokens_generated)
    assert text == tokenizer_of(generator_repository).decode(greedy, skip_special_tokens=True)
    assert meta.prompt_tokens == len(prompt_ids)
    assert meta.finish_reason in (reasoning_pb2.FINISH_REASON_LENGTH, reasoning_pb2.FINISH_REASON_STOP)
    if meta.finish_reason == reasoning_pb2.FINISH_REASON_LENGTH:
        assert meta.tokens_generated == 24
    assert meta.response.model_name == "generator" and meta.response.model_version == "1"
    assert meta.response.bundle_hash == service.core.bundle.content_hash
    assert len(meta.response.request_id) == 32
    assert 0 < meta.time_to_first_token_ms <= meta.response.total_ms


async def test_explain_decodes_at_the_explain_penalty_by_default(generator_repository, stub, service):
    """Explain without options decodes at ``explain_repetition_penalty`` (1: the grounded explanation
    may repeat its facts' words), not at Generate's default 1.15: the text equals the model's own engine
    decoding at that penalty, token for token (the tiny random model writes the same at 1.15, so that
    the default resolves per RPC is checked in tests/test_reasoning_unit.py)."""
    from slimserve.triton_models.generator import (
        BatchEngine,
        GenerationRequest,
        OnnxDecoder,
        TokenTexts,
        generate,
    )

    request = explain_request(EXAMPLE_MEMBER, ITEM, build_options(max_tokens=40))
    _, text, meta = await collect(stub.Explain(request, timeout=30))
    prompt_ids = tuple(service.core.encode(render_explain_request(EXAMPLE_MEMBER, ITEM)))
    bundle_dir = generator_bundle_dir(generator_repository)
    decoder = OnnxDecoder(bundle_dir.parent / "model.onnx", 1)
    texts = TokenTexts.of_tokenizer(bundle_dir / TOKENIZER_FILE, decoder.vocab_size)
    engine = BatchEngine(decoder, service.core.bundle.eos_token_ids, texts)
    config = service.core.config
    explain, generate_default = config.explain_repetition_penalty, config.default_repetition_penalty
    _, names = service.core.explain_prompt(EXAMPLE_MEMBER, ITEM)
    names = tuple(map(tuple, names))
    (expected,) = generate(
        engine, [GenerationRequest(prompt_ids, 40, repetition_penalty=explain, copy_names=names)]
    )
    assert (explain, generate_default) == (1.0, 1.15) and meta.tokens_generated == len(expected)
    assert text == tokenizer_of(generator_repository).decode(expected, skip_special_tokens=True)


async def test_explain_sends_the_names_its_prompt_states_unless_turned_off(generator_repository, service):
    """The names go to the model as token ids (each a word after a space), while its bundle takes them and
    ``explain_copy_names`` is on (the default)."""
    text, names = service.core.explain_prompt(EXAMPLE_MEMBER, ITEM)
    tokenizer = tokenizer_of(generator_repository)
    assert text == render_explain_request(EXAMPLE_MEMBER, ITEM) and service.core.bundle.copy_names
    assert names == copy_name_ids(tokenizer, explain_names(EXAMPLE_MEMBER, ITEM)) and len(names) > 5
    words = explain_names(EXAMPLE_MEMBER, ITEM)
    assert [tokenizer.decode(n) for n in names] == [f" {w}" for w in words]
    assert {"python", "machine", "learning", "pytorch", ITEM.company} <= set(words)
    core = service.core
    core.config = core.config.model_copy(update={"explain_copy_names": False})
    try:
        assert core.explain_prompt(EXAMPLE_MEMBER, ITEM) == (text, [])
    finally:
        core.config = core.config.model_copy(update={"explain_copy_names": True})


async def test_sampled_chunks_concatenate_to_the_models_tokens_decoded_at_once(
    generator_repository, triton, stub, service
):
    prompt = "Write a haiku about gRPC streams."
    _, text, meta = await collect(stub.Generate(generate_request(prompt, sampled(200, seed=7)), timeout=30))
    # The same request straight to Triton: its tokens, decoded in one go.
    client = TritonGeneratorClient(triton.grpc_url, model_name="generator", model_version="1")
    try:
        ids = service.core.encode(prompt)
        penalty = service.core.config.default_repetition_penalty
        request = GenerationRequest(ids, max_tokens=200, temperature=1.0, seed=7, repetition_penalty=penalty)
        tokens = [t async for step in client.generate(request, timeout_s=30) for t in step.token_ids]
    finally:
        await client.close()
    assert meta.tokens_generated == len(tokens) > 0
    assert text == tokenizer_of(generator_repository).decode(tokens, skip_special_tokens=True)
    assert len(text) > 100 and meta.tokens_per_second > 0
    _, again, _ = await collect(stub.Generate(generate_request(prompt, sampled(200, seed=7)), timeout=30))
    assert again == text  # same seed, same text


async def test_stop_string_cuts_the_text_and_cancels_the_model_request(triton, stub):
    prompt = "Tell me about Berlin."
    _, full, _ = await collect(stub.Generate(generate_request(prompt, sampled(120, seed=3)), timeout=30))
    stop = full[40:46]
    cut = full.index(stop)
    cancelled_before = generator_metric(triton, "cancelled")
    request = generate_request(prompt, sampled(LONG, seed=3, stop=("never-appears", stop)))
    started = time.monotonic()
    _, text, meta = await collect(stub.Generate(request, timeout=30))
    assert text == full[:cut]
    assert meta.finish_reason == reasoning_pb2.FINISH_REASON_STOP_STRING and meta.stop_string == stop
    assert meta.tokens_generated < LONG
    await wait_for_metric(triton, "cancelled", cancelled_before + 1)
    assert time.monotonic() - started < 30


async def test_cancelling_one_stream_keeps_the_others_and_frees_its_slot(triton, stub):
    """4 slots: 4 long streams fill them, one is cancelled after its first chunk; the other 3 finish with
    exactly the text they produce alone, and a 5th request starts at once in the freed slot."""
    prompts = [f"Story {i}: once upon a time" for i in range(4)]
    alone = []
    for i in (1, 2, 3):
        _, text, _ = await collect(stub.Generate(generate_request(prompts[i], sampled(seed=i)), timeout=30))
        alone.append(text)
    cancelled_before = generator_metric(triton, "cancelled")
    victim = stub.Generate(generate_request(prompts[0], sampled(seed=0)), timeout=30)
    others = [
        asyncio.ensure_future(
            collect(stub.Generate(generate_request(prompts[i], sampled(seed=i)), timeout=30))
        )
        for i in (1, 2, 3)
    ]
    first = await victim.read()
    assert first.text or first.index == 0
    victim.cancel()
    await wait_for_metric(triton, "cancelled", cancelled_before + 1)
    # The freed slot admits a new request while the others are still generating.
    newcomer = stub.Generate(generate_request("Hello", sampled(8, seed=9)), timeout=30)
    newcomer_first = await newcomer.read()
    assert not any(task.done() for task in others), "the others finished before the newcomer started"
    assert newcomer_first.index == 0
    results = await asyncio.gather(*others)
    assert [text for _, text, _ in results] == alone
    assert all(meta.tokens_generated == LONG for _, _, meta in results)
    assert await victim.code() == grpc.StatusCode.CANCELLED


async def test_a_full_model_queue_is_resource_exhausted(stub):
    """4 slots and a queue of 8: of 16 long requests sent at once, the overflow is refused at once."""
    calls = [stub.Generate(generate_request(f"Q{i}", sampled(seed=i)), timeout=30) for i in range(16)]
    reads = [asyncio.ensure_future(call.read()) for call in calls]
    await asyncio.wait(reads, timeout=1.0)  # refusals come back within milliseconds
    refused = [(await call.code(), await call.details()) for call, read in zip(calls, reads, strict=True)
               if read.done() and read.exception() is not None]  # fmt: skip
    for call in calls:
        call.cancel()
    await asyncio.gather(*reads, return_exceptions=True)
    assert 0 < len(refused) <= 8, refused  # at least the queue's 8 fit (plus those already in a slot)
    assert {code for code, _ in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert all("queue is full" in details for _, details in refused)


async def test_deadline_ends_the_stream_and_the_model_request(triton, stub):
    """The 4 slots are busy, so the request waits in the model's queue until its deadline: the caller
    gets DEADLINE_EXCEEDED and the model drops the request (counted as cancelled)."""
    busy = [stub.Generate(generate_request(f"Busy {i}", sampled(seed=20 + i)), timeout=30) for i in range(4)]
    await asyncio.gather(*(call.read() for call in busy))  # all four are decoding
    cancelled_before = generator_metric(triton, "cancelled")
    try:
        call = stub.Generate(generate_request("A long story", sampled(seed=11)), timeout=0.3)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await collect(call)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await wait_for_metric(triton, "cancelled", cancelled_before + 1)
    finally:
        for other in busy:
            other.cancel()


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (generate_request(""), "prompt"),
        (generate_request("hi", build_options(max_tokens=513)), "options.max_tokens"),
        (generate_request("hi", build_options(temperature=2.5)), "options.temperature"),
        (generate_request("hi", build_options(top_p=0.0)), "options.top_p"),
        (generate_request("hi", build_options(repetition_penalty=0.5)), "options.repetition_penalty"),
        (generate_request("hi", build_options(stop=["a", "b", "c", "d", "e"])), "options.stop"),
        (generate_request("hi", build_options(stop=["x" * 65])), "options.stop[0]"),
        (generate_request("word " * 700, build_options(max_tokens=500)), "options.max_tokens"),
        (generate_request("word " * 1500), "prompt"),
        (reasoning_pb2.ExplainRequest(item=item_to_proto(ITEM)), "member"),
        (reasoning_pb2.ExplainRequest(member=member_to_proto(EXAMPLE_MEMBER)), "item"),
    ],
)
async def test_bad_input_is_invalid_argument_naming_the_field(stub, request_, field):
    method = stub.Explain if isinstance(request_, reasoning_pb2.ExplainRequest) else stub.Generate
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await collect(method(request_, timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(f"{field}: "), info.value.details()
    _, _, meta = await collect(stub.Generate(generate_request("still there?", build_options(max_tokens=4))))
    assert meta.tokens_generated >= 1  # the service answers the next good request


async def health(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status


async def wait_for_health(port: int, status: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while await health(port) != status:
        assert time.monotonic() < deadline, f"health did not become {status}"
        await asyncio.sleep(0.1)


async def test_health_is_not_serving_until_the_generator_is_ready(generator_repository):
    triton = start_generator_triton(generator_repository, load=False)
    server = ReasoningServer(service_config(generator_repository, triton.grpc_url))
    try:
        await server.start()
        await asyncio.sleep(0.5)
        assert await health(server.port) == NOT_SERVING
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = reasoning_pb2_grpc.ReasoningServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await collect(stub.Generate(generate_request("hi"), timeout=5))
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            control = triton_aio.InferenceServerClient(triton.grpc_url)
            try:
                await control.load_model("generator")
            finally:
                await control.close()
            await wait_for_health(server.port, SERVING)
            _, _, meta = await collect(stub.Generate(generate_request("hi", build_options(max_tokens=4))))
            assert meta.tokens_generated >= 1
    finally:
        await server.stop(grace=1)
        triton.stop()


async def test_sigterm_drains_a_running_stream(generator_repository, triton):
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "slimserve.cli",
        "serve-reasoning",
        "--port",
        str(port),
        "--metrics-port",
        "-1",
        "--triton-url",
        triton.grpc_url,
        "--model-repository",
        str(generator_repository),
        "--health-poll-interval-s",
        "0.2",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.stdout.read()
            try:
                if await health(port) == SERVING:
                    break
            except grpc.aio.AioRpcError:
                pass
            assert time.monotonic() < deadline, "serve-reasoning did not become healthy"
            await asyncio.sleep(0.2)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = reasoning_pb2_grpc.ReasoningServiceStub(channel)
            call = stub.Generate(generate_request("Drain me", sampled(LONG, seed=5)), timeout=30)
            chunks = [await call.read()]
            process.send_signal(signal.SIGTERM)
            while (chunk := await call.read()) is not grpc.aio.EOF:
                chunks.append(chunk)
        meta = chunks[-1].metadata  # the stream ended normally, long after SIGTERM
        assert meta.finish_reason in (reasoning_pb2.FINISH_REASON_LENGTH, reasoning_pb2.FINISH_REASON_STOP)
        assert meta.tokens_generated > 100
        assert [c.index for c in chunks] == list(range(len(chunks)))
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = process.stdout.read()
    assert "draining" in output and "stopped" in output


async def test_reflection_and_metrics(generator_repository, triton):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    server = ReasoningServer(service_config(generator_repository, triton.grpc_url, metrics_port=0))
    await server.start()
    try:
        assert await server.core.watcher.wait_until_ready(timeout=30)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            replies = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(iter([request]))
            names = {s.name async for reply in replies for s in reply.list_services_response.service}
            assert {"slimserve.v1.ReasoningService", "grpc.health.v1.Health"} <= names
            stub = reasoning_pb2_grpc.ReasoningServiceStub(channel)
            await collect(stub.Explain(explain_request(EXAMPLE_MEMBER, ITEM, build_options(max_tokens=5))))
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    finally:
        await server.stop(grace=1)
    assert 'slimserve_grpc_requests_total{code="OK",method="ReasoningService/Explain"} 1.0' in text
    assert "slimserve_generation_time_to_first_token_seconds_count 1.0" in text
    assert re.search(r'slimserve_generation_tokens_total\{finish_reason="(length|stop)"\} [1-5]\.0', text)


async def test_streams_beyond_the_admission_budget_are_refused_at_once(generator_repository, triton):
    """Budget of 2 streams: with 2 long streams decoding, a third is RESOURCE_EXHAUSTED with a retry hint
    (before its prompt is tokenized); once they are cancelled their slots in the budget come back. A body
    that does not decode is INVALID_ARGUMENT naming the message type."""
    from slimserve.serving.admission import RETRY_PUSHBACK_METADATA

    config = service_config(
        generator_repository, triton.grpc_url, max_streams_in_flight=2, retry_pushback_ms=40
    )
    server = ReasoningServer(config)
    await server.start()
    try:
        assert await server.core.watcher.wait_until_ready(timeout=30)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = reasoning_pb2_grpc.ReasoningServiceStub(channel)
            running = [stub.Generate(generate_request(f"S{i}", sampled(seed=i)), timeout=30) for i in (1, 2)]
            for call in running:
                await call.read()  # both are decoding
            third = stub.Generate(generate_request("one too many", sampled(8)), timeout=30)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await collect(third)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "2 of 2 streams in flight" in info.value.details()
            assert dict(await third.trailing_metadata())[RETRY_PUSHBACK_METADATA] == "40"
            for call in running:
                call.cancel()
            deadline = time.monotonic() + 10
            while server.budget.in_flight:
                assert time.monotonic() < deadline, "cancelled streams kept their admission"
                await asyncio.sleep(0.05)
            _, _, metadata = await collect(stub.Generate(generate_request("next", sampled(4)), timeout=30))
            assert metadata.tokens_generated == 4
            raw = channel.unary_stream("/slimserve.v1.ReasoningService/Generate")  # bytes, no serializer
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in raw(b"\xff\xff\xff not a protobuf", timeout=10):
                    pass
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details() == "request is not a valid GenerateRequest"
    finally:
        await server.stop(grace=1)
