"""The ``tensorrt`` section of a build recipe (used when ``target: tensorrt``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ParityThresholds(BaseModel):
    """What the engine must keep of the ONNX graph's scores on held-out prompts (0 disables a check)."""

    model_config = ConfigDict(extra="forbid")

    min_pearson: float = Field(0.99, ge=0, le=1, description="Pearson correlation of the scores")
    min_spearman: float = Field(0.99, ge=0, le=1, description="Spearman rank correlation of the scores")
    min_pairwise_agreement: float = Field(
        0.97, ge=0, le=1, description="Share of each member's candidate pairs ordered the same way"
    )
    min_topk_overlap: float = Field(0.9, ge=0, le=1, description="Mean overlap of each member's top-k")
    top_k: int = Field(5, ge=1, description="k of the top-k overlap")
    max_abs_diff: float | None = Field(
        None, gt=0, description="Largest allowed score difference (None: reported only; INT8 moves scores)"
    )


class TensorRTSettings(BaseModel):
    """Model Optimizer Q/DQ, a strongly typed TensorRT build per length bucket, and the parity gate."""

    model_config = ConfigDict(extra="forbid")

    precision: Literal["auto", "int8", "fp8"] = Field(
        "auto", description="auto: FP8 on compute capability >= 8.9, else INT8 (Q/DQ from Model Optimizer)"
    )
    smoothquant_alpha: float = Field(
        0.5,
        ge=0,
        le=1,
        description="SmoothQuant migration strength before INT8 Q/DQ (0: none; FP8 is not smoothed)",
    )
    calibration_method: Literal["max", "entropy"] = Field("max", description="Model Optimizer calibration")
    calibration_examples: int = Field(512, ge=8, description="Real train prompts used to calibrate")
    calibration_batch_size: int = Field(16, ge=1, description="Prompts per calibration batch")
    high_precision_dtype: Literal["fp16", "bf16", "fp32"] = Field(
        "fp16", description="Type of the layers left unquantized (strongly typed: it is what TensorRT runs)"
    )
    onnx_execution_provider: Literal["cuda", "cpu"] = Field(
        "cuda",
        description="ONNX Runtime provider for calibration and the parity reference (cpu if CUDA is absent)",
    )
    opt_batch_size: int | None = Field(None, ge=1, description="Batch each profile is tuned for (None: max)")
    workspace_gib: float = Field(4.0, gt=0, description="TensorRT builder workspace limit")
    optimization_level: int = Field(3, ge=0, le=5, description="TensorRT builder optimization level")
    timing_cache: Path | None = Field(
        None, description="Timing cache directory kept across builds (default: <work_dir>/timing_cache)"
    )
    parity_prompts: int = Field(512, ge=16, description="Held-out test prompts of the parity gate")
    parity: ParityThresholds = Field(default_factory=ParityThresholds)
    instance_count: int = Field(1, ge=1, description="Triton model instances per GPU")
    warmup_max_batch: bool = Field(True, description="Also warm up every profile at max_batch_size")


def check_profiles_fit(settings: TensorRTSettings, length_buckets, max_batch_size: int) -> None:
    """Recipe-time check that the profiles can be built (``ValueError`` naming the field)."""
    from .profiles import bucket_profiles

    try:
        bucket_profiles(length_buckets, max_batch_size, settings.opt_batch_size)
    except ValueError as exc:
        raise ValueError(f"tensorrt profiles from publish.length_buckets/max_batch_size: {exc}") from None
