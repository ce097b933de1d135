"""``slimserve bench generators``: the distilled generator against its teacher on the same serving stack.

Both run the same way, one after the other: the Triton model ``generator`` (same precision, same batching
settings) behind ``slimserve serve-reasoning``, loaded by closed-loop ``Explain`` streams on the same
prompts (by default 1 and 8 concurrent streams). The teacher is exported from its source at the student's
precision and with its serving settings (slots, queue, stream interval, threads) unless a repository
holding it is given. Reported per variant and load:

- decode throughput: tokens streamed per second over all streams (tokens / wall time of the level);
- per-stream decode speed (tokens after the first per second, median) and time to first token;
- the student/teacher throughput ratio per load, and per variant the TTFT of a request joining a busy
  batch against its TTFT on an idle server (p50 at the highest load / p50 at one stream).

Greedy decoding, one ``max_tokens`` for all; a model that ends early streams fewer tokens, which the
per-token figures account for.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..cache import cache_dir
from .grpc_load import LoadPlan, LoadPoint, bench_service, explain_requests

log = logging.getLogger(__name__)

TEACHER = "teacher"
STUDENT = "student"


@dataclass
class GeneratorRun:
    """One served generator's load points (closed loop, one per concurrency)."""

    variant: str
    repository: str
    source_model: str
    precision: str
    points: list[LoadPoint] = field(default_factory=list)

    def at(self, streams: int) -> LoadPoint | None:
        return next((p for p in self.points if p.mode == "closed" and int(p.load) == streams), None)

    def ttft_busy_over_idle(self) -> float | None:
        """TTFT p50 at the highest concurrency over TTFT p50 at one stream (None without both)."""
        idle = self.at(1)
        busy = max((p for p in self.points if p.mode == "closed"), key=lambda p: p.load, default=None)
        if idle is None or busy is None or busy is idle or not idle.ttft or not busy.ttft:
            return None
        return busy.ttft.p50_ms / idle.ttft.p50_ms if idle.ttft.p50_ms > 0 else None

    def as_dict(self) -> dict:
        return {
            "variant": self.variant,
            "repository": self.repository,
            "source_model": self.source_model,
            "precision": self.precision,
            "ttft_busy_over_idle": self.ttft_busy_over_idle(),
            "points": [p.as_dict() for p in self.points],
        }


def tokens_per_s(point: LoadPoint | None) -> float | None:
    """Tokens streamed per second over all streams of a load level."""
    if point is None or point.seconds <= 0:
        return None
    return point.tokens / point.seconds


def throughput_ratios(student: GeneratorRun, teacher: GeneratorRun) -> dict[int, float | None]:
    """Student tokens/s over teacher tokens/s, per concurrency both measured."""
    ratios = {}
    for point in student.points:
        streams = int(point.load)
        mine, theirs = tokens_per_s(point), tokens_per_s(teacher.at(streams))
        ratios[streams] = mine / theirs if mine and theirs else None
    return ratios


def serve_and_load(repository: Path, variant: str, requests: list, plan: LoadPlan) -> GeneratorRun:
    """Serve ``repository``'s ``generator`` (Triton + reasoning service) and run ``plan`` on ``Explain``."""
    from ..generator_bundle import generator_bundle_dir, load_generator_bundle
    from ..serving.triton.launcher import TritonServer, TritonServerConfig
    from .service import reasoning_service

    bundle_dir = generator_bundle_dir(repository, "generator")
    bundle = load_generator_bundle(bundle_dir)
    run = GeneratorRun(variant, str(repository), bundle.source_model, bundle.precision)
    config = TritonServerConfig(
        model_repository=repository.resolve(),
        model_control_mode="explicit",
        load_models=("generator",),
        startup_timeout_s=600,
    )
    log.info("serving %s (%s, %s) from %s", variant, bundle.source_model, bundle.precision, repository)
    with (
        TritonServer(config) as triton,
        reasoning_service(bundle_dir, triton.grpc_url, default_timeout_s=plan.timeout_s) as target,
    ):
        run.points = asyncio.run(bench_service(target, "Explain", requests, plan))
    return run


SERVING_PARAMETERS = ("max_active_sequences", "max_queued_requests", "stream_interval", "intra_op_threads")


