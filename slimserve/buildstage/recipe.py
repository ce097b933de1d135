"""Build recipes: one validated model, unknown keys rejected at every level.

The named recipes ship inside the package (``slimserve/recipes/*.yaml``, package data of the wheel), so
``--recipe cpu`` works from any install; ``build/recipes`` in the repository is a link to that folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ..compression.precision import Precision
from ..compression.trainer import TrainConfig
from ..export.exporters import DEFAULT_EXPORTER, EXPORTER_HELP, OnnxExporter
from ..export.scoring_layout import ScoringLayout
from ..export.tensorrt.settings import TensorRTSettings, check_profiles_fit
from ..settings import ConfigError, Settings, load_config
from .generator_recipe import GeneratorSettings

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataSettings(_Strict):
    """Where the examples come from and how many each stage uses."""

    dataset: Path | None = Field(None, description="Dataset directory (JSONL); unset: synthesize one")
    synth: dict = Field(default_factory=dict, description="SynthConfig overrides when synthesizing")
    split_seed: int = Field(0, description="Seed of the split by member")
    max_train: int = Field(2000, ge=8, description="Labelled training examples used")
    max_validation: int = Field(300, ge=8, description="Validation examples used")
    max_test: int = Field(1000, ge=8, description="Held-out test examples used for every stage's metrics")
    max_pool: int = Field(2000, ge=0, description="Unlabelled pairs the teacher soft-labels for distillation")
    calibration_examples: int = Field(
        128, ge=8, description="Train prompts used to calibrate pruning and INT8"
    )


class TeacherSettings(_Strict):
    """The teacher and its yes/no fine-tuning."""

    source: str = Field(
        "default", description="'default' (SmolLM2-135M-Instruct), 'tiny' or a HF model directory"
    )
    seed: int = Field(0, description="Seed of a random tiny teacher")
    finetune: bool = Field(True, description="Fine-tune the teacher on the labels")
    train_top_layers: int = Field(4, ge=1, description="Layers trained (the rest run once, cached)")
    train: TrainConfig = Field(default_factory=lambda: TrainConfig(lr=5e-5, epochs=2, batch_size=16))
    precision: Precision = Field(
        "fp32",
        description="Matrix products of the frozen-layer cache and the top-layer fine-tune: fp32, bf16 "
        "(autocast; FP32 weights, optimizer and loss), or auto (bf16 where the CPU has AMX tiles or "
        "AVX-512 BF16, else fp32). The evaluations and the soft labels' top layers are FP32 (README, "
        "Precision).",
    )


class DistillSettings(_Strict):
    """Distillation of the 2-way yes/no distribution into the student."""

    temperature: float = Field(2.0, gt=0, description="Softmax temperature of the KL")
    label_weight: float = Field(0.3, ge=0, le=1, description="Weight of the label loss on labelled examples")
    use_pool: bool = Field(True, description="Also train on the teacher-labelled unlabelled pool")
    train: TrainConfig = Field(default_factory=lambda: TrainConfig(lr=1e-4, epochs=1, batch_size=16))
    precision: Precision = Field(
        "fp32",
        description="Matrix products of the training passes: fp32, bf16 (autocast; FP32 weights, "
        "optimizer, loss and label logits) or auto (bf16 where the CPU has AMX tiles or AVX-512 BF16). "
        "The student's evaluations are FP32 (README, Precision).",
    )


class StudentSettings(_Strict):
    """The student's size: whole layers kept from the fine-tuned teacher, then distilled."""

    layers: int = Field(12, ge=1, description="Decoder layers kept (the most important, by measurement)")
    layer_calibration_tokens: int = Field(
        2048, ge=1, description="Calibration tokens that score whole layers (about L/2 passes over them)"
    )
    distill: DistillSettings = Field(default_factory=DistillSettings)


class PruneSettings(_Strict):
    """OSSCAR-style structured pruning of the distilled student, then re-distillation."""

    mlp_keep: int | None = Field(768, ge=1, description="MLP neurons kept per layer (uniform)")
    heads_per_kv_group: int | None = Field(2, ge=1, description="Query heads kept per KV group (uniform)")
    compare_magnitude: bool = Field(
        True, description="Also evaluate magnitude pruning of the same size, with and without the re-fit"
    )
    redistill: DistillSettings = Field(default_factory=DistillSettings)


