"""The INT8 stage (export the student, quantize, evaluate in ONNX Runtime, measure speed) and publishing."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ..evaluation.report import StageRow
from ..export.scorer_graph import ScorerGraph
from . import artifacts
from .context import BuildData
from .recipe import Recipe
from .stages import evaluate_scores, label_ids

log = logging.getLogger(__name__)


def export_graph(model_lm, data: BuildData, recipe: Recipe, path: Path) -> Path:
    """FP32 ONNX of a causal LM's scoring graph, checked against PyTorch on 32 test prompts."""
    from ..export.pipeline import export_checked_onnx

    graph = ScorerGraph(model_lm, *label_ids(data)).eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    files, _ = export_checked_onnx(graph, path, data.sequences["test"][:32], recipe.publish.length_buckets)
    return files[0]


def onnx_logits_margin(onnx_path: Path, sequences: list[list[int]], buckets) -> np.ndarray:
    """Scores (margins) of an ONNX scorer on sequences, padded to buckets as the service does."""
    from ..evaluation.throughput import scorer_session
    from ..export.parity import padded_batches

    session, _ = scorer_session(onnx_path)
    out = np.zeros(len(sequences), dtype=np.float64)
    for chunk, ids, mask in padded_batches(sequences, buckets, batch_size=32):
        out[chunk] = session.run(None, {"input_ids": ids, "attention_mask": mask})[0].ravel()
    return out


def _speed(row: StageRow, onnx_path: Path, data: BuildData, recipe: Recipe) -> None:
    from ..compression.quantize import model_bytes
    from ..evaluation.throughput import measure_onnx_speed

    speed = measure_onnx_speed(
        onnx_path, data.sequences["test"][:256], recipe.publish.length_buckets, seconds=recipe.speed_seconds
    )
    row.items_per_s_batch32 = speed.items_per_s_batch32
    row.single_item_ms = speed.single_item_latency_ms_p50
    row.file_mb = model_bytes(onnx_path) / 1e6


def run_int8(
    recipe: Recipe, data: BuildData, teacher_dir: Path, student_dir: Path, out: Path, rows: list[StageRow]
):
    """Quantize the final student; returns (int8 row, chosen INT8 graph). Adds speed to earlier rows."""
    from ..compression.quantize import (
        calibration_batches,
        quantize_scorer_dynamic,
        quantize_scorer_static,
        quantize_scorer_weight_only,
    )

    buckets = recipe.publish.length_buckets
    teacher_test = artifacts.load_array(teacher_dir, "logits_test")
    student_lm = artifacts.load_causal_lm(student_dir / "model")
    fp32 = export_graph(student_lm, data, recipe, out / "fp32" / "model.onnx")
    teacher_fp32 = export_graph(
        artifacts.load_causal_lm(teacher_dir / "model"), data, recipe, out / "teacher_fp32" / "model.onnx"
    )
    by_stage = {r.stage: r for r in rows}
    _speed(by_stage["teacher fine-tuned"], teacher_fp32, data, recipe)
    _speed(by_stage["pruned + re-distilled"], fp32, data, recipe)

    teacher_auc = by_stage["teacher fine-tuned"].test_auc
    settings = recipe.quantize
    methods = ["static", "weight-only", "dynamic"] if settings.method == "auto" else [settings.method]
    candidates = []
    for method in methods:
        target = out / f"int8_{method}" / "model.onnx"
        target.parent.mkdir(parents=True, exist_ok=True)
        if method == "static":
            calibration = calibration_batches(data.calibration(recipe.data.calibration_examples), buckets)
            quantize_scorer_static(fp32, target, calibration, per_channel=settings.per_channel)
        elif method == "weight-only":
            quantize_scorer_weight_only(fp32, target, block_size=settings.block_size)
        else:
            quantize_scorer_dynamic(fp32, target, per_channel=settings.per_channel)
        margin = onnx_logits_margin(target, data.sequences["test"], buckets)
        row = evaluate_scores(f"INT8 ({method})", margin, data, teacher_test)
        row.parameters, row.embedding_parameters = artifacts.parameter_counts(student_lm)
        row.retention = row.test_auc / teacher_auc
        candidates.append((row, target))
        if row.retention >= recipe.gates.int8:
            break
        log.warning("INT8 %s: retention %.4f below the gate %.4f", method, row.retention, recipe.gates.int8)
    row, chosen = max(candidates, key=lambda c: c[0].test_auc)
    _speed(row, chosen, data, recipe)
    return row, chosen


def publish(recipe: Recipe, data: BuildData, onnx_path: Path, tokenizer_file: Path, card: str, source: str):
    """Publish the INT8 student as the scorer (atomic), with bundle and model card."""
    from ..export.pipeline import build_scorer_bundle
    from ..export.repository import publish_version
    from ..export.scorer_model import scorer_model_files, scorer_triton_spec

    settings = recipe.publish
    bundle = build_scorer_bundle(settings, data.tokenizer, tokenizer_file, source)
    spec = scorer_triton_spec(
        name=settings.model_name,
        max_batch_size=settings.max_batch_size,
        length_buckets=tuple(sorted(settings.length_buckets)),
        max_queue_delay_us=settings.max_queue_delay_us,
        max_queue_size=settings.max_queue_size,
        default_timeout_us=settings.default_timeout_us,
        parameters={"source_model": source},
    )
    return publish_version(
        settings.model_repository,
        spec,
        files=scorer_model_files(onnx_path),
        bundle=bundle,
        tokenizer_file=tokenizer_file,
        model_card=card,
        link_files=False,
    )
