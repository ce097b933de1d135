"""The INT8 stage (export the student, quantize, evaluate in ONNX Runtime), the report-only stages
``int8_single`` (the single-sequence INT8 graph beside a published multi-item one) and ``speed``, and
publishing."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import numpy as np

from ..evaluation.report import StageRow
from ..models.scorer_graph import ScorerGraph
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
    files, _ = export_checked_onnx(
        graph,
        path,
        data.sequences["test"][:32],
        recipe.publish.length_buckets,
        exporter=recipe.publish.onnx_exporter,
    )
    return files[0]


def export_multi_item_graph(model_lm, data: BuildData, recipe: Recipe, path: Path) -> Path:
    """FP32 ONNX of a causal LM's multi-item scoring graph, checked against the single-sequence PyTorch
    graph on the first test members (at most 64 examples), requests laid out as the service sends them."""
    from ..export.pipeline import export_checked_multi_item_onnx

    graph = ScorerGraph(model_lm, *label_ids(data)).eval()
    members, examples = [], 0
    for group in data.groups["test"]:
        if examples >= 64:
            break
        members.append(group)
        examples += len(group)
    path.parent.mkdir(parents=True, exist_ok=True)
    files, _ = export_checked_multi_item_onnx(
        graph, path, members, recipe.publish, exporter=recipe.publish.onnx_exporter
    )
    return files[0]


def onnx_multi_item_margin(onnx_path: Path, groups: list, count: int, layout) -> np.ndarray:
    """Scores of a multi-item ONNX scorer for ``count`` examples given as member ``groups`` (each with
    ``prefix``, ``items`` and ``indices``), requests laid out as the service sends them."""
    from ..evaluation.throughput import scorer_session
    from ..export.parity import multi_item_onnx_scores
    from ..scoring_tokens import multi_item_requests

    session, _ = scorer_session(onnx_path)
    out = np.full(count, np.nan, dtype=np.float64)

    def requests_of(group):
        return multi_item_requests(group, layout.item_length_buckets, layout.max_items_per_request)

    for group, scores in zip(groups, multi_item_onnx_scores(session, groups, requests_of), strict=True):
        out[group.indices] = scores
    return out


def multi_item_calibration(data: BuildData, count: int, layout) -> list[dict[str, np.ndarray]]:
    """Static INT8 calibration feeds of the multi-item graph: the first ``count`` training examples,
    one member per feed."""
    from ..scoring_tokens import multi_item_requests

    feeds = []
    for group in data.calibration_groups(count):
        for request in multi_item_requests(group, layout.item_length_buckets, layout.max_items_per_request):
            feeds.append(request.feed())
    return feeds


def onnx_logits_margin(onnx_path: Path, sequences: list[list[int]], buckets) -> np.ndarray:
    """Scores (margins) of an ONNX scorer on sequences, padded to buckets as the service does."""
    from ..evaluation.throughput import scorer_session
    from ..models.batching import padded_batches

    session, _ = scorer_session(onnx_path)
    out = np.zeros(len(sequences), dtype=np.float64)
    for chunk, ids, mask in padded_batches(sequences, buckets, batch_size=32):
        out[chunk] = session.run(None, {"input_ids": ids, "attention_mask": mask})[0].ravel()
    return out


GRAPHS_FILE = "graphs.json"  # in int8 and int8_single: row stage -> [layout, ONNX path], for the speed stage
METHOD_FILE = "method.json"  # in int8: the INT8 method chosen (int8_single applies it too)


def _speed(row: StageRow, onnx_path: Path, data: BuildData, recipe: Recipe, layout: str = "single") -> None:
    """Fill ``row``'s items/s and one-item latency: ONNX Runtime in process, laid out as served."""
    from ..evaluation.throughput import measure_multi_item_speed, measure_onnx_speed

    if layout == "multi_item":
        item_buckets = recipe.publish.item_length_buckets
        speed = measure_multi_item_speed(
            onnx_path, data.groups["test"][:64], item_buckets, seconds=recipe.speed_seconds
        )
    else:
        buckets = recipe.publish.length_buckets
        speed = measure_onnx_speed(
            onnx_path, data.sequences["test"][:256], buckets, seconds=recipe.speed_seconds
        )
    row.items_per_s_batch32 = speed.items_per_s_batch32
    row.single_item_ms = speed.single_item_latency_ms_p50