class QuantizeSettings(_Strict):
    """INT8 for the CPU target."""

    method: Literal["static", "weight-only", "dynamic", "auto"] = Field(
        "auto",
        description="auto: static QDQ; if it misses the INT8 gate, block-wise weight-only; then dynamic",
    )
    per_channel: bool = Field(True, description="Per-channel weight scales (static, dynamic)")
    block_size: int = Field(32, ge=16, description="Weight-only: inputs per scale")


class GateSettings(_Strict):
    """Minimum retention (student test AUC / fine-tuned teacher test AUC) per stage; 0 disables."""

    distilled: float = Field(0.95, ge=0, description="Distilled student")
    pruned_redistilled: float = Field(0.97, ge=0, description="Pruned and re-distilled student")
    int8: float = Field(0.985, ge=0, description="INT8 student (the published model)")
    multi_item_spearman: float = Field(
        0.99,
        ge=0,
        le=1,
        description="Multi-item INT8: least Spearman correlation with the single-sequence INT8 scores",
    )
    multi_item_auc_gap: float | None = Field(
        0.002,
        ge=0,
        description="Multi-item INT8: largest test AUC difference to the single-sequence INT8 graph (null: off)",
    )


class PublishSettings(ScoringLayout, _Strict):
    """Where and how the final student is served."""

    model_repository: Path = Field(Path("model_repository"), description="Triton repository to publish into")
    model_name: str = Field("scorer", description="Triton model name")
    length_buckets: tuple[int, ...] = Field((96, 192, 320, 512), description="Sequence-length buckets")
    max_batch_size: int = Field(64, ge=1, description="Triton max_batch_size")
    max_queue_delay_us: int = Field(200, ge=0, description="Dynamic batcher queue delay")
    # Non-zero queue settings turn off Triton's batcher prefetching: 500 ms stalls (docs/bench.md Tail latency).
    max_queue_size: int = Field(
        0, ge=0, description="Triton queue bound (RESOURCE_EXHAUSTED beyond; 0 = none)"
    )
    default_timeout_us: int = Field(
        0, ge=0, description="Triton queue timeout (0 = none: gRPC deadlines cancel)"
    )
    onnx_exporter: OnnxExporter = Field(DEFAULT_EXPORTER, description=EXPORTER_HELP)


class Recipe(Settings):
    """Everything ``slimserve build`` does, from data to the published INT8 student."""

    env_prefix: ClassVar[str] = "SLIMSERVE_BUILD_"

    name: str = Field("custom", description="Recipe name (reports, work directory)")
    target: Literal["cpu", "tensorrt"] = Field(
        "cpu",
        description="cpu: INT8 ONNX on ONNX Runtime; tensorrt: TensorRT engines (NVIDIA GPU, docs/gpu.md)",
    )
    work_dir: Path | None = Field(None, description="Stage outputs; default build_output/<name>")
    data: DataSettings = Field(default_factory=DataSettings)
    teacher: TeacherSettings = Field(default_factory=TeacherSettings)
    student: StudentSettings = Field(default_factory=StudentSettings)
    prune: PruneSettings = Field(default_factory=PruneSettings)
    quantize: QuantizeSettings = Field(default_factory=QuantizeSettings)
    gates: GateSettings = Field(default_factory=GateSettings)
    publish: PublishSettings = Field(default_factory=PublishSettings)
    tensorrt: TensorRTSettings = Field(default_factory=TensorRTSettings, description="target: tensorrt only")
    speed_seconds: float = Field(5.0, gt=0, description="Seconds per in-process speed measurement")
    generator: GeneratorSettings | None = Field(
        None, description="The generator student (reasoning workload); unset: the build makes no generator"
    )

    @field_validator("tensorrt")
    @classmethod
    def _profiles_fit(cls, value: TensorRTSettings, info: ValidationInfo) -> TensorRTSettings:
        publish = info.data.get("publish")
        if info.data.get("target") == "tensorrt" and publish is not None:
            check_profiles_fit(value, publish.length_buckets, publish.max_batch_size)
        return value

    def resolved_work_dir(self) -> Path:
        return self.work_dir or Path("build_output") / self.name


def load_recipe(name_or_path: str, overrides: dict | None = None) -> Recipe:
    """A recipe by name (``tiny``, ``cpu``, ``gpu``, ... in ``slimserve/recipes``) or by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = RECIPES_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
        raise ConfigError(f"recipe {name_or_path!r} not found (known: {known}, or a path to a YAML file)")
    return load_config(Recipe, path, overrides=overrides)
