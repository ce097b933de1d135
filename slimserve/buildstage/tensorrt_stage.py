"""The GPU target's last stages: SmoothQuant + Model Optimizer Q/DQ, a TensorRT engine, parity gate, publish.

``run_tensorrt`` turns the re-distilled student into ``model_sm<cc>.plan`` for the GPU it runs on and
copies it, once it passed the parity gate, into ``<work_dir>/engines/<key>/`` where ``key`` hashes
everything upstream of the engine. Running the same recipe and work directory on another GPU type (a build
Job per node pool) adds that GPU's engine there; ``publish_tensorrt`` publishes every engine found, with
``cc_model_filenames`` choosing among them, as one ``tensorrt_plan`` model version.

The served layout follows ``publish.scoring_mode``, as on the CPU target: ``single`` builds the
single-sequence engine (profiles per length bucket, Triton batching); ``multi_item`` builds the multi-item
engine (profiles per item-length bucket, one member per request), calibrated on member requests and gated
per member against the multi-item ONNX graph, also by ``gates.multi_item_spearman`` / ``multi_item_auc_gap``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np

from ..evaluation.report import StageRow
from ..export.tensorrt.device import cc_key, cc_of_plan, choose_precision, compute_capability, plan_filename
from ..export.tensorrt.profiles import Profile, bucket_profiles, served_multi_item_profiles
from . import artifacts
from .context import BuildData, stage_config
from .recipe import Recipe
from .resumable import StageRunner
from .stages import evaluate_scores

log = logging.getLogger(__name__)

MULTI_ITEM = "multi_item"


def recipe_profiles(recipe: Recipe) -> tuple[Profile, ...]:
    """The engine's optimization profiles for the recipe's served layout."""
    publish = recipe.publish
    if publish.multi_item:
        return served_multi_item_profiles(
            publish.item_length_buckets,
            publish.prefix_max_tokens,
            publish.item_max_tokens,
            publish.max_items_per_request,
        )
    return bucket_profiles(publish.length_buckets, publish.max_batch_size, recipe.tensorrt.opt_batch_size)


def engine_config(recipe: Recipe) -> dict:
    """What an engine depends on: the stage ``tensorrt``'s settings and, for the multi-item engine, the
    layout of its requests (a single-sequence engine keeps the key it always had)."""
    config = stage_config(recipe, "tensorrt")
    if not recipe.publish.multi_item:
        return config
    publish = recipe.publish
    layout = {
        "prefix_max_tokens": publish.prefix_max_tokens,
        "item_max_tokens": publish.item_max_tokens,
        "item_length_buckets": sorted(publish.item_length_buckets),
        "max_items_per_request": publish.max_items_per_request,
    }
    return {**config, MULTI_ITEM: layout}


def engine_stage(recipe: Recipe, cc) -> tuple[str, dict]:
    """(stage id, its config) of this GPU's engine stage: ``tensorrt_sm<cc>`` or ``tensorrt_multi_item_sm<cc>``
    (the multi-item one also re-runs when its gates change)."""
    config = {**engine_config(recipe), "compute_capability": cc_key(cc)}
    if not recipe.publish.multi_item:
        return f"tensorrt_sm{cc[0]}{cc[1]}", config
    gates = {"spearman": recipe.gates.multi_item_spearman, "auc_gap": recipe.gates.multi_item_auc_gap}
    return f"tensorrt_{MULTI_ITEM}_sm{cc[0]}{cc[1]}", {**config, "multi_item_gates": gates}


def engines_dir(recipe: Recipe, upstream_config: dict) -> Path:
    """Where the engines of one student (all GPU types) collect."""
    return recipe.resolved_work_dir() / "engines" / artifacts.config_hash(upstream_config)


def _timing_cache(recipe: Recipe, cc, trt_version: str) -> Path:
    root = recipe.tensorrt.timing_cache or recipe.resolved_work_dir() / "timing_cache"
    return Path(root) / f"sm{cc[0]}{cc[1]}_trt{trt_version}.cache"


def calibration_feeds(recipe: Recipe, data: BuildData) -> list[dict[str, np.ndarray]]:
    """Model Optimizer's calibration feeds, laid out as the service sends them: the first
    ``tensorrt.calibration_examples`` training prompts as bucket-padded batches, or (multi-item) as
    member requests (``prefix_ids``, ``prefix_mask``, ``item_ids``, ``item_mask``; one member each)."""
    from ..export.tensorrt.modelopt_qdq import bucket_feeds
    from .int8_stage import multi_item_calibration

    settings = recipe.tensorrt
    if recipe.publish.multi_item:
        return multi_item_calibration(data, settings.calibration_examples, recipe.publish)
    calibration = data.calibration(settings.calibration_examples)
    return bucket_feeds(calibration, recipe.publish.length_buckets, settings.calibration_batch_size)


def _smooth(student_lm, data: BuildData, recipe: Recipe, precision: str) -> dict:
    """SmoothQuant before INT8 Q/DQ (in place); the activation spreads it measured."""
    from ..compression.smoothquant import smooth_model

    settings = recipe.tensorrt
    if precision != "int8" or settings.smoothquant_alpha <= 0:
        return {}
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    calibration = data.calibration(settings.calibration_examples)
    smoothing = smooth_model(student_lm.to(device), calibration, settings.smoothquant_alpha)
    student_lm.cpu()
    return smoothing


def _qdq_graph(recipe: Recipe, data: BuildData, student_lm, out: Path, precision: str) -> tuple[Path, Path]:
    """(FP32 ONNX, its Model Optimizer Q/DQ graph) of the served layout."""
    from ..export.tensorrt.modelopt_qdq import quantize_qdq_feeds
    from .int8_stage import export_graph, export_multi_item_graph

    prefix = f"{MULTI_ITEM}_" if recipe.publish.multi_item else ""
    export = export_multi_item_graph if recipe.publish.multi_item else export_graph
    fp32 = export(student_lm, data, recipe, out / f"{prefix}fp32" / "model.onnx")
    settings = recipe.tensorrt
    qdq = quantize_qdq_feeds(
        fp32,
        out / f"{prefix}qdq_{precision}" / "model.onnx",
        calibration_feeds(recipe, data),
        precision,
        calibration_method=settings.calibration_method,
        high_precision_dtype=settings.high_precision_dtype,
        provider=settings.onnx_execution_provider,
    )
    return fp32, qdq


def held_groups(groups: list, limit: int) -> list:
    """The first member groups with at most ``limit`` examples together (at least the first group)."""
    held, examples = [], 0
    for group in groups:
        if held and examples + len(group) > limit:
            break
        held.append(group)
        examples += len(group)
    return held


def multi_item_parity(reference, candidate, labels, members, recipe: Recipe):
    """The multi-item engine's gate on held-out examples: the engine parity measures per member
    (``tensorrt.parity``) and the CPU build's multi-item gates. Returns (report, gate measures)."""
    from ..evaluation.multi_item_gate import multi_item_gate
    from ..export.tensorrt.parity import engine_parity

    report = engine_parity(reference, candidate, recipe.tensorrt.parity, groups=list(members))
    gates = recipe.gates
    measures, failures = multi_item_gate(
        reference, candidate, labels, gates.multi_item_spearman, gates.multi_item_auc_gap
    )
    report.failures += failures
    return report, measures