def _quantize(method: str, fp32: Path, target: Path, calibration, settings) -> None:
    from ..compression.quantize import (
        quantize_scorer_dynamic,
        quantize_scorer_static,
        quantize_scorer_weight_only,
    )

    target.parent.mkdir(parents=True, exist_ok=True)
    if method == "static":
        quantize_scorer_static(fp32, target, calibration(), per_channel=settings.per_channel)
    elif method == "weight-only":
        quantize_scorer_weight_only(fp32, target, block_size=settings.block_size)
    else:
        quantize_scorer_dynamic(fp32, target, per_channel=settings.per_channel)


def _quantized(
    recipe: Recipe, fp32: Path, stage: str, calibration, score, data: BuildData, reference
) -> tuple[StageRow, Path, str, np.ndarray]:
    """Quantize ``fp32`` with each method of ``quantize.method`` in turn (``auto``: static, weight-only,
    dynamic) until one keeps ``gates.int8``: (row, graph, method, test scores) of the best. ``score``
    gives a graph's test scores; ``reference`` = (the teacher's test logits, its test AUC, the student's
    parameter counts). With ``quantize.method`` a single method, that one."""
    from ..compression.quantize import model_bytes

    teacher_test, teacher_auc, parameters = reference
    settings = recipe.quantize
    methods = [settings.method] if settings.method != "auto" else ["static", "weight-only", "dynamic"]
    candidates = []
    for method in methods:
        # beside the FP32 graph: fp32/ -> int8_<method>/, multi_item_fp32/ -> multi_item_int8_<method>/
        target = fp32.parent.parent / f"{fp32.parent.name.removesuffix('fp32')}int8_{method}" / "model.onnx"
        _quantize(method, fp32, target, calibration, settings)
        margin = score(target)
        row = evaluate_scores(f"{stage} ({method})", margin, data, teacher_test)
        row.parameters, row.embedding_parameters = parameters
        row.retention = row.test_auc / teacher_auc
        candidates.append((row, target, method, margin))
        if row.retention >= recipe.gates.int8:
            break
        log.warning("%s: retention %.4f below the gate %.4f", row.stage, row.retention, recipe.gates.int8)
    row, chosen, method, margin = max(candidates, key=lambda c: c[0].test_auc)
    row.file_mb = model_bytes(chosen) / 1e6
    return row, chosen, method, margin


def _single_int8(recipe, data, student_lm, out: Path, reference, method: str | None = None):
    """The single-sequence INT8 graph (export, quantize with ``method`` or the recipe's, test scores):
    (row, graph, method, scores, the FP32 graph)."""
    from ..compression.quantize import calibration_batches

    if method is not None:
        recipe = recipe.model_copy(update={"quantize": recipe.quantize.model_copy(update={"method": method})})
    buckets = recipe.publish.length_buckets
    fp32 = export_graph(student_lm, data, recipe, out / "fp32" / "model.onnx")
    row, chosen, method, margin = _quantized(
        recipe,
        fp32,
        "INT8",
        lambda: calibration_batches(data.calibration(recipe.data.calibration_examples), buckets),
        lambda graph: onnx_logits_margin(graph, data.sequences["test"], buckets),
        data,
        reference,
    )
    return row, chosen, method, margin, fp32


def _single_graphs(fp32: Path, row: StageRow, chosen: Path) -> dict[str, list[str]]:
    """``GRAPHS_FILE``'s entries of the single-sequence graphs: the FP32 student's and the INT8 one's."""
    return {
        "pruned + re-distilled": ["single", str(fp32.resolve())],
        row.stage: ["single", str(chosen.resolve())],
    }


