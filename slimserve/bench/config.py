"""Settings of the ``slimserve bench ...`` commands: what each measures, on which prompts, how long.

``CompareSettings`` (durations and load levels of one comparison) and ``LayoutSettings`` (of one layout
comparison) are what ``bench.compare`` and ``bench.layouts`` run with. The commands' typed settings are
``CompareConfig`` (``bench compare`` and ``bench report``), ``LatencyBenchConfig`` (``bench latency``),
``TritonBenchConfig`` (``bench triton``), ``GrpcBenchConfig`` (``bench grpc``), ``LayoutsConfig``
(``bench layouts``) and ``GeneratorsBenchConfig`` (``bench generators``): their flags derived from their
fields (``settings.add_config_flags``), each default taken from the settings the bench modules run with
or from ``ScoringServiceConfig``. Light to import: the parser is built from it (a bench module is
imported only when a config is turned into its settings).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import (
    BeforeValidator,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from ..channel import check_triton_tls
from ..serving.scoring.config import ScoringServiceConfig
from ..settings import Settings
from ..up_config import UpConfig

if TYPE_CHECKING:
    from .grpc_load import LoadPlan
    from .perf_analyzer import PerfSettings, PerfTls


@dataclass(frozen=True)
class CompareSettings:
    """Durations and load levels of one comparison."""

    engine_seconds: float = 10.0
    batch_size: int = 32  # PyTorch baseline
    floor_batch_sizes: tuple[int, ...] = (8, 32)  # ONNX Runtime floor: the best of these and 1
    concurrencies: tuple[int, ...] = (1, 4, 16)
    max_requests: int = 400
    max_seconds: float = 10.0
    delays_us: tuple[int, ...] = (0, 300)
    main_delay_us: int = 300
    open_loop_fraction: float = 0.5
    open_loop_seconds: float = 20.0
    perf_concurrencies: tuple[int, ...] = (1, 4, 16)
    perf_window_requests: int = 100
    pytorch: bool = True
    timeout_s: float = 120.0


@dataclass(frozen=True)
class LayoutSettings:
    """Candidates per call, load levels and durations of one layout comparison."""

    candidates: tuple[int, ...] = (1, 10, 50, 200)
    concurrencies: tuple[int, ...] = (1, 2, 4)
    requests: int = 16  # distinct Score calls (members) per candidate count
    floor_seconds: float = 4.0
    max_requests: int = 200
    max_seconds: float = 8.0
    timeout_s: float = 120.0


def _defaults(settings: type) -> dict[str, Any]:
    return {field.name: field.default for field in dataclasses.fields(settings)}


_COMPARE = _defaults(CompareSettings)
_LAYOUT = _defaults(LayoutSettings)
_SCORING = ScoringServiceConfig.model_fields
_UP_FIELDS = UpConfig.model_fields
_REPOSITORY = _SCORING["model_repository"].default
_MODEL_NAME = _SCORING["model_name"].default
# Config fields named for their flags, where CompareSettings and LayoutSettings have a plural
_SETTINGS_NAME = {"concurrency": "concurrencies", "perf_concurrency": "perf_concurrencies"}


def _settings_of(config: Settings, settings: type) -> Any:
    """``settings`` (a dataclass) from the fields of ``config`` it has; the others keep their defaults."""
    values = {_SETTINGS_NAME.get(name, name): value for name, value in config}
    return settings(**{name: values[name] for name in _defaults(settings) if name in values})


def _comma_separated(value: Any) -> Any:
    """Comma-separated text (a flag, the environment), one number, or nothing (no level)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (value,)
    return value


def _listed(kind: Any, metavar: str) -> Any:
    """A tuple of ``kind`` given as one comma-separated flag (``--concurrency 1,4,16``; '' for none)."""
    flag = Field(json_schema_extra={"comma_separated": True, "metavar": metavar})
    return Annotated[tuple[kind, ...], BeforeValidator(_comma_separated), flag]


