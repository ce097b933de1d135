"""Generator export: batching engine parts, request checks, greedy parity, and the published repository."""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil

import numpy as np
import pytest

from slimserve.bundle import BUNDLE_HASH_PARAMETER
from slimserve.export.generator_config import GeneratorExportConfig
from slimserve.export.generator_parity import (
    compare_greedy,
    encode_prompts,
    explanation_prompts,
    onnx_greedy,
    torch_greedy,
)
from slimserve.export.generator_repository import REPORT_FILE, generator_triton_spec, publish_generator
from slimserve.export.onnx_export import ExportError
from slimserve.export.repository import list_versions
from slimserve.export.triton_config import parse_config_pbtxt, to_model_config
from slimserve.generator_bundle import load_generator_bundle
from slimserve.models.teacher import load_teacher
from slimserve.prompts import EXPLAIN_TEMPLATE_VERSION
from slimserve.triton_models.generator import (
    BatchEngine,
    GenerationRequest,
    KVBatch,
    Limits,
    OnnxDecoder,
    RequestError,
    Sampler,
    execution_providers,
    parse_request,
    penalize_repeats,
)

LIMITS = Limits(vocab_size=100, max_context=64, max_new_tokens_limit=32)


@pytest.fixture(scope="module")
def tiny():
    return load_teacher("tiny", seed=0)


@pytest.fixture(scope="module")
def published(generator_repository):
    """The session's tiny generator repository (real builder, parity gate and publish) and its version dir."""
    return generator_repository, generator_repository / "generator" / "1"