def serving_settings(repository: Path, name: str = "generator") -> dict[str, int]:
    """The serving parameters of a published generator's ``config.pbtxt`` (those it sets)."""
    from ..export.triton_config import parse_config_pbtxt

    config = parse_config_pbtxt((repository / name / "config.pbtxt").read_text())
    return {
        key: int(config.parameters[key].string_value)
        for key in SERVING_PARAMETERS
        if key in config.parameters and config.parameters[key].string_value
    }


def export_teacher(source: str, precision: str, into: Path, settings: dict[str, int] | None = None) -> Path:
    """Publish the teacher ``source`` as ``generator`` at ``precision`` into the repository ``into``, with
    the serving ``settings`` (fields of ``GeneratorExportConfig``)."""
    from ..export.generator_config import GeneratorExportConfig
    from ..export.generator_repository import publish_generator
    from ..models.teacher import load_teacher

    loaded = load_teacher(source)
    config = GeneratorExportConfig(
        model_repository=into,
        quantize=None if precision == "fp32" else precision,
        source_model=loaded.name,
        **(settings or {}),
    )
    publish_generator(loaded.model, loaded.tokenizer_file, config)
    return into


@dataclass
class GeneratorComparison:
    """The student and the teacher on the same stack."""

    student: GeneratorRun
    teacher: GeneratorRun
    max_tokens: int

    def ratios(self) -> dict[int, float | None]:
        return throughput_ratios(self.student, self.teacher)

    def as_dict(self) -> dict:
        return {
            "max_tokens": self.max_tokens,
            "student": self.student.as_dict(),
            "teacher": self.teacher.as_dict(),
            "student_over_teacher_tokens_per_s": {str(k): v for k, v in self.ratios().items()},
        }


def compare_generators(
    student_repository: Path,
    calls,
    plan: LoadPlan,
    max_tokens: int,
    teacher_source: str = "default",
    teacher_repository: Path | None = None,
    teacher_precision: str | None = None,
) -> GeneratorComparison:
    """Serve and load the student's repository, then the teacher's (exported at ``teacher_precision``,
    default the student's, into a temporary repository unless ``teacher_repository`` is given)."""
    requests = explain_requests(calls, max_tokens)
    student = serve_and_load(student_repository, STUDENT, requests, plan)
    if teacher_repository is not None:
        return GeneratorComparison(
            student, serve_and_load(teacher_repository, TEACHER, requests, plan), max_tokens
        )
    with tempfile.TemporaryDirectory(prefix="bench-teacher-", dir=cache_dir("bench")) as tmp:
        settings = serving_settings(student_repository)
        precision = teacher_precision or student.precision
        log.info("exporting teacher %r at %s with %s (as the student)", teacher_source, precision, settings)
        repository = export_teacher(teacher_source, precision, Path(tmp) / "model_repository", settings)
        teacher = serve_and_load(repository, TEACHER, requests, plan)
    return GeneratorComparison(student, teacher, max_tokens)


def _fmt(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def format_comparison(result: GeneratorComparison) -> str:
    """Markdown: one row per variant and load, then the ratios against the targets."""
    lines = [
        "| variant | model | precision | streams | ok | errors | tokens/s (all streams) | "
        "per-stream tok/s | TTFT p50 ms | TTFT p99 ms |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in (result.student, result.teacher):
        for p in run.points:
            ttft = p.ttft
            lines.append(
                f"| {run.variant} | {run.source_model} | {run.precision} | {int(p.load)} | {p.ok} | "
                f"{sum(p.errors.values())} | {_fmt(tokens_per_s(p))} | {_fmt(p.stream_tokens_per_s)} | "
                f"{_fmt(ttft.p50_ms if ttft else None)} | {_fmt(ttft.p99_ms if ttft else None)} |"
            )
    lines.append("")
    for streams, ratio in sorted(result.ratios().items()):
        lines.append(
            f"- student / teacher decode throughput at {streams} stream(s): {_fmt(ratio, '.2f', 'x')} "
            f"(target >= 3x)"
        )
    for run in (result.student, result.teacher):
        lines.append(
            f"- {run.variant}: TTFT p50 with the batch busy / idle: {_fmt(run.ttft_busy_over_idle(), '.2f', 'x')} "
            f"(target <= 2x)"
        )
    return "\n".join(lines)
