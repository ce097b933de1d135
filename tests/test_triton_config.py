"""Triton config generation: spec -> ModelConfig -> config.pbtxt, semantic checks, ONNX agreement."""

from __future__ import annotations

import dataclasses

import onnx
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper
from tritonclient.grpc import model_config_pb2 as mc

from slimserve.export.scorer_model import scorer_triton_spec
from slimserve.export.triton_config import (
    DynamicBatchingSpec,
    InstanceGroupSpec,
    TensorSpec,
    TritonModelSpec,
    VersionPolicySpec,
    WarmupSpec,
    check_against_onnx,
    check_config,
    onnx_io_specs,
    parse_config_pbtxt,
    render_config_pbtxt,
    to_model_config,
)


def tiny_scoring_onnx(path, score_type=TensorProto.FLOAT, ids_name="input_ids"):
    """score[b, 1] = sum(input_ids * attention_mask) over the sequence, as float."""
    ids = helper.make_tensor_value_info(ids_name, TensorProto.INT64, ["batch", "seq"])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])
    score = helper.make_tensor_value_info("score", score_type, ["batch", 1])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    nodes = [
        helper.make_node("Mul", [ids_name, "attention_mask"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axes"], ["summed"], keepdims=1),
        helper.make_node("Cast", ["summed"], ["score"], to=score_type),
    ]
    graph = helper.make_graph(nodes, "tiny_scorer", [ids, mask], [score], initializer=[axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def scorer_spec(**overrides):
    spec = scorer_triton_spec(
        name="scorer",
        max_batch_size=8,
        length_buckets=(32, 64),
        max_queue_delay_us=500,
        max_queue_size=64,
        default_timeout_us=100_000,
        instance_count=2,
        intra_op_threads=1,
        parameters={"EXECUTION_ENV_PATH": "/opt/venv"},
    )
    return dataclasses.replace(spec, **overrides)


def full_spec():
    return TritonModelSpec(
        name="engine",
        backend=None,
        platform="tensorrt_plan",
        max_batch_size=16,
        inputs=(
            TensorSpec("input_ids", "TYPE_INT32", (-1,)),
            TensorSpec("attention_mask", "TYPE_INT32", (-1,)),
        ),
        outputs=(TensorSpec("score", "TYPE_FP16", (1,)),),
        dynamic_batching=DynamicBatchingSpec(
            max_queue_delay_us=100,
            preferred_batch_sizes=(4, 16),
            timeout_action="DELAY",
            allow_timeout_override=False,
            priority_levels=2,
            default_priority_level=1,
        ),
        instance_groups=(InstanceGroupSpec(count=2, kind="KIND_GPU", gpus=(0, 1)),),
        warmups=(
            WarmupSpec(
                "w",
                4,
                {"input_ids": ("TYPE_INT32", (8,), "random"), "attention_mask": ("TYPE_INT32", (8,), "zero")},
            ),
        ),
        version_policy=VersionPolicySpec.specific(1, 3),
        cc_model_filenames={"9.0": "model_sm90.plan"},
        default_model_filename="model.plan",
    )


@pytest.mark.parametrize(
    "spec",
    [
        scorer_spec(),
        full_spec(),
        scorer_spec(version_policy=VersionPolicySpec.all()),
        scorer_spec(version_policy=VersionPolicySpec.latest(3), dynamic_batching=None, warmups=()),
    ],
)
def test_rendered_config_parses_back_and_round_trips(spec):
    text = render_config_pbtxt(spec)
    cfg = parse_config_pbtxt(text)
    assert cfg == to_model_config(spec)
    check_config(cfg)
    assert text_format.MessageToString(cfg) == text
    assert cfg.name == spec.name


def test_scorer_config_fields():
    cfg = parse_config_pbtxt(render_config_pbtxt(scorer_spec()))
    assert cfg.backend == "python"
    assert cfg.max_batch_size == 8
    assert [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in cfg.input] == [
        ("input_ids", "TYPE_INT64", [-1]),
        ("attention_mask", "TYPE_INT64", [-1]),
    ]
    assert [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in cfg.output] == [
        ("score", "TYPE_FP32", [1]),
        ("compute_ms", "TYPE_FP32", [1]),
    ]
    assert cfg.version_policy.latest.num_versions == 1
    queue = cfg.dynamic_batching.default_queue_policy
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 500
    assert (queue.max_queue_size, queue.default_timeout_microseconds) == (64, 100_000)
    assert queue.timeout_action == mc.ModelQueuePolicy.REJECT
    assert cfg.instance_group[0].count == 2
    assert cfg.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    assert cfg.parameters["intra_op_threads"].string_value == "1"
    assert cfg.parameters["EXECUTION_ENV_PATH"].string_value == "/opt/venv"
    warmups = {(w.name, w.batch_size, tuple(w.inputs["input_ids"].dims)) for w in cfg.model_warmup}
    assert warmups == {
        ("len32_batch1", 1, (32,)),
        ("len32_batch8", 8, (32,)),
        ("len64_batch1", 1, (64,)),
    }
    assert all(w.inputs["attention_mask"].zero_data for w in cfg.model_warmup)


def test_full_spec_fields():
    cfg = to_model_config(full_spec())
    assert cfg.platform == "tensorrt_plan" and not cfg.backend
    assert list(cfg.version_policy.specific.versions) == [1, 3]
    assert cfg.cc_model_filenames["9.0"] == "model_sm90.plan"
    assert cfg.default_model_filename == "model.plan"
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 16]
    assert cfg.dynamic_batching.default_queue_policy.timeout_action == mc.ModelQueuePolicy.DELAY
    assert cfg.dynamic_batching.priority_levels == 2
    assert list(cfg.instance_group[0].gpus) == [0, 1]
    assert cfg.model_warmup[0].inputs["input_ids"].random_data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": ""}, "model name is empty"),
        ({"max_batch_size": -1}, "max_batch_size is -1"),
        (
            {"outputs": (TensorSpec("input_ids", "TYPE_FP32", (1,)),)},
            "tensor name 'input_ids' is used by more than one",
        ),
        (
            {"dynamic_batching": DynamicBatchingSpec(max_queue_delay_us=0, preferred_batch_sizes=(4, 32))},
            "preferred batch size 32",
        ),
        ({"max_batch_size": 4}, "warmup 'len32_batch8': batch_size 8 outside [1, 4]"),
        ({"backend": None}, "neither backend nor platform"),
        ({"inputs": (TensorSpec("input_ids", "TYPE_INT64", (0,)),)}, "must be positive or -1"),
        ({"version_policy": VersionPolicySpec.latest(0)}, "num_versions must be >= 1"),
    ],
)
def test_check_config_rejects_bad_configs(change, message):
    cfg = to_model_config(scorer_spec(**change))
    with pytest.raises(ValueError, match="invalid Triton config") as info:
        check_config(cfg)
    assert message in str(info.value)
    with pytest.raises(ValueError):
        render_config_pbtxt(scorer_spec(**change))


def test_check_config_rejects_warmup_mismatches():
    good = scorer_spec()
    bad_type = WarmupSpec(
        "bad_type",
        1,
        {"input_ids": ("TYPE_INT32", (8,), "zero"), "attention_mask": ("TYPE_INT64", (8,), "zero")},
    )
    missing = WarmupSpec("missing", 1, {"input_ids": ("TYPE_INT64", (8,), "zero")})
    unknown = WarmupSpec(
        "unknown",
        1,
        {
            "input_ids": ("TYPE_INT64", (8,), "zero"),
            "attention_mask": ("TYPE_INT64", (8,), "zero"),
            "token_type_ids": ("TYPE_INT64", (8,), "zero"),
        },
    )
    bad_dims = WarmupSpec(
        "bad_dims",
        1,
        {"input_ids": ("TYPE_INT64", (8, 2), "zero"), "attention_mask": ("TYPE_INT64", (-1,), "zero")},
    )
    cases = [
        (bad_type, "data type TYPE_INT32 != declared TYPE_INT64"),
        (missing, "missing inputs ['attention_mask']"),
        (unknown, "undeclared inputs ['token_type_ids']"),
        (bad_dims, "dims [8, 2] do not fit declared [-1]"),
    ]
    for warmup, message in cases:
        with pytest.raises(ValueError) as info:
            check_config(to_model_config(dataclasses.replace(good, warmups=(warmup,))))
        assert message in str(info.value), str(info.value)


def test_unknown_enum_names_are_rejected_clearly():
    with pytest.raises(ValueError, match=r"input 'x': unknown value 'TYPE_INT' \(allowed: .*TYPE_INT64"):
        to_model_config(scorer_spec(inputs=(TensorSpec("x", "TYPE_INT", (-1,)),)))
    with pytest.raises(ValueError, match=r"instance_group\[0\]\.kind: unknown value 'CPU'"):
        to_model_config(scorer_spec(instance_groups=(InstanceGroupSpec(kind="CPU"),)))
    with pytest.raises(ValueError, match="timeout_action"):
        to_model_config(scorer_spec(dynamic_batching=DynamicBatchingSpec(0, timeout_action="DROP")))
    with pytest.raises(ValueError, match="must be a string"):
        to_model_config(scorer_spec(parameters={"intra_op_threads": 2}))


def test_parse_config_pbtxt_names_the_problem():
    with pytest.raises(ValueError, match=r"rejected by Triton's ModelConfig schema.*max_batch_sizes"):
        parse_config_pbtxt('name: "m"\nmax_batch_sizes: 4\n')
    with pytest.raises(ValueError, match="TYPE_FLOAT"):
        parse_config_pbtxt('name: "m"\ninput { name: "x" data_type: TYPE_FLOAT dims: [1] }\n')
    cfg = parse_config_pbtxt('name: "m"\nbackend: "python"\nmax_batch_size: 4\n')
    assert cfg.max_batch_size == 4


def test_onnx_io_specs(tmp_path):
    path = tiny_scoring_onnx(tmp_path / "model.onnx")
    inputs, outputs = onnx_io_specs(path)
    assert inputs == (
        TensorSpec("input_ids", "TYPE_INT64", (-1,)),
        TensorSpec("attention_mask", "TYPE_INT64", (-1,)),
    )
    assert outputs == (TensorSpec("score", "TYPE_FP32", (1,)),)
    unbatched_inputs, _ = onnx_io_specs(path, batched=False)
    assert unbatched_inputs[0].dims == (-1, -1)


def test_check_against_onnx_accepts_matching_spec(tmp_path):
    path = tiny_scoring_onnx(tmp_path / "model.onnx")
    check_against_onnx(scorer_spec(), path, extra_outputs=("compute_ms",))
    with pytest.raises(ValueError, match="output 'compute_ms' is not in the graph"):
        check_against_onnx(scorer_spec(), path)


def test_check_against_onnx_detects_mismatches(tmp_path):
    wrong_type = tiny_scoring_onnx(tmp_path / "fp16.onnx", score_type=TensorProto.FLOAT16)
    with pytest.raises(ValueError, match="output 'score': config TYPE_FP32, graph TYPE_FP16"):
        check_against_onnx(scorer_spec(), wrong_type, extra_outputs=("compute_ms",))
    renamed = tiny_scoring_onnx(tmp_path / "renamed.onnx", ids_name="tokens")
    with pytest.raises(ValueError) as info:
        check_against_onnx(scorer_spec(), renamed, extra_outputs=("compute_ms",))
    assert "input 'input_ids' is not in the graph" in str(info.value)
    assert "graph inputs ['tokens'] are not declared" in str(info.value)
    bad_dims = scorer_spec(outputs=(TensorSpec("score", "TYPE_FP32", (2,)),))
    with pytest.raises(ValueError, match=r"config dims \[2\], graph dims \[1\]"):
        check_against_onnx(bad_dims, tiny_scoring_onnx(tmp_path / "ok.onnx"))
