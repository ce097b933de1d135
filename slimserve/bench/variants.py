"""Model variants of a benchmark and the Triton repositories that serve them.

A variant is one scoring graph (teacher FP32, student FP32, student INT8), optionally with the Hugging
Face model it came from (for the PyTorch baseline). A batching config is how Triton serves it: dynamic
batching off (max batch 1) or on with a queue delay. Each (variant, batching) pair is published into its
own repository with the same generator and publisher as the build (``scorer_triton_spec`` and
``publish_version``), so no config is typed by hand; the ONNX file is hard-linked, not copied.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from ..buildstage.artifacts import SPEED_STAGE, TEACHER_GRAPH
from ..bundle import SCORING_SINGLE, TOKENIZER_FILE, load_bundle
from ..prompts import SCORING_TEMPLATE_VERSION


@dataclass(frozen=True)
class Variant:
    """A scoring graph to compare, and where its PyTorch model comes from (None: no PyTorch baseline)."""

    name: str
    onnx: Path
    torch_source: str | None = None  # "tiny", "default" or a saved causal-LM directory
    stage: str | None = None  # its row in the build report (quality figures), when known


@dataclass(frozen=True)
class Batching:
    """How Triton batches requests for a variant."""

    name: str
    max_batch_size: int
    max_queue_delay_us: int = 0

    @property
    def dynamic(self) -> bool:
        return self.max_batch_size > 1

    def describe(self) -> str:
        if not self.dynamic:
            return "dynamic batching off (max batch 1)"
        return f"dynamic batching, max batch {self.max_batch_size}, queue delay {self.max_queue_delay_us} us"


def batching_configs(delays_us: tuple[int, ...] = (0, 300), max_batch_size: int = 64) -> list[Batching]:
    """Batching off, then on with each queue delay."""
    return [Batching("off", 1)] + [Batching(f"on-{d}us", max_batch_size, d) for d in delays_us]


def _teacher_graph(work: Path) -> Path:
    """The fine-tuned teacher's FP32 graph of a build (in ``teacher_speed/`` for builds made before the
    stage ``speed`` replaced that stage)."""
    path = work / SPEED_STAGE / TEACHER_GRAPH
    older = work / "teacher_speed" / TEACHER_GRAPH
    return older if not path.is_file() and older.is_file() else path


def _single_sequence(work: Path, chosen: Path) -> tuple[Path, Path]:
    """(FP32, INT8) single-sequence graphs of a build that published ``chosen``. Beside a multi-item
    graph they are report-only, in ``int8_single/`` (``int8/`` in builds before that stage), the INT8 one
    made the same way (``int8/multi_item_int8_<method>/`` -> ``int8_single/int8_<method>/``)."""
    prefix = "multi_item_"
    if not chosen.parent.name.startswith(prefix):
        return chosen.parent.parent / "fp32" / "model.onnx", chosen
    single = work / "int8_single"
    folder = single if single.is_dir() else chosen.parent.parent
    return folder / "fp32" / "model.onnx", folder / chosen.parent.name[len(prefix) :] / chosen.name


def variants_from_build(work_dir: Path) -> list[Variant]:
    """Teacher FP32, student FP32 and the chosen INT8 student of a ``slimserve build`` work directory, all
    single-sequence graphs (``bench layouts`` puts the multi-item one beside them)."""
    work = Path(work_dir)
    chosen_file = work / "int8" / "chosen.json"
    if not chosen_file.is_file():
        raise FileNotFoundError(f"{work}: no int8/chosen.json; is this a finished build's work directory?")
    student_fp32, student_int8 = _single_sequence(work, Path(json.loads(chosen_file.read_text())["path"]))
    found = [
        Variant(
            "teacher FP32",
            _teacher_graph(work),
            str(work / "teacher" / "model"),
            "teacher fine-tuned",
        ),
        Variant(
            "student FP32",
            student_fp32,
            str(work / "redistill" / "model"),
            "pruned + re-distilled",
        ),
        Variant("student INT8", student_int8, None, "INT8"),
    ]
    missing = [str(v.onnx) for v in found if not v.onnx.is_file()]
    if missing:
        raise FileNotFoundError(f"{work}: missing stage outputs {missing}")
    return found


def template_note(bundle_dir: Path) -> str | None:
    """A remark when the bundle's prompt template is not the one this slimserve renders, else None."""
    built = load_bundle(bundle_dir).prompt_template_version
    if built == SCORING_TEMPLATE_VERSION:
        return None
    return (
        f"The models were built with prompt template {built}; this slimserve renders {SCORING_TEMPLATE_VERSION}, "
        f"so every engine here scores {SCORING_TEMPLATE_VERSION} prompts and the served variants' bundles were "
        f"re-stamped {SCORING_TEMPLATE_VERSION}. Speed figures only; quality figures come from the build report."
    )


def write_variant_repository(
    repository: Path, bundle_dir: Path, variant: Variant, batching: Batching, model_name: str = "scorer"
) -> Path:
    """Publish ``variant`` with ``batching`` as ``model_name`` into a new ``repository``; return its bundle dir."""
    from ..export.repository import publish_version
    from ..export.scorer_model import scorer_model_files, scorer_triton_spec
    from ..export.triton_config import check_against_onnx

    # The service renders today's template; a model built with an older one is served with it here (the
    # speed of the graph does not depend on the words). ``template_note`` says so for the report.
    # The variants are single-sequence graphs: a multi-item bundle is served single-sequence here
    # (``slimserve bench layouts`` compares the two layouts).
    bundle = dataclasses.replace(
        load_bundle(bundle_dir),
        max_batch_size=batching.max_batch_size,
        prompt_template_version=SCORING_TEMPLATE_VERSION,
        scoring_mode=SCORING_SINGLE,
    )
    spec = scorer_triton_spec(
        name=model_name,
        max_batch_size=batching.max_batch_size,
        length_buckets=tuple(sorted(bundle.length_buckets)),
        max_queue_delay_us=batching.max_queue_delay_us,
        parameters={"source_model": variant.name, "bench_batching": batching.name},
    )
    if not batching.dynamic:
        spec = dataclasses.replace(spec, dynamic_batching=None)
    check_against_onnx(spec, variant.onnx, extra_outputs=(bundle.tensors.compute_ms,))
    card = f"# {variant.name} ({batching.describe()})\n\nBenchmark variant written by `slimserve bench`.\n"
    published = publish_version(
        repository,
        spec,
        files=scorer_model_files(variant.onnx),
        bundle=bundle,
        tokenizer_file=Path(bundle_dir) / TOKENIZER_FILE,
        model_card=card,
        link_files=True,
    )
    return published.path / "bundle"