def _gate_multi_item(recipe: Recipe, data: BuildData, run, fp32: Path):
    """Engine scores of every test example (member requests as served) and the gate on the held-out
    members' examples against the FP32 multi-item ONNX graph."""
    from ..export.tensorrt.runtime import multi_item_scores
    from .int8_stage import onnx_multi_item_margin

    layout, count = recipe.publish, len(data.sequences["test"])
    scores = multi_item_scores(
        run, data.groups["test"], count, layout.item_length_buckets, layout.max_items_per_request
    )
    held = held_groups(data.groups["test"], recipe.tensorrt.parity_prompts)
    index = np.concatenate([np.asarray(g.indices) for g in held])
    reference = onnx_multi_item_margin(fp32, held, count, layout)[index]
    members = [data.member_ids["test"][i] for i in index]
    report, measures = multi_item_parity(
        reference, scores[index], data.labels["test"][index], members, recipe
    )
    return scores, report, {"multi_item_gate": measures}


def _gate_single(recipe: Recipe, data: BuildData, scorer, fp32: Path):
    from ..export.tensorrt.parity import engine_parity, onnx_reference_scores

    settings, buckets = recipe.tensorrt, recipe.publish.length_buckets
    test = data.sequences["test"]
    scores = scorer.score(test, buckets)
    held = min(settings.parity_prompts, len(test))
    reference = onnx_reference_scores(fp32, test[:held], buckets, settings.onnx_execution_provider)
    report = engine_parity(reference, scores[:held], settings.parity, groups=data.member_ids["test"][:held])
    return scores, report, {}


