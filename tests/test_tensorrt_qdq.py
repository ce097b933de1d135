"""SmoothQuant and the Model Optimizer Q/DQ graph of the tiny scorer, on CPU (ONNX Runtime runs Q/DQ)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from slimserve.compression.smoothquant import activation_absmax, smooth_model, smoothing_pairs
from slimserve.export.tensorrt.parity import engine_parity, onnx_reference_scores
from slimserve.export.tensorrt.settings import ParityThresholds
from slimserve.models.teacher import load_teacher
from tests.tensorrt_fixtures import BUCKETS, export_fp32, groups_of, torch_scores, varied_prompts


@pytest.fixture(scope="module")
def tiny():
    return load_teacher("tiny", seed=3)


def _spread(model, sequences) -> float:
    maxima = activation_absmax(model, smoothing_pairs(model), sequences)
    return max(float(m.max() / m.median()) for m in maxima)


def test_smoothquant_keeps_the_function_and_flattens_outlier_channels(tiny):
    model = tiny.model
    sequences = varied_prompts(tiny.tokenizer_file, 12)
    with torch.no_grad():  # an outlier channel, as trained LLMs have: 40x on one norm channel
        model.model.layers[0].input_layernorm.weight[5] *= 40.0
    before = torch_scores(model, tiny.tokenizer_file, sequences)
    spread_before = _spread(model, sequences)
    spreads = smooth_model(model, sequences, alpha=0.5)
    after = torch_scores(model, tiny.tokenizer_file, sequences)
    torch.testing.assert_close(after, before, atol=1e-4, rtol=1e-4)
    assert set(spreads) == {f"layers.{i}.{p}" for i in range(2) for p in ("attn", "mlp")}
    assert max(spreads.values()) < spread_before / 3, (spread_before, spreads)
    with pytest.raises(ValueError, match="alpha"):
        smooth_model(model, sequences, alpha=0.0)


@pytest.fixture(scope="module")
def fp32_graph(tmp_path_factory):
    teacher = load_teacher("tiny", seed=5)
    path = export_fp32(teacher.model, teacher.tokenizer_file, tmp_path_factory.mktemp("fp32") / "model.onnx")
    return teacher, path


def _quantized(fp32_graph, directory, precision: str, prompts: int):
    """(teacher, FP32 graph, Q/DQ graph, its node summary); skipped without Model Optimizer."""
    pytest.importorskip(
        "modelopt.onnx.quantization",
        reason="nvidia-modelopt (ONNX PTQ) is not installed: pip install 'slimserve[gpu]'",
    )
    from slimserve.export.tensorrt.modelopt_qdq import qdq_summary, quantize_qdq

    teacher, fp32 = fp32_graph
    calibration = varied_prompts(teacher.tokenizer_file, prompts, seed=2)
    qdq = quantize_qdq(
        fp32, directory / precision / "model.onnx", calibration, BUCKETS, precision, provider="cpu"
    )
    return teacher, fp32, qdq, qdq_summary(qdq)


def test_int8_qdq_graph_from_real_prompts_keeps_the_ranking(fp32_graph, tmp_path):
    teacher, fp32, qdq, summary = _quantized(fp32_graph, tmp_path, "int8", 24)
    assert summary["QuantizeLinear"] > 10 and summary["DequantizeLinear"] >= summary["QuantizeLinear"]
    graph = onnx.load(str(qdq))
    assert [i.name for i in graph.graph.input] == ["input_ids", "attention_mask"]
    assert [(o.name, o.type.tensor_type.elem_type) for o in graph.graph.output] == [
        ("score", onnx.TensorProto.FLOAT)
    ]
    # the layers left unquantized are FP16: a strongly typed build runs what the graph says
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in graph.graph.initializer)
    held_out = varied_prompts(teacher.tokenizer_file, 48, seed=9)
    reference = onnx_reference_scores(fp32, held_out, BUCKETS)
    quantized = onnx_reference_scores(qdq, held_out, BUCKETS)
    assert not np.allclose(reference, quantized, atol=1e-6)  # it really is quantized
    # a random 2-layer model calibrated on 24 prompts: looser than the gpu recipe's gate (0.99/0.99/0.97/0.9)
    loose = ParityThresholds(
        min_pearson=0.99, min_spearman=0.98, min_pairwise_agreement=0.9, min_topk_overlap=0.8
    )
    report = engine_parity(reference, quantized, loose, groups_of(48))
    assert report.passed, report.as_dict()


def test_fp8_qdq_graph_uses_float8(fp32_graph, tmp_path):
    _, _, _, summary = _quantized(fp32_graph, tmp_path, "fp8", 12)
    assert summary["QuantizeLinear"] > 10
    assert any(k.startswith("zero_point_float8") for k in summary), summary


def test_multi_item_int8_qdq_graph_calibrated_on_member_requests(tiny_multi_item_repository, tmp_path):
    """The multi-item graph through Model Optimizer on the feeds the GPU stage gives it (member
    requests, as the service sends them), run in ONNX Runtime against the FP32 multi-item graph."""
    pytest.importorskip(
        "modelopt.onnx.quantization",
        reason="nvidia-modelopt (ONNX PTQ) is not installed: pip install 'slimserve[gpu]'",
    )
    from slimserve.bundle import bundle_dir_for
    from slimserve.evaluation.throughput import scorer_session
    from slimserve.export.tensorrt.modelopt_qdq import qdq_summary
    from slimserve.export.tensorrt.runtime import multi_item_scores
    from tests.tensorrt_fixtures import multi_item_groups, multi_item_qdq

    bundle, fp32, qdq = multi_item_qdq(tiny_multi_item_repository, tmp_path / "qdq", provider="cpu")
    bundle_dir = bundle_dir_for(tiny_multi_item_repository, "scorer")
    layout = (bundle.item_length_buckets, bundle.max_items_per_request)
    summary = qdq_summary(qdq)
    assert summary["QuantizeLinear"] > 10 and summary["DequantizeLinear"] >= summary["QuantizeLinear"]
    graph = onnx.load(str(qdq))
    assert [i.name for i in graph.graph.input] == ["prefix_ids", "prefix_mask", "item_ids", "item_mask"]
    held = multi_item_groups(bundle_dir, [8] * 6, seed=40)

    def scores(path):
        session, _ = scorer_session(path)
        return multi_item_scores(lambda feed: session.run(None, feed)[0], held, 48, *layout)

    reference, quantized = scores(fp32), scores(qdq)
    assert not np.allclose(reference, quantized, atol=1e-6)
    loose = ParityThresholds(
        min_pearson=0.98, min_spearman=0.95, min_pairwise_agreement=0.85, min_topk_overlap=0.6
    )
    report = engine_parity(reference, quantized, loose, groups_of(48))
    assert report.passed, report.as_dict()