def _reference(teacher_dir: Path, rows: list[StageRow], student_lm) -> tuple:
    """(the teacher's test logits, the fine-tuned teacher's test AUC, the student's parameter counts)."""
    teacher_auc = next(r for r in rows if r.stage == "teacher fine-tuned").test_auc
    return (
        artifacts.load_array(teacher_dir, "logits_test"),
        teacher_auc,
        artifacts.parameter_counts(student_lm),
    )


def run_int8(
    recipe: Recipe, data: BuildData, teacher_dir: Path, student_dir: Path, out: Path, rows: list[StageRow]
) -> tuple[list[StageRow], Path]:
    """Quantize the final student; returns (its INT8 row, the graph to publish). With
    ``publish.scoring_mode: multi_item`` that is the multi-item graph, gated against the re-distilled
    student's own test scores (``_check_multi_item``); the single-sequence INT8 graph beside it is
    report-only (``run_int8_single``, after publishing). Speeds are measured later, by ``run_speeds``:
    the stage records its graphs in ``GRAPHS_FILE``."""
    student_lm = artifacts.load_causal_lm(student_dir / "model")
    reference = _reference(teacher_dir, rows, student_lm)
    if recipe.publish.multi_item:
        row, chosen, method, margin = _multi_item_int8(recipe, data, student_lm, out, reference)
        _check_multi_item(recipe, data, row, margin, student_dir)
        graphs = {row.stage: ["multi_item", str(chosen.resolve())]}
        artifacts.save_arrays(out, multi_item_test=margin)
    else:
        row, chosen, method, _, fp32 = _single_int8(recipe, data, student_lm, out, reference)
        graphs = _single_graphs(fp32, row, chosen)
    (out / GRAPHS_FILE).write_text(json.dumps(graphs, indent=2) + "\n")
    (out / METHOD_FILE).write_text(json.dumps({"method": method}) + "\n")
    return [row], chosen


def run_int8_single(
    recipe: Recipe, data: BuildData, teacher_dir: Path, student_dir: Path, int8_dir: Path, rows, out: Path
) -> list[StageRow]:
    """Stage ``int8_single`` (multi-item recipes; only the stage table reads it, so it runs after
    publishing): the single-sequence INT8 graph made with the int8 stage's method, its test quality and
    its agreement with the published multi-item graph (Spearman, test AUC gap; a warning beyond
    ``gates.multi_item_spearman`` / ``multi_item_auc_gap``)."""
    from ..evaluation.multi_item_gate import multi_item_gate

    student_lm = artifacts.load_causal_lm(student_dir / "model")
    method = json.loads((int8_dir / METHOD_FILE).read_text())["method"]
    row, chosen, _, margin, fp32 = _single_int8(
        recipe, data, student_lm, out, _reference(teacher_dir, rows, student_lm), method
    )
    multi = artifacts.load_array(int8_dir, "multi_item_test")
    gates = recipe.gates
    measures, failures = multi_item_gate(
        margin, multi, data.labels["test"], gates.multi_item_spearman, gates.multi_item_auc_gap
    )
    row.notes = {
        "spearman_vs_multi_item_int8": measures["spearman"],
        "auc_gap_vs_multi_item_int8": measures["auc_gap"],
    }
    log.info("single-sequence INT8 vs the published multi-item INT8: %s", measures)
    if failures:
        log.warning(
            "the published multi-item INT8 graph against the single-sequence one: %s", "; ".join(failures)
        )
    (out / GRAPHS_FILE).write_text(json.dumps(_single_graphs(fp32, row, chosen), indent=2) + "\n")
    return [row]