Counts = _listed(PositiveInt, "N,N,...")
Delays = _listed(NonNegativeInt, "US,US,...")
Rates = _listed(PositiveFloat, "RATE,RATE,...")
Names = _listed(str, "NAME,NAME,...")

# The bounds of one load level (``bench grpc``, ``bench generators``, ``bench layouts``): constraints and
# description; each command sets its own default.
_BOUNDS: dict[str, tuple[dict[str, float], str]] = {
    "max_requests": ({"ge": 1}, "Most requests per load level."),
    "max_seconds": ({"gt": 0}, "Most seconds per load level."),
    "warmup": ({"ge": 0}, "Unmeasured requests first."),
    "timeout": ({"gt": 0}, "Deadline per request (seconds)."),
}


def _bound(name: str, default: float) -> Any:
    constraints, description = _BOUNDS[name]
    return Field(default, description=description, **constraints)


def _load_plan(
    config: GrpcBenchConfig | GeneratorsBenchConfig,
    concurrencies: tuple[int, ...],
    rates: tuple[float, ...] = (),
) -> LoadPlan:
    from .grpc_load import LoadPlan

    return LoadPlan(
        concurrencies=concurrencies,
        rates=rates,
        max_requests=config.max_requests,
        max_seconds=config.max_seconds,
        warmup_requests=config.warmup,
        timeout_s=config.timeout,
    )


class PromptsConfig(Settings):
    """The prompts of a benchmark: real requests from a dataset (or a small synthetic one)."""

    dataset: Path | None = Field(
        None, description="Dataset directory (JSONL); default: a small synthetic one."
    )
    requests: PositiveInt = Field(64, description="Distinct requests (members) to cycle through.")


class WorkloadConfig(PromptsConfig):
    """Prompts of a benchmark of Score calls, each with ``candidates`` items."""

    candidates: PositiveInt = Field(8, description="Candidates (items) per Score request.")


