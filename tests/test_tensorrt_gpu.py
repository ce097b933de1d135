"""GPU tier of the TensorRT target: real engines from the tiny scorer's Q/DQ graphs, run and gated.

Skipped where TensorRT, Model Optimizer or a CUDA device is missing (every machine but a GPU node; run
them with scripts/gpu-check.sh inside nvcr.io/nvidia/tensorrt:24.10-py3 or the build image).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

trt = pytest.importorskip(
    "tensorrt", reason="TensorRT is not installed (it ships in nvcr.io/nvidia/tensorrt:24.10-py3)"
)
pytest.importorskip(
    "modelopt.onnx.quantization", reason="nvidia-modelopt is not installed: pip install 'slimserve[gpu]'"
)
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the TensorRT engine tests need an NVIDIA GPU", allow_module_level=True)

from slimserve.compression.smoothquant import smooth_model  # noqa: E402
from slimserve.export.tensorrt.device import FP8_MIN_CC, cc_key, compute_capability, plan_filename  # noqa: E402
from slimserve.export.tensorrt.engine import EngineBuildConfig, build_engine  # noqa: E402
from slimserve.export.tensorrt.modelopt_qdq import quantize_qdq  # noqa: E402
from slimserve.export.tensorrt.parity import engine_parity, onnx_reference_scores  # noqa: E402
from slimserve.export.tensorrt.profiles import bucket_profiles  # noqa: E402
from slimserve.export.tensorrt.runtime import EngineScorer  # noqa: E402
from slimserve.export.tensorrt.settings import ParityThresholds  # noqa: E402
from slimserve.models.teacher import load_teacher  # noqa: E402
from tests.tensorrt_fixtures import BUCKETS, export_fp32, groups_of, varied_prompts  # noqa: E402

LOOSE = ParityThresholds(
    min_pearson=0.99, min_spearman=0.98, min_pairwise_agreement=0.9, min_topk_overlap=0.8
)


@pytest.fixture(scope="module")
def tiny_graphs(tmp_path_factory):
    teacher = load_teacher("tiny", seed=5)
    root = tmp_path_factory.mktemp("trt")
    calibration = varied_prompts(teacher.tokenizer_file, 64, seed=2)
    fp32 = export_fp32(teacher.model, teacher.tokenizer_file, root / "fp32" / "model.onnx")
    smooth_model(teacher.model, calibration, alpha=0.5)
    smoothed = export_fp32(teacher.model, teacher.tokenizer_file, root / "smoothed" / "model.onnx")
    return teacher, root, calibration, fp32, smoothed


def _engine(tiny_graphs, precision: str, name: str):
    teacher, root, calibration, fp32, smoothed = tiny_graphs
    source = smoothed if precision == "int8" else fp32
    qdq = quantize_qdq(source, root / f"qdq_{name}" / "model.onnx", calibration, BUCKETS, precision)
    cc = compute_capability()
    profiles = bucket_profiles(BUCKETS, max_batch_size=16, opt_batch_size=8)
    cache = root / "timing.cache"
    plan = root / name / plan_filename(cc)
    info = build_engine(qdq, plan, profiles, EngineBuildConfig(timing_cache=cache), precision, cc_key(cc))
    return teacher, plan, profiles, info, cache


@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_engine_matches_the_onnx_graph_on_held_out_prompts(tiny_graphs, precision):
    if precision == "fp8" and compute_capability() < FP8_MIN_CC:
        pytest.skip(
            f"FP8 needs compute capability {cc_key(FP8_MIN_CC)}, this GPU is {cc_key(compute_capability())}"
        )
    teacher, plan, profiles, info, cache = _engine(tiny_graphs, precision, precision)
    assert info.strongly_typed and info.tensorrt_version == trt.__version__ and len(info.profiles) == 3
    assert json.loads(plan.with_name(plan.name + ".json").read_text())["precision"] == precision
    assert cache.stat().st_size > 0
    scorer = EngineScorer(plan, profiles)
    assert scorer.engine.num_optimization_profiles == len(BUCKETS)
    held_out = varied_prompts(teacher.tokenizer_file, 96, seed=9)
    reference = onnx_reference_scores(tiny_graphs[3], held_out, BUCKETS)
    report = engine_parity(reference, scorer.score(held_out, BUCKETS, batch_size=16), LOOSE, groups_of(96))
    assert report.passed, report.as_dict()


def test_rebuild_reads_the_timing_cache_and_every_bucket_shape_runs(tiny_graphs, caplog):
    _, _, profiles, _, cache = _engine(tiny_graphs, "int8", "first")
    first_size = cache.stat().st_size
    with caplog.at_level("INFO"):
        _, plan_again, _, _, _ = _engine(tiny_graphs, "int8", "again")
    assert f"timing cache: {cache} ({first_size} bytes)" in caplog.text
    assert cache.stat().st_size >= first_size
    scorer = EngineScorer(plan_again, profiles)
    for bucket in BUCKETS:  # batch 1 and the max batch at each bucket length: the warmup shapes
        for batch in (1, 16):
            ids = np.zeros((batch, bucket), dtype=np.int64)
            mask = np.ones((batch, bucket), dtype=np.int64)
            assert np.isfinite(scorer.score_batch(ids, mask)).all()


def test_multi_item_engine_matches_the_multi_item_onnx_graph(tiny_multi_item_repository, tmp_path):
    """The multi-item engine: Q/DQ on member requests, one profile per item-length bucket, each request
    run in its profile, scores per member against the FP32 multi-item graph."""
    from slimserve.bundle import bundle_dir_for
    from slimserve.evaluation.throughput import scorer_session
    from slimserve.export.tensorrt.profiles import served_multi_item_profiles
    from slimserve.export.tensorrt.runtime import multi_item_scores
    from tests.tensorrt_fixtures import multi_item_groups, multi_item_qdq

    bundle, fp32, qdq = multi_item_qdq(tiny_multi_item_repository, tmp_path / "qdq")
    bundle_dir = bundle_dir_for(tiny_multi_item_repository, "scorer")
    layout = (bundle.item_length_buckets, bundle.max_items_per_request)
    split = bundle.prompt_split
    profiles = served_multi_item_profiles(
        *layout[:1], split.prefix_max_tokens, split.item_max_tokens, layout[1]
    )
    cc = compute_capability()
    plan = tmp_path / "plans" / plan_filename(cc)
    info = build_engine(qdq, plan, profiles, EngineBuildConfig(workspace_gib=2), "int8", cc_key(cc))
    assert len(info.profiles) == len(profiles) and "item_ids" in info.profiles[0]
    held = multi_item_groups(bundle_dir, [1, 8, 8, 3, 8, 8, 8, 4], seed=40)
    session, _ = scorer_session(fp32)
    reference = multi_item_scores(lambda feed: session.run(None, feed)[0], held, 48, *layout)
    engine = multi_item_scores(EngineScorer(plan, profiles).run, held, 48, *layout)
    loose = ParityThresholds(
        min_pearson=0.97, min_spearman=0.97, min_pairwise_agreement=0.9, min_topk_overlap=0.8
    )
    report = engine_parity(reference, engine, loose, groups_of(48))
    assert report.passed, report.as_dict()
