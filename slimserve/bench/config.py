"""Settings of ``slimserve bench compare`` and ``bench report``: what is compared, on which prompts, how long.

``CompareSettings`` (durations and load levels of one comparison) and ``LayoutSettings`` (of one layout
comparison) are what ``bench.compare`` and ``bench.layouts`` run with; ``CompareConfig`` is the command's
typed settings, its flags derived from its fields (``settings.add_config_flags``), each default taken
from those two or from ``ScoringServiceConfig``. Light to import: the parser is built from it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, NonNegativeInt, PositiveInt, field_validator

from ..serving.scoring.config import ScoringServiceConfig
from ..settings import Settings


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
# CompareConfig fields named for their flags, where CompareSettings has a plural
_SETTINGS_NAME = {"concurrency": "concurrencies", "perf_concurrency": "perf_concurrencies"}


class WorkloadConfig(Settings):
    """The prompts of a benchmark: real requests from a dataset (or a small synthetic one)."""

    dataset: Path | None = Field(
        None, description="Dataset directory (JSONL); default: a small synthetic one."
    )
    requests: int = Field(64, description="Distinct requests (members) to cycle through.")
    candidates: int = Field(8, description="Candidates (items) per Score request.")


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
    model_repository: Path = Field(
        _SCORING["model_repository"].default, description="Repository holding the serving bundle."
    )
    model_name: str = Field(_SCORING["model_name"].default, description="Model whose serving bundle is used.")
    engine_seconds: float = Field(_COMPARE["engine_seconds"], description="Seconds per in-process engine.")
    concurrency: tuple[PositiveInt, ...] = Field(
        _COMPARE["concurrencies"], description="Closed-loop levels, comma-separated."
    )
    max_requests: int = Field(_COMPARE["max_requests"], description="Most requests per load level.")
    max_seconds: float = Field(_COMPARE["max_seconds"], description="Most seconds per load level.")
    open_loop_seconds: float = Field(
        _COMPARE["open_loop_seconds"], description="Seconds of the open-loop run."
    )
    delays_us: tuple[NonNegativeInt, ...] = Field(
        _COMPARE["delays_us"], description="Queue delays to compare (microseconds), comma-separated."
    )
    main_delay_us: int = Field(
        _COMPARE["main_delay_us"], description="Queue delay of the cross-variant runs."
    )
    perf_concurrency: tuple[PositiveInt, ...] = Field(
        _COMPARE["perf_concurrencies"], description="perf_analyzer levels, comma-separated."
    )
    perf_window_requests: int = Field(
        _COMPARE["perf_window_requests"], description="perf_analyzer window size."
    )
    pytorch: bool = Field(
        _COMPARE["pytorch"], description="Measure the PyTorch baseline (--no-pytorch: skip)."
    )
    layout_candidates: tuple[PositiveInt, ...] = Field(
        _LAYOUT["candidates"],
        description="Candidates per call of the multi-item vs single-sequence comparison (a multi-item "
        "build_dir), comma-separated.",
    )
    layouts: bool = Field(True, description="Compare multi-item and single-sequence (--no-layouts: skip).")

    @field_validator("concurrency", "delays_us", "perf_concurrency", "layout_candidates", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        """Comma-separated text (a flag, the environment), one number, or nothing (no level)."""
        if value is None:
            return ()
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        if isinstance(value, int):
            return (value,)
        return value

    @field_validator("variant", mode="before")
    @classmethod
    def _one_variant(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    def settings(self) -> CompareSettings:
        """The durations and load levels ``bench.compare.run_compare`` runs with (the fields both have)."""
        values = {_SETTINGS_NAME.get(name, name): value for name, value in self}
        return CompareSettings(**{name: values[name] for name in _COMPARE if name in values})

    def layout_settings(self) -> LayoutSettings:
        """The layout comparison at the end of the run."""
        return LayoutSettings(candidates=self.layout_candidates, max_seconds=self.max_seconds)
