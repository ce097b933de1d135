"""Settings of a generator export: what ``publish_generator`` checks, publishes and how Triton serves it.

``GeneratorPublishOptions`` (the parity check and the serving limits) is shared by
``GeneratorExportConfig`` and the build recipes' ``generator.publish`` section.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, Field

from ..settings import Settings

GENERATOR_MODEL = "generator"


class GeneratorPublishOptions(BaseModel):
    """The FP32 greedy parity check and the Triton serving limits of a published generator."""

    parity_prompts: int = Field(8, ge=1, description="Explanation prompts of the FP32 greedy parity check")
    parity_tokens: int = Field(24, ge=1, description="Greedy tokens compared per parity prompt")
    max_new_tokens_limit: int = Field(
        512, ge=1, description="Largest max_tokens a request may ask for (at most max_context - 1)"
    )
    max_active_sequences: int = Field(8, ge=1, description="Slots of the running batch")
    max_queued_requests: int = Field(
        64, ge=0, description="Bounded queue (beyond: 'queue full'; 0: no request waits for a slot)"
    )
    stream_interval: int = Field(
        1, ge=1, description="Tokens per streamed response after the first (fewer messages per token)"
    )
    output_vocab: int | None = Field(
        None,
        ge=1,
        description="The LM head scores only the lowest N token ids (a BPE vocabulary's most frequent) and "
        "the end ids, plus each running prompt's own tokens (docs/generator.md); unset: every token",
    )
    device: Literal["cpu", "gpu"] = Field(
        "cpu", description="Where Triton runs the generator (gpu: KIND_GPU, ONNX Runtime's CUDA provider)"
    )


class GeneratorExportConfig(GeneratorPublishOptions, Settings):
    """Settings of a generator export (causal LM -> checked ONNX decoder -> Triton model ``generator``)."""

    env_prefix: ClassVar[str] = "SLIMSERVE_GENERATOR_EXPORT_"

    model_repository: Path = Field(
        Path("model_repository"), description="Triton model repository to publish into"
    )
    model_name: str = Field(GENERATOR_MODEL, description="Triton model name")
    version: int | None = Field(None, description="Version to publish (unset: the next after the newest)")
    quantize: Literal["int8", "int4"] | None = Field(
        "int8",
        description="Weight-only quantization of the served graph (MatMulNBits; its agreement with PyTorch "
        "is reported, not gated); unset: the FP32 graph",
    )
    quantize_options: dict[str, str] | None = Field(
        None,
        description="Model builder options, e.g. {accuracy_level: '1'} (unset: block 32, symmetric, "
        "accuracy level 4 = INT8 compute)",
    )
    source_model: str = Field(
        "", description="Where the model comes from (bundle, model card, Triton config)"
    )
    max_context: int | None = Field(
        None, ge=2, description="Longest sequence served (unset: the model's positions, at most 2048)"
    )
    eos_token_ids: tuple[int, ...] | None = Field(
        None,
        description="Ids that end a sequence (unset: the tokenizer's end-of-turn and end-of-text ids and "
        "the model config's eos ids)",
    )
    intra_op_threads: int = Field(
        0, ge=0, description="ONNX Runtime threads per instance (0: ONNX Runtime's default)"
    )
