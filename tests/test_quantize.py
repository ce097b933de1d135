"""INT8 scorer graphs for the CPU target (static QDQ and dynamic) and the in-process speed helper."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest

from slimserve.bundle import bundle_dir_for, load_bundle
from slimserve.compression.quantize import (
    QuantizeError,
    calibration_batches,
    quantize_scorer_dynamic,
    quantize_scorer_static,
    quantize_scorer_weight_only,
)
from slimserve.errors import BuildError
from slimserve.evaluation.metrics import spearman
from slimserve.evaluation.throughput import measure_onnx_speed
from slimserve.export.pipeline import parity_prompts
from slimserve.export.triton_config import onnx_io_specs
from slimserve.models.batching import padded_batches
from slimserve.tokenization import PromptTokenizer


@pytest.fixture(scope="module")
def scorer(tiny_repository):
    """(FP32 graph, token-id prompts, buckets) of the session's tiny exported scorer."""
    bundle_dir = bundle_dir_for(tiny_repository, "scorer")
    bundle = load_bundle(bundle_dir)
    tokenizer = PromptTokenizer(bundle_dir / "tokenizer.json", max_length=bundle.max_length)
    sequences = tokenizer.encode(parity_prompts(32))
    return bundle_dir.parent / "model.onnx", sequences, bundle.length_buckets


@pytest.fixture(scope="module")
def int8_graphs(scorer, tmp_path_factory):
    graph, sequences, buckets = scorer
    out = tmp_path_factory.mktemp("int8")
    static = quantize_scorer_static(
        graph, out / "static.onnx", calibration_batches(sequences[:16], buckets, batch_size=8)
    )
    dynamic = quantize_scorer_dynamic(graph, out / "dynamic.onnx")
    weight_only = quantize_scorer_weight_only(graph, out / "weight-only.onnx", block_size=32)
    return {"static": static, "dynamic": dynamic, "weight-only": weight_only}


def _scores(path: Path, sequences, buckets) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    scores = np.zeros(len(sequences))
    for chunk, ids, mask in padded_batches(sequences, buckets, batch_size=8):
        (out,) = session.run(["score"], {"input_ids": ids, "attention_mask": mask})
        assert out.shape == (len(chunk), 1) and out.dtype == np.float32
        scores[chunk] = out.ravel()
    return scores


def _weight_matmuls(path: Path) -> tuple[int, int]:
    """(MatMuls on INT8 weights, via DequantizeLinear or MatMulInteger; decoder MatMuls on float weights)."""
    graph = onnx.load(str(path)).graph
    int8 = {i.name for i in graph.initializer if i.data_type == onnx.TensorProto.INT8}
    # Decoder weights: 2-D float initializers but the label head's (2 outputs; it stays float).
    floats = {
        i.name
        for i in graph.initializer
        if i.data_type == onnx.TensorProto.FLOAT and len(i.dims) == 2 and 2 not in i.dims
    }
    dequantized = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in int8}
    quantized = sum(
        1
        for n in graph.node
        if (n.op_type == "MatMul" and n.input[1] in dequantized)
        or (n.op_type == "MatMulInteger" and n.input[1] in int8)
    )
    still_float = sum(1 for n in graph.node if n.op_type == "MatMul" and n.input[1] in floats)
    return quantized, still_float


@pytest.mark.parametrize("method", ["static", "dynamic"])
def test_int8_graph_keeps_the_serving_contract(scorer, int8_graphs, method):
    graph, _, _ = scorer
    result = int8_graphs[method]
    assert result.method == method and result.path.is_file() and result.seconds > 0
    assert result.size_bytes == result.path.stat().st_size
    assert result.size_bytes < graph.stat().st_size  # the tiny model's float embedding dominates both
    assert onnx_io_specs(result.path) == onnx_io_specs(graph)  # names, dtypes, dims
    # Per layer q, k, v, o, gate, up run on INT8 weights; the down projection (outlier inputs) stays float.
    quantized, still_float = _weight_matmuls(result.path)
    layers = 2
    assert quantized == 6 * layers and still_float == layers


def test_weight_only_graph_keeps_the_serving_contract_with_int8_blocks(scorer, int8_graphs):
    graph, _, _ = scorer
    result = int8_graphs["weight-only"]
    assert result.method == "weight-only" and onnx_io_specs(result.path) == onnx_io_specs(graph)
    nodes = onnx.load(str(result.path)).graph.node
    blocks = [n for n in nodes if n.op_type == "MatMulNBits"]
    assert blocks and all(next(a.i for a in n.attribute if a.name == "bits") == 8 for n in blocks)
    floats = {
        i.name: tuple(i.dims)
        for i in onnx.load(str(result.path)).graph.initializer
        if i.data_type == onnx.TensorProto.FLOAT
    }
    float_heads = [n for n in nodes if n.op_type in ("MatMul", "Gemm") and 2 in floats.get(n.input[1], ())]
    assert len(float_heads) == 1  # the label head (2 outputs) stays float
    with pytest.raises(BuildError, match="block_size"):
        quantize_scorer_weight_only(graph, result.path.with_name("x.onnx"), block_size=24)