def run_speeds(
    recipe: Recipe,
    data: BuildData,
    teacher_dir: Path,
    graph_dirs: list[Path],
    rows: list[StageRow],
    out: Path,
) -> list[StageRow]:
    """The stage ``speed``: copies of the fine-tuned teacher's row (its FP32 graph exported here as
    ``artifacts.TEACHER_GRAPH``) and of the rows of the graphs that the stages in ``graph_dirs`` (int8,
    int8_single) recorded, each with its items/s, one-item latency and file size. Only the stage table
    and ``bench compare`` read them, so ``slimserve up`` runs this after the scorer is published."""
    from ..compression.quantize import model_bytes

    by_stage = {r.stage: r for r in rows}
    teacher_row = by_stage["teacher fine-tuned"]
    path = export_graph(
        artifacts.load_causal_lm(teacher_dir / "model"), data, recipe, out / artifacts.TEACHER_GRAPH
    )
    graphs = {teacher_row.stage: ["single", str(path)]}
    for directory in graph_dirs:
        graphs.update(json.loads((directory / GRAPHS_FILE).read_text()))
    measured = []
    for stage, (layout, onnx_path) in graphs.items():
        row = copy.deepcopy(by_stage[stage])
        _speed(row, Path(onnx_path), data, recipe, layout)
        row.file_mb = model_bytes(Path(onnx_path)) / 1e6
        measured.append(row)
    return measured


def _multi_item_int8(recipe, data, student_lm, out, reference):
    """The multi-item INT8 graph (export checked against the single-sequence PyTorch graph, quantize,
    test scores laid out as the service sends them): (row, graph, method, scores)."""
    layout = recipe.publish
    fp32 = export_multi_item_graph(student_lm, data, recipe, out / "multi_item_fp32" / "model.onnx")
    return _quantized(
        recipe,
        fp32,
        "INT8 multi-item",
        lambda: multi_item_calibration(data, recipe.data.calibration_examples, layout),
        lambda graph: onnx_multi_item_margin(graph, data.groups["test"], len(data.sequences["test"]), layout),
        data,
        reference,
    )


def _check_multi_item(recipe: Recipe, data: BuildData, row: StageRow, margin, student_dir: Path) -> None:
    """Gate the multi-item INT8 graph's test scores against the re-distilled student's own (PyTorch,
    unquantized): Spearman >= ``gates.multi_item_spearman``, test AUC gap <= ``multi_item_auc_gap``;
    its row notes both. ``BuildError`` when one fails: nothing is published."""
    from ..errors import BuildError
    from ..evaluation.multi_item_gate import multi_item_gate
    from .stages import margins

    gates = recipe.gates
    student = margins(artifacts.load_array(student_dir, "logits_test"))
    measures, failures = multi_item_gate(
        student, margin, data.labels["test"], gates.multi_item_spearman, gates.multi_item_auc_gap
    )
    row.notes = {"spearman_vs_student": measures["spearman"], "auc_gap_vs_student": measures["auc_gap"]}
    log.info("multi-item INT8 vs the re-distilled student (PyTorch): %s", measures)
    if failures:
        raise BuildError(
            f"multi-item INT8 graph against the re-distilled student's scores: {'; '.join(failures)} (gates "
            "multi_item_spearman, multi_item_auc_gap); nothing was published"
        )


def publish(recipe: Recipe, data: BuildData, onnx_path: Path, tokenizer_file: Path, card: str, source: str):
    """Publish the INT8 student as the scorer (atomic), with bundle and model card."""
    from ..export.pipeline import build_scorer_bundle, scorer_spec
    from ..export.repository import publish_version
    from ..export.scorer_model import scorer_model_files

    settings = recipe.publish
    bundle = build_scorer_bundle(settings, data.tokenizer, tokenizer_file, source)
    spec = scorer_spec(settings, bundle, {"source_model": source})
    return publish_version(
        settings.model_repository,
        spec,
        files=scorer_model_files(onnx_path),
        bundle=bundle,
        tokenizer_file=tokenizer_file,
        model_card=card,
        link_files=False,
    )