def test_kv_batch_right_pads_rows_and_drops_columns_no_row_needs():
    batch = KVBatch(["k"])
    batch.append({"k": np.ones((1, 2, 3, 4), np.float32)}, 3)
    batch.append({"k": np.full((1, 2, 5, 4), 2, np.float32)}, 5)
    assert batch.rows == 2 and batch.width == 5
    np.testing.assert_array_equal(batch.cache["k"][0, :, 3:], 0)  # row 0 padded on the right
    np.testing.assert_array_equal(batch.step_mask(), [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    batch.keep([0])
    assert batch.width == 3 and batch.lengths.tolist() == [3]
    batch.keep([])
    assert batch.rows == 0 and batch.cache is None


def test_sampler_greedy_seeded_and_top_p():
    logits = np.array([0.0, 3.0, 2.9, -1.0], np.float32)
    assert Sampler()(logits) == 1
    draws = [Sampler(1.0, 1.0, seed=5)(logits) for _ in range(3)]
    assert len(set(draws)) == 1  # same seed, same choice
    rng_draws = Sampler(1.0, 1.0, seed=1)
    assert {rng_draws(logits) for _ in range(200)} >= {1, 2}
    narrow = Sampler(1.0, 0.01, seed=3)
    assert {narrow(logits) for _ in range(50)} == {1}  # top-p keeps only the most likely token


@pytest.mark.parametrize(
    ("tensors", "field"),
    [
        ({"max_tokens": np.array([4], np.int32)}, "input_ids"),
        ({"input_ids": np.array([], np.int64), "max_tokens": np.array([4], np.int32)}, "input_ids"),
        ({"input_ids": np.array([1, 2], np.int64)}, "max_tokens"),
        ({"input_ids": np.array([1, 2], np.int64), "max_tokens": np.array([33], np.int32)}, "max_tokens"),
        ({"input_ids": np.arange(60, dtype=np.int64), "max_tokens": np.array([8], np.int32)}, "input_ids"),
        ({"input_ids": np.array([1, 100], np.int64), "max_tokens": np.array([4], np.int32)}, "input_ids"),
        (
            {
                "input_ids": np.array([1], np.int64),
                "max_tokens": np.array([4], np.int32),
                "top_p": np.array([1.5], np.float32),
            },
            "top_p",
        ),
        (
            {
                "input_ids": np.array([1], np.int64),
                "max_tokens": np.array([4], np.int32),
                "temperature": np.array([np.nan], np.float32),
            },
            "temperature",
        ),
        (
            {
                "input_ids": np.array([1], np.int64),
                "max_tokens": np.array([4], np.int32),
                "repetition_penalty": np.array([0.8], np.float32),
            },
            "repetition_penalty",
        ),
    ],
)
def test_parse_request_names_the_bad_field(tensors, field):
    with pytest.raises(RequestError, match=repr(field)):
        parse_request(tensors, LIMITS)


def test_repetition_penalty_makes_generated_tokens_less_likely():
    logits = np.array([2.0, 1.9, -1.0, 0.5], dtype=np.float32)
    assert penalize_repeats(logits, set(), 1.3) is logits and penalize_repeats(logits, {0}, 1.0) is logits
    np.testing.assert_allclose(penalize_repeats(logits, {0, 2}, 2.0), [1.0, 1.9, -2.0, 0.5])
    sampler = Sampler(repetition_penalty=1.2)
    # 0 first; then 0's 2.0 / 1.2 = 1.67 < 1.9, so 1; then 1's 1.9 / 1.2 = 1.58 < 1.67, so 0 again
    assert [sampler(logits) for _ in range(3)] == [0, 1, 0]
    plain = Sampler()
    assert [plain(logits) for _ in range(3)] == [0, 0, 0]


def test_parse_request_defaults():
    request = parse_request(
        {
            "input_ids": np.array([3, 4], np.int64),
            "max_tokens": np.array([5], np.int32),
            "stop_token_ids": np.array([7]),
        },
        LIMITS,
    )
    assert request == GenerationRequest((3, 4), 5, 0.0, 1.0, None, frozenset({7}))


def test_gpu_device_places_the_instance_on_a_gpu_with_the_cuda_provider():
    config = to_model_config(generator_triton_spec(device="gpu"))
    assert config.instance_group[0].kind == config.instance_group[0].KIND_GPU
    assert config.parameters["execution_provider"].string_value == "cuda"
    cpu = to_model_config(generator_triton_spec())
    assert cpu.parameters["execution_provider"].string_value == "cpu"
    with pytest.raises(ValueError, match="device"):
        generator_triton_spec(device="tpu")


def test_execution_providers_name_what_is_missing():
    assert execution_providers("cpu") == ["CPUExecutionProvider"]
    cuda = execution_providers("cuda", "1", available=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert cuda == [("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"]
    with pytest.raises(ValueError, match="onnxruntime-gpu"):
        execution_providers("cuda", 0, available=["CPUExecutionProvider"])
    with pytest.raises(ValueError, match="execution_provider"):
        execution_providers("rocm")


def test_compare_greedy_reports_agreement():
    parity = compare_greedy([[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 2, 3, 4], [5, 9, 7, 8]])
    assert not parity.identical and parity.identical_sequences == 1
    assert parity.token_agreement == pytest.approx(7 / 8)
    assert parity.prefix_agreement == pytest.approx((1 + 1 / 4) / 2)


def test_published_repository_is_complete_and_consistent(published):
    repository, version_dir = published
    assert version_dir == repository / "generator" / "1"
    config = parse_config_pbtxt((repository / "generator" / "config.pbtxt").read_text())
    assert config.model_transaction_policy.decoupled and config.max_batch_size == 0
    optional = {t.name for t in config.input if t.optional}
    assert optional == {"temperature", "top_p", "seed", "stop_token_ids", "repetition_penalty", "copy_names"}
    bundle = load_generator_bundle(version_dir / "bundle")
    assert bundle.prompt_template_version == EXPLAIN_TEMPLATE_VERSION and set(bundle.eos_token_ids) >= {0, 2}
    assert config.parameters[BUNDLE_HASH_PARAMETER].string_value == bundle.content_hash
    report = json.loads((version_dir / REPORT_FILE).read_text())
    assert report["parity_fp32"]["identical"] is True
    assert (version_dir / "model.py").read_text().startswith('"""Triton python-backend model ``generator``')


def test_a_bundle_published_under_the_old_field_name_still_loads(published, tmp_path):
    """Bundles published before the rename name the template ``template_version``, and those from before
    name copying have no ``copy_names`` (the service then sends no names); they still load."""
    _, version_dir = published
    bundle_dir = shutil.copytree(version_dir / "bundle", tmp_path / "bundle")
    manifest = json.loads((bundle_dir / "generation.json").read_text())
    manifest["template_version"] = manifest.pop("prompt_template_version")
    del manifest["copy_names"]
    (bundle_dir / "generation.json").write_text(json.dumps(manifest))
    old = load_generator_bundle(bundle_dir)
    assert dataclasses.replace(old, copy_names=True) == load_generator_bundle(version_dir / "bundle")
    assert old.prompt_template_version == EXPLAIN_TEMPLATE_VERSION and not old.copy_names


def test_export_config_describes_every_field_and_holds_the_recipe_publish_section():
    """Every field has a description; the recipe's ``generator.publish`` fields are config fields."""
    from slimserve.buildstage.generator_recipe import GeneratorPublishSettings

    assert all(info.description for info in GeneratorExportConfig.model_fields.values())
    recipe = GeneratorPublishSettings(quantize="none", max_queued_requests=3)
    config = GeneratorExportConfig(**recipe.model_dump(exclude={"quantize"}), quantize=None)
    assert config.max_queued_requests == 3 and config.parity_prompts == recipe.parity_prompts
    with pytest.raises(ValueError, match="unknown_key"):
        GeneratorExportConfig(unknown_key=1)


def test_engine_with_staggered_joins_matches_pytorch(published, tiny):
    """Sequences joining a running batch at different steps decode exactly as they do alone."""
    _, version_dir = published
    prompts = encode_prompts(tiny.tokenizer_file, explanation_prompts(3))
    prompts = [prompts[0], prompts[1][:90], prompts[2][:41]]
    expected = torch_greedy(tiny.model, prompts, 10)
    engine = BatchEngine(OnnxDecoder(version_dir / "model.onnx", 1), eos_token_ids=())
    tokens = {index: [] for index in range(3)}
    joins = {0: 0, 3: 1, 5: 2}  # step -> prompt joining before it
    step = 0
    while step < 40 and (engine.active or step <= max(joins)):
        if step in joins:
            event = engine.start(joins[step], GenerationRequest(tuple(prompts[joins[step]]), 10))
            tokens[event.key].append(event.token)
        for event in engine.step():
            tokens[event.key].append(event.token)
        step += 1
    assert [tokens[i] for i in range(3)] == expected
    assert engine.stats.tokens == 30 and engine.stats.steps < 30


def _logits_per_step(decoder, prompts, max_tokens, joins, steps):
    """Every step's logits of an engine where prompt ``joins[step]`` joins before ``step`` and each
    leaves after its ``max_tokens``; and the first KV buffer's address at every step."""
    engine = BatchEngine(decoder, eos_token_ids=())
    logits, addresses = [], []
    run = decoder.decode

    def recording(tokens, batch, *extra):
        logits.append(run(tokens, batch, *extra).copy())
        addresses.append(batch.cache[decoder.past_names[0]].ctypes.data)
        return logits[-1]

    decoder.decode = recording
    for step in range(steps):
        if step in joins:
            index = joins[step]
            engine.start(index, GenerationRequest(tuple(prompts[index]), max_tokens[index]))
        engine.step()
    return logits, addresses


def test_a_decode_step_appends_to_the_kv_cache_in_place_as_the_copying_step_would(published, tiny):
    """On the CPU provider past and present share one buffer: with rows joining and leaving, every
    step's logits equal those of the step that copies the cache, and the buffer moves only to grow."""
    _, version_dir = published
    prompts = encode_prompts(tiny.tokenizer_file, explanation_prompts(3))
    prompts = [prompts[0][:30], prompts[1][:70], prompts[2][:12]]
    max_tokens, joins = (90, 20, 60), {0: 0, 4: 1, 9: 2}
    in_place = OnnxDecoder(version_dir / "model.onnx", 1)
    copying = OnnxDecoder(version_dir / "model.onnx", 1)
    copying.in_place = False
    assert in_place.in_place and in_place.kv_headroom > 0
    expected, _ = _logits_per_step(copying, prompts, max_tokens, joins, 100)
    got, addresses = _logits_per_step(in_place, prompts, max_tokens, joins, 100)
    assert len(got) == len(expected) == 89  # the longest sequence: 90 tokens, the first from its prefill
    for step, (row_logits, want) in enumerate(zip(got, expected, strict=True)):
        np.testing.assert_allclose(row_logits, want, atol=1e-5, err_msg=f"step {step}")
    moves = sum(a != b for a, b in itertools.pairwise(addresses))
    assert moves <= 2  # growths by the headroom only: joins write their row, leaves move rows down


def test_kv_batch_with_headroom_grows_by_it_and_keeps_its_capacity():
    batch = KVBatch(["k"], headroom=8)
    batch.append({"k": np.ones((1, 2, 3, 4), np.float32)}, 3)
    assert batch.capacity == 11 and batch.width == 3  # its 3 positions and the headroom
    batch.reserve(11)
    assert batch.capacity == 11  # room enough: no copy
    batch.reserve(12)
    assert batch.capacity == 20
    batch.append({"k": np.full((1, 2, 5, 4), 2, np.float32)}, 5)
    batch.keep([1])
    assert batch.capacity == 20 and batch.width == 5 and batch.lengths.tolist() == [5]
    np.testing.assert_array_equal(batch.step_mask(), [[1, 1, 1, 1, 1, 1]])


def test_kv_batch_in_place_joins_and_leaves_keep_the_buffers_and_every_row():
    """With headroom a join writes one row and a leave moves the rows after it down; the buffers are
    only replaced to grow, and every kept row holds its own cache, zero beyond its length."""
    batch = KVBatch(["k", "v"], headroom=4)
    rows = {}
    for index, length in enumerate((3, 6, 2, 5)):
        rows[index] = np.full((1, 2, length, 3), index + 1, np.float32)
        batch.append({"k": rows[index], "v": -rows[index]}, length)
    address = batch.cache["k"].ctypes.data
    assert batch.rows == 4 and batch.capacity == 7  # the first row's 3 positions + 4; the others fit
    batch.keep([0, 2, 3])  # row 1 leaves: rows 2 and 3 move down
    batch.append({"k": np.full((1, 2, 4, 3), 9, np.float32), "v": np.zeros((1, 2, 4, 3), np.float32)}, 4)
    assert batch.cache["k"].ctypes.data == address and batch.cache["k"].flags.c_contiguous
    assert batch.lengths.tolist() == [3, 2, 5, 4] and batch.cache["k"].shape == (4, 2, 7, 3)
    for row, (index, length) in enumerate(((0, 3), (2, 2), (3, 5))):
        np.testing.assert_array_equal(batch.cache["k"][row, :, :length], rows[index][0])
        np.testing.assert_array_equal(batch.cache["v"][row, :, :length], -rows[index][0])
        np.testing.assert_array_equal(batch.cache["k"][row, :, length:], 0)
    np.testing.assert_array_equal(batch.cache["k"][3, :, :4], 9)
    batch.append({"k": rows[0], "v": rows[0]}, 3)  # a fifth row: the buffers double their rows
    assert batch.rows == 5 and batch.cache["k"].ctypes.data != address
    np.testing.assert_array_equal(batch.cache["k"][2, :, :5], rows[3][0])
    batch.keep([])
    assert batch.rows == 0 and batch.cache is None


def test_a_stop_token_ends_the_sequence_and_is_not_counted(published, tiny):
    """The stop id ends the request (finish 'stop') without being emitted or counted as generated."""
    _, version_dir = published
    prompt = encode_prompts(tiny.tokenizer_file, explanation_prompts(1))[0]
    greedy = torch_greedy(tiny.model, [prompt], 6)[0]
    engine = BatchEngine(OnnxDecoder(version_dir / "model.onnx", 1), eos_token_ids=())
    request = GenerationRequest(tuple(prompt), 6, stop_token_ids=frozenset({greedy[3]}))
    stop_at = greedy.index(greedy[3])  # the first occurrence of that id ends it
    events = [engine.start(0, request)]
    while engine.active:
        events += engine.step()
    assert [e.token for e in events] == [*greedy[:stop_at], None]
    assert events[-1].finish_reason == "stop"
    assert engine.stats.tokens == stop_at


def test_parity_failure_publishes_nothing(tmp_path, tiny):
    """A model whose PyTorch output the graph cannot reproduce (a forward hook) fails the export."""
    hook = tiny.model.lm_head.register_forward_hook(
        lambda module, args, out: out + 100.0 * (out == out.amax(-1, keepdim=True)).roll(1, -1)
    )
    try:
        with pytest.raises(ExportError, match="parity failed"):
            publish_generator(
                tiny.model,
                tiny.tokenizer_file,
                GeneratorExportConfig(
                    model_repository=tmp_path / "repo", quantize=None, parity_prompts=1, parity_tokens=4
                ),
            )
    finally:
        hook.remove()
    assert list_versions(tmp_path / "repo", "generator") == []


def test_onnx_greedy_matches_pytorch_for_prompts_of_different_lengths(published, tiny):
    _, version_dir = published
    prompts = [[5, 17, 99], [8, 1000, 3, 44, 7, 12, 19], list(range(100, 160))]
    assert onnx_greedy(version_dir / "model.onnx", prompts, 6) == torch_greedy(tiny.model, prompts, 6)


@pytest.mark.slow
def test_packaged_teacher_exports_with_parity_and_int8(tmp_path, packaged_teacher_head):
    """SmolLM2-135M, its bottom six layers (``packaged_teacher_head``: real weights, tokenizer, attention
    layout and vocabulary; the full depth repeats the same operators): FP32 greedy parity on explanation
    prompts, then the INT8 graph published."""
    teacher = packaged_teacher_head
    config = GeneratorExportConfig(
        model_repository=tmp_path / "repo", quantize="int8", source_model=teacher.name, parity_tokens=16
    )
    version_dir = publish_generator(teacher.model, teacher.tokenizer_file, config)
    report = json.loads((version_dir / REPORT_FILE).read_text())
    assert report["parity_fp32"]["identical"] is True
    assert 0.0 <= report["agreement_quantized"]["token_agreement"] <= 1.0
    assert load_generator_bundle(version_dir / "bundle").precision == "int8"


def test_measure_graphs_times_published_versions(published, capsys, tmp_path):
    """`generator_measure --graphs NAME=PATH` times published graphs on the same prompts (no speed asserted)."""
    from slimserve.export.generator_measure import main as measure_main

    _, version_dir = published
    onnx = version_dir / "model.onnx"
    argv = ["--graphs", f"a={onnx}", f"b={onnx}", "--prompts", "2", "--new-tokens", "4"]
    assert measure_main([*argv, "--closed-loop", "2", "--requests", "3"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["command"].endswith("--prompts 2 --new-tokens 4 --closed-loop 2 --requests 3")
    for name in ("a", "b"):
        assert result[name]["single_stream_decode_tokens_per_s"] > 0
        assert result[name]["batch2_decode_tokens_per_s"] > 0
        # 3 requests of 4 tokens on 2 slots: the first token at each prefill, then 3 steps per request,
        # two requests sharing their steps and the third alone.
        assert result[name]["closed2_mean_batch"] == pytest.approx(9 / 6)
        assert result[name]["closed2_tokens_per_s"] > 0 and 0 < result[name]["closed2_prefill_share"] < 1
    with pytest.raises(SystemExit, match="not a published generator version"):
        measure_main(["--graphs", f"x={tmp_path / 'model.onnx'}"])
    for bad in (["--closed-loop", "2", "--requests", "0"], ["--closed-loop", "-1"]):
        with pytest.raises(SystemExit):
            measure_main([*argv, *bad])
        assert "--closed-loop must be >= 0 and --requests >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        measure_main(["--closed-loop", "2"])
    assert "--closed-loop: only with --graphs" in capsys.readouterr().err