def test_static_graph_keeps_attention_and_label_head_in_float(int8_graphs):
    graph = onnx.load(str(int8_graphs["static"].path)).graph
    dequantized = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    attention = [n for n in graph.node if n.op_type == "MatMul" and n.input[1] not in dequantized]
    assert attention and not any(i in dequantized for n in attention for i in n.input)
    # The label head (2 outputs) still multiplies a float weight; no other linear layer has 2 outputs.
    floats = {i.name: tuple(i.dims) for i in graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    (head,) = [n for n in graph.node if n.op_type in ("MatMul", "Gemm") and 2 in floats.get(n.input[1], ())]
    assert head.input[0] not in dequantized


@pytest.mark.parametrize("method", ["static", "dynamic", "weight-only"])
def test_int8_graph_ranks_real_prompts_like_fp32(scorer, int8_graphs, method):
    graph, sequences, buckets = scorer
    reference = _scores(graph, sequences, buckets)
    candidate = _scores(int8_graphs[method].path, sequences, buckets)
    assert np.all(np.isfinite(candidate))
    assert spearman(reference, candidate) > 0.9


def test_static_quantization_options(scorer, tmp_path):
    graph, sequences, buckets = scorer
    result = quantize_scorer_static(
        graph,
        tmp_path / "int8.onnx",
        calibration_batches(sequences[:8], buckets, batch_size=8),
        per_channel=False,
        activation_type="QInt8",
        calibrate_method="Percentile",
    )
    assert onnx_io_specs(result.path) == onnx_io_specs(graph)
    int8_activations = [
        i
        for i in onnx.load(str(result.path)).graph.initializer
        if i.name.endswith("_zero_point") and i.dims == []
    ]
    assert int8_activations and all(i.data_type == onnx.TensorProto.INT8 for i in int8_activations)


def test_corrupt_or_missing_graph_is_a_build_error(tmp_path):
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"this is not a protobuf" * 10)
    batch = (np.ones((1, 8), dtype=np.int64), np.ones((1, 8), dtype=np.int64))
    with pytest.raises(BuildError, match=r"static INT8 quantization of .*corrupt\.onnx failed"):
        quantize_scorer_static(corrupt, tmp_path / "out.onnx", [batch])
    with pytest.raises(BuildError, match="dynamic INT8 quantization"):
        quantize_scorer_dynamic(corrupt, tmp_path / "out.onnx")
    with pytest.raises(QuantizeError, match="not found"):
        quantize_scorer_dynamic(tmp_path / "missing.onnx", tmp_path / "out.onnx")


def test_bad_settings_are_build_errors(scorer, tmp_path):
    graph, sequences, buckets = scorer
    batches = calibration_batches(sequences[:2], buckets, batch_size=2)
    with pytest.raises(QuantizeError, match="calibrate_method"):
        quantize_scorer_static(graph, tmp_path / "a.onnx", batches, calibrate_method="Magic")
    with pytest.raises(QuantizeError, match="at least one calibration batch"):
        quantize_scorer_static(graph, tmp_path / "a.onnx", [])
    with pytest.raises(QuantizeError, match="onto itself"):
        quantize_scorer_dynamic(graph, graph)


def test_calibration_batches_are_padded_to_buckets(scorer):
    _, sequences, buckets = scorer
    batches = calibration_batches(sequences, buckets, batch_size=8)
    assert sum(len(ids) for ids, _ in batches) == len(sequences)
    for ids, mask in batches:
        assert ids.dtype == mask.dtype == np.int64 and ids.shape == mask.shape
        assert ids.shape[0] <= 8 and ids.shape[1] in buckets


def test_measure_onnx_speed_is_well_formed(scorer, int8_graphs):
    _, sequences, buckets = scorer
    speed = measure_onnx_speed(
        int8_graphs["static"].path, sequences, buckets, batch_size=8, seconds=1.0, threads=1
    )
    assert speed.threads == 1 and speed.batch_size == 8
    assert speed.batch_runs >= 1 and speed.single_runs >= 1
    for value in (
        speed.items_per_s_batch32,
        speed.single_item_latency_ms_p50,
        speed.single_item_latency_ms_p99,
    ):
        assert math.isfinite(value) and value > 0
    assert speed.single_item_latency_ms_p99 >= speed.single_item_latency_ms_p50