class CompareConfig(WorkloadConfig):
    """What ``slimserve bench compare`` (and ``bench report``) compares, on which prompts, how long."""

    env_prefix: ClassVar[str] = "SLIMSERVE_COMPARE_"

    build_dir: Path | None = Field(
        None,
        description="A build's work directory: teacher FP32, student FP32, INT8 (and the build's dataset).",
    )
    variant: list[str] = Field(
        default_factory=list,
        description="A variant by hand (repeatable; the last one is the published one): ONNX graph, "
        "optional PyTorch source (tiny, default or a causal-LM directory).",
        json_schema_extra={"repeatable": True, "metavar": "NAME=ONNX[@TORCH]"},
    )
    model_repository: Path = Field(_REPOSITORY, description="Repository holding the serving bundle.")
    model_name: str = Field(_MODEL_NAME, description="Model whose serving bundle is used.")
    engine_seconds: float = Field(_COMPARE["engine_seconds"], description="Seconds per in-process engine.")
    concurrency: Counts = Field(_COMPARE["concurrencies"], description="Closed-loop levels, comma-separated.")
    max_requests: int = Field(_COMPARE["max_requests"], description="Most requests per load level.")
    max_seconds: float = Field(_COMPARE["max_seconds"], description="Most seconds per load level.")
    open_loop_seconds: float = Field(
        _COMPARE["open_loop_seconds"], description="Seconds of the open-loop run."
    )
    delays_us: Delays = Field(
        _COMPARE["delays_us"], description="Queue delays to compare (microseconds), comma-separated."
    )
    main_delay_us: int = Field(
        _COMPARE["main_delay_us"], description="Queue delay of the cross-variant runs."
    )
    perf_concurrency: Counts = Field(
        _COMPARE["perf_concurrencies"], description="perf_analyzer levels, comma-separated."
    )
    perf_window_requests: int = Field(
        _COMPARE["perf_window_requests"], description="perf_analyzer window size."
    )
    pytorch: bool = Field(
        _COMPARE["pytorch"], description="Measure the PyTorch baseline (--no-pytorch: skip)."
    )
    layout_candidates: Counts = Field(
        _LAYOUT["candidates"],
        description="Candidates per call of the multi-item vs single-sequence comparison (a multi-item "
        "build_dir), comma-separated.",
    )
    layouts: bool = Field(True, description="Compare multi-item and single-sequence (--no-layouts: skip).")

    @field_validator("variant", mode="before")
    @classmethod
    def _one_variant(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    def settings(self) -> CompareSettings:
        """The durations and load levels ``bench.compare.run_compare`` runs with (the fields both have)."""
        return _settings_of(self, CompareSettings)

    def layout_settings(self) -> LayoutSettings:
        """The layout comparison at the end of the run."""
        return LayoutSettings(candidates=self.layout_candidates, max_seconds=self.max_seconds)


class LatencyBenchConfig(Settings):
    """What ``slimserve bench latency`` sends: sequential Score calls, per number of candidates."""

    env_prefix: ClassVar[str] = "SLIMSERVE_BENCH_LATENCY_"

    target: str = Field("127.0.0.1:50051", description="Scoring service host:port.")
    candidates: Counts = Field((1, 50), description="Candidates per call, comma-separated counts.")
    requests: PositiveInt = Field(100, description="Measured requests per count.")
    warmup: NonNegativeInt = Field(5, description="Unmeasured requests per count first.")


class TritonBenchConfig(WorkloadConfig):
    """What ``slimserve bench triton`` drives with perf_analyzer: which models, at which loads."""

    env_prefix: ClassVar[str] = "SLIMSERVE_BENCH_TRITON_"

    model_repository: Path = Field(_REPOSITORY, description="Repository whose models are measured.")
    triton_url: str | None = Field(
        None, description="Use this running Triton (host:port) instead of starting one."
    )
    # perf_analyzer's TLS: the fields (and descriptions) of ``slimserve up``'s, which has the services'
    triton_tls: bool = _UP_FIELDS["triton_tls"]
    triton_tls_ca_file: Path | None = _UP_FIELDS["triton_tls_ca_file"]
    triton_tls_cert_file: Path | None = _UP_FIELDS["triton_tls_cert_file"]
    triton_tls_key_file: Path | None = _UP_FIELDS["triton_tls_key_file"]
    models: Names = Field((), description="Model names, comma-separated; default: all token models.")
    bundle_model: str = Field(_MODEL_NAME, description="Model whose serving bundle tokenizes prompts.")
    concurrency: Counts = Field((1, 2, 4, 8, 16), description="Concurrency levels, e.g. 1,4,16.")
    request_rate: Rates = Field((), description="Poisson request rates (req/s), e.g. 10,20.")
    buckets: Counts = Field((), description="Only these length buckets, comma-separated; default: all.")
    window_requests: PositiveInt = Field(100, description="Requests per measurement window.")
    max_trials: int = Field(
        3, ge=3, description="Measurement windows per load point (perf_analyzer compares the last 3)."
    )
    stability: PositiveFloat = Field(1000.0, description="perf_analyzer -s (percent).")
    batch_size: PositiveInt = Field(1, description="perf_analyzer -b.")
    max_tokens: PositiveInt = Field(32, description="Generators: tokens generated per request.")

    def perf_settings(self) -> PerfSettings:
        """How perf_analyzer measures each load point."""
        from .perf_analyzer import PerfSettings

        return PerfSettings(self.window_requests, self.max_trials, self.stability, self.batch_size)

    def perf_tls(self) -> PerfTls | None:
        """perf_analyzer's TLS to ``triton_url`` (None: plaintext)."""
        from .perf_analyzer import PerfTls

        files = (self.triton_tls_ca_file, self.triton_tls_cert_file, self.triton_tls_key_file)
        if not self.triton_tls and not any(files):
            return None
        return PerfTls(*files)

    @model_validator(mode="after")
    def _tls_needs_a_remote_triton(self) -> TritonBenchConfig:
        check_triton_tls(self, started_here="the Triton that bench triton starts listens in plaintext")
        return self


class GrpcBenchConfig(WorkloadConfig):
    """What ``slimserve bench grpc`` sends to a running service on loopback, at which loads."""

    env_prefix: ClassVar[str] = "SLIMSERVE_BENCH_GRPC_"

    target: str = Field("127.0.0.1:50051", description="Service host:port (loopback only).")
    method: Literal["Score", "Explain"] = Field("Score", description="RPC to load.")
    concurrency: Counts = Field((1, 4, 16), description="Closed-loop levels, comma-separated ('': none).")
    rate: Rates = Field((), description="Open-loop Poisson rates (req/s), comma-separated.")
    max_requests: int = _bound("max_requests", 500)
    max_seconds: float = _bound("max_seconds", 10.0)
    warmup: int = _bound("warmup", 8)
    timeout: float = _bound("timeout", 30.0)
    max_tokens: PositiveInt = Field(32, description="Explain: tokens to generate.")

    def load_plan(self) -> LoadPlan:
        """The closed-loop levels, the open-loop rates and the bounds of each."""
        return _load_plan(self, self.concurrency, self.rate)


class LayoutsConfig(Settings):
    """What ``slimserve bench layouts`` compares: a multi-item build's two INT8 graphs of one student."""

    env_prefix: ClassVar[str] = "SLIMSERVE_BENCH_LAYOUTS_"

    build_dir: Path | None = Field(
        None, description="A multi-item build's work directory (its INT8 graphs); required."
    )
    model_repository: Path = Field(_REPOSITORY, description="Repository holding the serving bundle.")
    model_name: str = Field(_MODEL_NAME, description="Model whose serving bundle is used.")
    candidates: Counts = Field(
        _LAYOUT["candidates"], description="Candidates per Score call, comma-separated."
    )
    concurrency: Counts = Field(_LAYOUT["concurrencies"], description="Closed-loop levels, comma-separated.")
    requests: PositiveInt = Field(
        _LAYOUT["requests"], description="Distinct calls (members) per candidate count."
    )
    floor_seconds: PositiveFloat = Field(
        _LAYOUT["floor_seconds"], description="Seconds per in-process floor."
    )
    max_requests: int = _bound("max_requests", _LAYOUT["max_requests"])
    max_seconds: float = _bound("max_seconds", _LAYOUT["max_seconds"])
    dataset: Path | None = Field(None, description="Dataset directory (JSONL); default: the build's.")

    def settings(self) -> LayoutSettings:
        """The candidates, load levels and durations ``bench.layouts.run_layouts`` runs with."""
        return _settings_of(self, LayoutSettings)


class GeneratorsBenchConfig(PromptsConfig):
    """What ``slimserve bench generators`` compares: the repository's generator and its teacher."""

    env_prefix: ClassVar[str] = "SLIMSERVE_BENCH_GENERATORS_"

    model_repository: Path = Field(_REPOSITORY, description="Repository holding the student as 'generator'.")
    teacher: str = Field(
        "default",
        description="Teacher to export at the student's precision (default, tiny or a directory); "
        "not with teacher_repository.",
    )
    teacher_repository: Path | None = Field(
        None, description="A repository already holding the teacher as 'generator' (no export)."
    )
    teacher_precision: Literal["fp32", "int8", "int4"] | None = Field(
        None, description="Precision of the exported teacher: fp32, int8 or int4; default: the student's."
    )
    streams: Counts = Field((1, 8), description="Concurrent Explain streams, comma-separated.")
    max_tokens: PositiveInt = Field(64, description="Tokens per explanation (greedy).")
    max_requests: int = _bound("max_requests", 48)
    max_seconds: float = _bound("max_seconds", 60.0)
    warmup: int = _bound("warmup", 2)
    timeout: float = _bound("timeout", 300.0)

    @model_validator(mode="after")
    def _one_teacher(self) -> GeneratorsBenchConfig:
        if self.teacher_repository is not None and "teacher" in self.model_fields_set:
            raise ValueError("teacher and teacher_repository exclude each other: give one")
        return self

    def load_plan(self) -> LoadPlan:
        """Closed-loop levels of ``streams`` Explain streams, and the bounds of each."""
        return _load_plan(self, self.streams)
