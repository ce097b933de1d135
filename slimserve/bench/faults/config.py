"""Settings of ``slimserve bench faults``: which cases, and the bounds (requests, seconds) of each."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from ...settings import Settings

Case = Literal["fuzz", "overload", "kill", "freeze", "drain", "publish"]
# The order cases run in, whatever order they are asked for: publishing changes the repository's
# newest version (undone afterwards), so it runs after the cases that restart Triton.
CASE_ORDER: tuple[Case, ...] = ("fuzz", "overload", "kill", "freeze", "drain", "publish")


class FaultsConfig(Settings):
    """What ``slimserve bench faults`` runs against a stack it starts on loopback."""

    env_prefix: ClassVar[str] = "SLIMSERVE_FAULTS_"

    model_repository: Path = Field(
        Path("model_repository"),
        description="Repository holding the scorer; its newest version is served from a scratch copy "
        "(hard links where possible), so the repository itself is never changed.",
    )
    model_name: str = Field("scorer", description="Scoring model in the repository.")
    cases: tuple[Case, ...] = Field(
        CASE_ORDER, description="Cases to run, comma-separated: " + ", ".join(CASE_ORDER) + "."
    )
    work_dir: Path | None = Field(
        None, description="Where the scratch repository goes (default: a temporary directory)."
    )
    seed: int = Field(0, description="Seed of the fuzz corpus and the open-loop arrivals.")
    dataset: Path | None = Field(
        None, description="Dataset directory (JSONL) for the load's prompts; default: a small synthetic one."
    )
    requests: int = Field(64, ge=1, description="Distinct Score requests (members) the load cycles through.")
    candidates: int = Field(8, ge=1, description="Candidates per Score call of the load.")
    deadline_s: float | None = Field(
        None,
        gt=0,
        description="Deadline of every load call (seconds); unset: sized from the measured capacity "
        "(3x the p99 at capacity, scaled to load_workers calls in flight, at least 2 s).",
    )
    fuzz_requests: int = Field(
        10_000, ge=2, description="Fuzz calls: half mutated ScoreRequests, half raw bytes."
    )
    fuzz_concurrency: int = Field(8, ge=1, description="Fuzz calls in flight at once.")
    capacity_concurrency: tuple[int, ...] = Field(
        (1, 2, 4, 8), description="Closed-loop concurrencies tried to find the capacity."
    )
    capacity_seconds: float = Field(5.0, gt=0, description="Seconds per capacity level.")
    overload_factor: float = Field(5.0, gt=1, description="Open-loop arrival rate, times the capacity.")
    overload_seconds: float = Field(60.0, gt=0, description="Seconds of open-loop overload.")
    overload_budget: int | None = Field(
        None,
        ge=1,
        description="max_candidates_in_flight of the service under overload; unset: the candidates in "
        "flight at capacity (capacity concurrency x candidates).",
    )
    load_workers: int = Field(
        4, ge=1, description="Closed-loop workers keeping calls in flight during faults."
    )
    observe_seconds: float = Field(2.0, gt=0, description="Seconds of load before and after each fault.")
    outage_seconds: float = Field(3.0, gt=0, description="Seconds Triton stays dead before its restart.")
    freeze_seconds: float | None = Field(
        None,
        gt=0,
        description="Seconds Triton stays stopped (SIGSTOP); longer than twice deadline_s (unset: 2.5x it).",
    )
    late_slack_s: float = Field(
        0.5,
        gt=0,
        description="A call answered more than this long after its deadline counts as past it (a hang).",
    )
    soak_minutes: float = Field(0.0, ge=0, description="Soak at half capacity for this long (0: no soak).")
    soak_warmup_minutes: float = Field(
        5.0, gt=0, description="Soak: RSS growth is measured from this point (at most half the soak)."
    )
    startup_timeout_s: float = Field(
        300.0, gt=0, description="Most seconds Triton or the service may take to start."
    )

    @field_validator("cases", "capacity_concurrency", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        if isinstance(value, int):
            return (value,)
        return value

    @model_validator(mode="after")
    def _check(self) -> FaultsConfig:
        if self.freeze_seconds is not None and self.freeze_seconds <= 2 * (self.deadline_s or 0.0):
            raise ValueError(
                f"freeze_seconds ({self.freeze_seconds}) must be longer than twice deadline_s "
                f"({self.deadline_s}): calls sent while Triton is stopped must reach their deadline before "
                "it resumes"
            )
        if not self.capacity_concurrency or min(self.capacity_concurrency) < 1:
            raise ValueError("capacity_concurrency needs at least one level, each >= 1")
        return self

    def with_deadline(self, deadline_s: float) -> FaultsConfig:
        """These settings with the load's deadline set (and the freeze, when unset, 2.5x it)."""
        freeze = self.freeze_seconds if self.freeze_seconds is not None else 2.5 * deadline_s
        return self.model_copy(update={"deadline_s": deadline_s, "freeze_seconds": freeze})

    def ordered_cases(self) -> tuple[Case, ...]:
        return tuple(case for case in CASE_ORDER if case in self.cases)
