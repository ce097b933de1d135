"""The GPU target's last stages: SmoothQuant + Model Optimizer Q/DQ, a TensorRT engine, parity gate, publish.

``run_tensorrt`` turns the re-distilled student into ``model_sm<cc>.plan`` for the GPU it runs on and
copies it, once it passed the parity gate, into ``<work_dir>/engines/<key>/`` where ``key`` hashes
everything upstream of the engine. Running the same recipe and work directory on another GPU type (a build
Job per node pool) adds that GPU's engine there; ``publish_tensorrt`` publishes every engine found, with
``cc_model_filenames`` choosing among them, as one ``tensorrt_plan`` model version.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from ..evaluation.report import StageRow
from ..export.tensorrt.device import cc_key, cc_of_plan, choose_precision, compute_capability, plan_filename
from ..export.tensorrt.profiles import BucketProfile, bucket_profiles
from . import artifacts
from .context import BuildData, stage_config
from .recipe import Recipe
from .resumable import StageRunner
from .stages import evaluate_scores

log = logging.getLogger(__name__)


def recipe_profiles(recipe: Recipe) -> tuple[BucketProfile, ...]:
    publish = recipe.publish
    return bucket_profiles(publish.length_buckets, publish.max_batch_size, recipe.tensorrt.opt_batch_size)


def engines_dir(recipe: Recipe, upstream_config: dict) -> Path:
    """Where the engines of one student (all GPU types) collect."""
    return recipe.resolved_work_dir() / "engines" / artifacts.config_hash(upstream_config)


def _timing_cache(recipe: Recipe, cc, trt_version: str) -> Path:
    root = recipe.tensorrt.timing_cache or recipe.resolved_work_dir() / "timing_cache"
    return Path(root) / f"sm{cc[0]}{cc[1]}_trt{trt_version}.cache"


def run_tensorrt(
    recipe: Recipe, data: BuildData, teacher_dir: Path, student_dir: Path, out: Path, engines: Path
) -> list[StageRow]:
    """Quantize, build and gate the engine for this GPU; returns its quality row."""
    from ..compression.smoothquant import smooth_model
    from ..export.tensorrt.engine import EngineBuildConfig, build_engine, import_tensorrt
    from ..export.tensorrt.modelopt_qdq import qdq_summary, quantize_qdq
    from ..export.tensorrt.parity import engine_parity, onnx_reference_scores, require_parity
    from ..export.tensorrt.runtime import EngineScorer
    from .int8_stage import export_graph

    settings = recipe.tensorrt
    buckets = recipe.publish.length_buckets
    profiles = recipe_profiles(recipe)
    trt = import_tensorrt()  # fail before the long steps
    cc = compute_capability()
    precision = choose_precision(settings.precision, cc)
    log.info("GPU compute capability %s, TensorRT %s: %s engine", cc_key(cc), trt.__version__, precision)

    student_lm = artifacts.load_causal_lm(student_dir / "model")
    calibration = data.calibration(settings.calibration_examples)
    smoothing = {}
    if precision == "int8" and settings.smoothquant_alpha > 0:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        smoothing = smooth_model(student_lm.to(device), calibration, settings.smoothquant_alpha)
        student_lm.cpu()
    fp32 = export_graph(student_lm, data, recipe, out / "fp32" / "model.onnx")
    qdq = quantize_qdq(
        fp32,
        out / f"qdq_{precision}" / "model.onnx",
        calibration,
        buckets,
        precision,
        calibration_method=settings.calibration_method,
        high_precision_dtype=settings.high_precision_dtype,
        provider=settings.onnx_execution_provider,
        batch_size=settings.calibration_batch_size,
    )
    plan = out / "plans" / plan_filename(cc)
    build = EngineBuildConfig(
        settings.workspace_gib, settings.optimization_level, _timing_cache(recipe, cc, trt.__version__)
    )
    info = build_engine(qdq, plan, profiles, build, precision, cc_key(cc))

    test = data.sequences["test"]
    scores = EngineScorer(plan, profiles).score(test, buckets)
    held = min(settings.parity_prompts, len(test))
    reference = onnx_reference_scores(fp32, test[:held], buckets, settings.onnx_execution_provider)
    report = engine_parity(reference, scores[:held], settings.parity, groups=data.member_ids["test"][:held])
    summary = {
        "engine": info.as_dict(),
        "qdq": qdq_summary(qdq),
        "smoothquant_activation_spread": smoothing,
        "parity": report.as_dict(),
    }
    (out / "tensorrt.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    log.info("engine parity: %s", report.as_dict())
    require_parity(report, f"the {precision} engine {plan.name}")

    engines.mkdir(parents=True, exist_ok=True)
    # the plan last, each file under a temp name first: a half-copied engine is never published
    for produced in sorted(plan.parent.iterdir(), key=lambda p: p == plan):
        tmp = engines / f".{produced.name}.tmp"
        shutil.copy2(produced, tmp)
        os.replace(tmp, engines / produced.name)
    row = evaluate_scores(
        f"TensorRT {precision} (sm{cc[0]}{cc[1]})",
        scores,
        data,
        artifacts.load_array(teacher_dir, "logits_test"),
    )
    row.parameters, row.embedding_parameters = artifacts.parameter_counts(student_lm)
    row.file_mb = info.plan_bytes / 1e6
    return [row]


def publish_tensorrt(
    recipe: Recipe, data: BuildData, engines: Path, tokenizer_file: Path, card: str, source: str
):
    """Publish every engine in ``engines`` as one ``tensorrt_plan`` version (atomic), with bundle and card."""
    from ..export.pipeline import build_scorer_bundle
    from ..export.repository import publish_version
    from ..export.tensorrt.triton_spec import check_plan_config, tensorrt_scorer_spec, write_warmup_files
    from ..export.triton_config import to_model_config

    settings = recipe.publish
    plans = sorted(engines.glob("model_sm*.plan"))
    if not plans:
        from ..errors import BuildError

        raise BuildError(f"no engines to publish in {engines}")
    profiles = recipe_profiles(recipe)
    spec = tensorrt_scorer_spec(
        name=settings.model_name,
        profiles=profiles,
        cc_model_filenames={cc_key(cc_of_plan(p.name)): p.name for p in plans},
        max_queue_delay_us=settings.max_queue_delay_us,
        max_queue_size=settings.max_queue_size,
        default_timeout_us=settings.default_timeout_us,
        instance_count=recipe.tensorrt.instance_count,
        warmup_max_batch=recipe.tensorrt.warmup_max_batch,
        parameters={"source_model": source},
    )
    files = {p.name: p for p in plans}
    check_plan_config(to_model_config(spec), profiles, list(files))
    bundle = build_scorer_bundle(settings, data.tokenizer, tokenizer_file, source)
    # Triton reads warmup data from <model>/warmup/, outside the version publish_version writes: put it
    # there first (same bytes for every version of these buckets), so the new config finds it.
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
    """Run the stage ``tensorrt_sm<cc>`` for this GPU (resumable per GPU type); return (rows, publisher)."""
    cc = compute_capability()
    work = recipe.resolved_work_dir()
    upstream_config = stage_config(recipe, "tensorrt")
    engines = engines_dir(recipe, upstream_config)
    config = {**upstream_config, "compute_capability": cc_key(cc)}
    rows = stages.run(
        f"tensorrt_sm{cc[0]}{cc[1]}",
        config,
        lambda out: run_tensorrt(recipe, data, work / "teacher", work / "redistill", out, engines),
    )

    def publisher(card: str):
        source = f"{loaded.name} (student)"
        return publish_tensorrt(recipe, data, engines, loaded.tokenizer_file, card, source)

    return rows, publisher