def _keep(plan: Path, engines: Path) -> None:
    """Copy the plan and its files into ``engines``: the plan last, each file under a temp name first,
    so a half-copied engine is never published."""
    engines.mkdir(parents=True, exist_ok=True)
    for produced in sorted(plan.parent.iterdir(), key=lambda p: p == plan):
        tmp = engines / f".{produced.name}.tmp"
        shutil.copy2(produced, tmp)
        os.replace(tmp, engines / produced.name)


def run_tensorrt(
    recipe: Recipe, data: BuildData, teacher_dir: Path, student_dir: Path, out: Path, engines: Path
) -> list[StageRow]:
    """Quantize, build and gate the engine of the served layout for this GPU; returns its quality row."""
    from ..export.tensorrt.engine import EngineBuildConfig, build_engine, import_tensorrt
    from ..export.tensorrt.modelopt_qdq import qdq_summary
    from ..export.tensorrt.parity import require_parity
    from ..export.tensorrt.runtime import EngineScorer

    settings = recipe.tensorrt
    profiles = recipe_profiles(recipe)
    trt = import_tensorrt()  # fail before the long steps
    cc = compute_capability()
    precision = choose_precision(settings.precision, cc)
    layout = recipe.publish.scoring_mode
    log.info(
        "GPU compute capability %s, TensorRT %s: %s %s engine", cc_key(cc), trt.__version__, precision, layout
    )

    student_lm = artifacts.load_causal_lm(student_dir / "model")
    smoothing = _smooth(student_lm, data, recipe, precision)
    fp32, qdq = _qdq_graph(recipe, data, student_lm, out, precision)
    plan = out / "plans" / plan_filename(cc)
    build = EngineBuildConfig(
        settings.workspace_gib, settings.optimization_level, _timing_cache(recipe, cc, trt.__version__)
    )
    info = build_engine(qdq, plan, profiles, build, precision, cc_key(cc))
    scorer = EngineScorer(plan, profiles)
    if recipe.publish.multi_item:
        scores, report, measures = _gate_multi_item(recipe, data, scorer.run, fp32)
    else:
        scores, report, measures = _gate_single(recipe, data, scorer, fp32)
    summary = {
        "layout": layout,
        "engine": info.as_dict(),
        "qdq": {**qdq_summary(qdq), "high_precision_dtype": recipe.tensorrt.high_precision_dtype},
        "smoothquant_activation_spread": smoothing,
        "parity": report.as_dict(),
        **measures,
    }
    (out / "tensorrt.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    log.info("engine parity: %s", report.as_dict())
    require_parity(report, f"the {precision} {layout} engine {plan.name}")
    _keep(plan, engines)
    what = " multi-item" if recipe.publish.multi_item else ""
    row = evaluate_scores(
        f"TensorRT {precision}{what} (sm{cc[0]}{cc[1]})",
        scores,
        data,
        artifacts.load_array(teacher_dir, "logits_test"),
    )
    row.parameters, row.embedding_parameters = artifacts.parameter_counts(student_lm)
    row.file_mb = info.plan_bytes / 1e6
    return [row]


def _plan_spec(recipe: Recipe, profiles, cc_files: dict[str, str], source: str):
    from ..export.tensorrt.triton_spec import tensorrt_multi_item_scorer_spec, tensorrt_scorer_spec

    settings, name = recipe.publish, recipe.publish.model_name
    common = {"instance_count": recipe.tensorrt.instance_count, "parameters": {"source_model": source}}
    if recipe.publish.multi_item:
        return tensorrt_multi_item_scorer_spec(name, profiles, cc_files, **common)
    return tensorrt_scorer_spec(
        name=name,
        profiles=profiles,
        cc_model_filenames=cc_files,
        max_queue_delay_us=settings.max_queue_delay_us,
        max_queue_size=settings.max_queue_size,
        default_timeout_us=settings.default_timeout_us,
        warmup_max_batch=recipe.tensorrt.warmup_max_batch,
        **common,
    )


def tensorrt_bundle(recipe: Recipe, tokenizer, tokenizer_file: Path, source: str):
    """The serving bundle of the TensorRT scorer: the CPU target's, except that a multi-item engine takes
    one member per request (its ``max_batch_size`` is 1; Triton's is 0, no batch axis)."""
    from ..export.pipeline import build_scorer_bundle

    bundle = build_scorer_bundle(recipe.publish, tokenizer, tokenizer_file, source)
    if recipe.publish.multi_item:
        bundle = dataclasses.replace(bundle, max_batch_size=recipe_profiles(recipe)[0].max_members)
    return bundle


def publish_tensorrt(
    recipe: Recipe, data: BuildData, engines: Path, tokenizer_file: Path, card: str, source: str
):
    """Publish every engine in ``engines`` as one ``tensorrt_plan`` version (atomic), with bundle and card."""
    from ..export.repository import publish_version
    from ..export.tensorrt.triton_spec import check_plan_config, write_warmup_files
    from ..export.triton_config import to_model_config

    settings = recipe.publish
    plans = sorted(engines.glob("model_sm*.plan"))
    if not plans:
        from ..errors import BuildError

        raise BuildError(f"no engines to publish in {engines}")
    profiles = recipe_profiles(recipe)
    spec = _plan_spec(recipe, profiles, {cc_key(cc_of_plan(p.name)): p.name for p in plans}, source)
    files = {p.name: p for p in plans}
    check_plan_config(to_model_config(spec), profiles, list(files))
    bundle = tensorrt_bundle(recipe, data.tokenizer, tokenizer_file, source)
    if not recipe.publish.multi_item:
        # Triton reads warmup data from <model>/warmup/, outside the version publish_version writes: put
        # it there first (same bytes for every version of these buckets), so the new config finds it.
        # (The multi-item warmups are zero data: no files.)
        write_warmup_files(Path(settings.model_repository) / settings.model_name, profiles)
    return publish_version(
        settings.model_repository,
        spec,
        files=files,
        bundle=bundle,
        tokenizer_file=tokenizer_file,
        model_card=card,
        weight_files=tuple(p.name for p in plans),
        link_files=False,
    )


def preflight(recipe: Recipe) -> None:
    """Before hours of training: TensorRT, Model Optimizer and a GPU are here, and the precision fits it."""
    from ..export.tensorrt.engine import import_tensorrt
    from ..export.tensorrt.modelopt_qdq import modelopt_quantize_fn

    import_tensorrt()
    modelopt_quantize_fn()
    choose_precision(recipe.tensorrt.precision, compute_capability())


def tensorrt_tail(recipe: Recipe, data: BuildData, stages: StageRunner, loaded):
    """Run this GPU's engine stage (``engine_stage``; resumable per GPU type); return (rows, publisher)."""
    cc = compute_capability()
    work = recipe.resolved_work_dir()
    engines = engines_dir(recipe, engine_config(recipe))
    stage, config = engine_stage(recipe, cc)
    rows = stages.run(
        stage,
        config,
        lambda out: run_tensorrt(recipe, data, work / "teacher", work / "redistill", out, engines),
    )

    def publisher(card: str):
        source = f"{loaded.name} (student)"
        return publish_tensorrt(recipe, data, engines, loaded.tokenizer_file, card, source)

    return rows, publisher
