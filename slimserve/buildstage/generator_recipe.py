"""The ``generator:`` section of a build recipe (validated; unknown keys rejected at every level)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..compression.precision import Precision
from ..compression.trainer import TrainConfig
from ..export.generator_config import GeneratorPublishOptions


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _precision_field():
    """A training stage's ``precision``: the matrix products of its training forward and backward."""
    return Field(
        "fp32",
        description="Matrix products of the training passes: fp32, bf16 (autocast; FP32 weights, optimizer, "
        "LM head and loss) or auto (bf16 where the generator's device has BF16 units: AMX tiles or AVX-512 "
        "BF16 on the CPU, compute capability 8.0 or later on CUDA; else fp32). Text "
        "generation is at generation_precision; the teacher-forced targets and evaluations are FP32 (README, "
        "Precision).",
    )


class TeacherFinetuneSettings(_Strict):
    """The grounded fine-tune of the generator teacher, before its text is written and distilled: answers
    to explanation prompts written from each pair's facts (``data.explanations``), optionally mixed with
    free instructions answered by the teacher itself before the fine-tune."""

    enabled: bool = Field(True, description="Fine-tune the teacher (false: distill the teacher as loaded)")
    examples: int = Field(256, ge=1, description="Train-split pairs with a written explanation")
    general_share: float = Field(
        0.15,
        ge=0,
        lt=1,
        description="Share of the fine-tune set that is free instructions the teacher answers itself (greedy, "
        "before the fine-tune), to keep free Generate prompts working; 0: explanations only",
    )
    general_max_new_tokens: int = Field(96, ge=1, description="Length limit of those answers")
    train_top_layers: int | None = Field(
        None,
        ge=1,
        description="Decoder layers that learn, from the top (the ones below stay frozen and need no "
        "backward pass); null: all of them",
    )
    train: TrainConfig = Field(default_factory=lambda: TrainConfig(lr=1e-4, epochs=2, batch_size=8))
    precision: Precision = _precision_field()
    seed: int = Field(
        0, description="Seed of the pairs' choice, the explanations' wording and the instructions"
    )

    @property
    def general_examples(self) -> int:
        """Free instructions in the set: ``general_share`` of the whole, beside ``examples`` explanations."""
        return round(self.examples * self.general_share / (1 - self.general_share))


class TeacherTextSettings(_Strict):
    """The teacher's text for explanation prompts: generated once, batched, cached in the build."""

    prompts: int = Field(
        96, ge=1, description="Train-split prompts the teacher writes for (the training set)"
    )
    heldout_prompts: int = Field(16, ge=1, description="Test-split prompts for every generator evaluation")
    max_prompt_tokens: int = Field(512, ge=16, description="Longer prompts lose their middle")
    max_new_tokens: int = Field(96, ge=1, description="Length limit of the teacher's text")
    temperature: float = Field(0.0, ge=0, description="Teacher sampling temperature (0: greedy)")
    top_k: int = Field(64, ge=1, description="Teacher tokens kept per position as distillation targets")
    batch_size: int = Field(16, ge=1, description="Prompts generated together (left-padded, KV cache)")
    seed: int = Field(0, description="Seed of the prompt choice and of sampling")
    renamed_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of the train prompts whose skills are renamed to real ones the dataset never "
        "uses (slimserve/data/renaming.py): the student learns to copy a pair's skills, not to recall "
        "the dataset's",
    )
    invented_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of the renamed prompts whose skills get invented names (random syllables, a "
        "fresh set per pair) instead of the renaming list's: names no list holds can only be copied",
    )
    varied_title_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of the train prompts (after renaming) whose member's history titles get a level "
        "and a domain word ('Lead Payments Backend Developer'; data.renaming.varied_titles): trained on the "
        "dataset's two-word titles alone, the student shortened the demo's 'Senior Python Developer'",
    )
    free_prompts: int = Field(
        0,
        ge=0,
        description="Free instructions (career and general questions, data.explanations.general_instructions) "
        "added to the train prompts, answered by the fine-tuned teacher: distilled on explanation prompts "
        "alone, the student answered every free Generate prompt as an explanation ('Weak fit for you...')",
    )
    full_match_copies: int = Field(
        0,
        ge=0,
        le=8,
        description="Extra prompts per full match among the train prompts (the member has every required "
        "skill): renamed copies, listed names and invented names in turn. Without them the student wrote the "
        "partial-match sentence ('but you would need none of ...') for a quarter of the full matches",
    )


class GeneratorStudentSettings(_Strict):
    """The student: the teacher pruned with the scorer's structured pruning (None keeps a dimension)."""

    layers: int | None = Field(10, ge=1, description="Decoder layers kept (by measured importance)")
    mlp_keep: int | None = Field(768, ge=1, description="MLP neurons kept per layer (OSSCAR)")
    heads_per_kv_group: int | None = Field(2, ge=1, description="Query heads kept per KV group")
    calibration_prompts: int = Field(
        32, ge=1, description="Prompts (with the teacher's text) used to calibrate the pruning"
    )
    layer_calibration_tokens: int = Field(
        2048, ge=1, description="Calibration tokens that score whole layers (about L/2 passes over them)"
    )


class OffPolicySettings(_Strict):
    """Stage (a): forward KL to the teacher on the teacher's text."""

    train: TrainConfig = Field(default_factory=lambda: TrainConfig(lr=3e-4, epochs=2, batch_size=8))
    precision: Precision = _precision_field()


class OnPolicySettings(_Strict):
    """Stage (b): forward KL on continuations the student samples itself, mixed with teacher text."""

    share: float = Field(0.5, ge=0, le=1, description="Share of micro-batches sampled by the student")
    temperature: float = Field(0.85, gt=0, description="Student sampling temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="Student nucleus sampling threshold")
    max_new_tokens: int = Field(96, ge=1, description="Length limit of the student's samples")
    rollout_batches: int = Field(
        1,
        ge=1,
        description="On-policy micro-batches whose samples the student draws together, in one batched "
        "generation, before it learns from the first (1: each just before it learns from it)",
    )
    train: TrainConfig = Field(default_factory=lambda: TrainConfig(lr=1e-4, epochs=1, batch_size=8))
    precision: Precision = _precision_field()


class GeneratorEvalSettings(_Strict):
    """Held-out evaluation of every generator stage."""

    sample_temperature: float = Field(
        0.85, gt=0, description="Temperature of the model's own held-out samples (KL on own samples)"
    )
    max_new_tokens: int = Field(96, ge=1, description="Length limit of those samples")
    batch_size: int = Field(4, ge=1, description="Sequences per teacher-forced evaluation batch")
    decode_batch_size: int = Field(
        48,
        ge=1,
        description="Prompts an evaluation decodes together (its explanations of the grounding and the "
        "unseen-skill pairs, its own samples); 48 decodes the cpu recipe's 32 + 16 in one batch",
    )
    speed_tokens: int = Field(32, ge=0, description="Tokens of the greedy decode-speed measurement (0: off)")
    grounding_prompts: int = Field(
        32,
        ge=0,
        description="Test-split pairs each model explains (greedy, max_new_tokens) for the grounding "
        "evaluation: hallucination, coverage, verdict agreement (0: off)",
    )
    unseen_skill_prompts: int = Field(
        0,
        ge=0,
        description="Of those pairs, how many are explained again with their skills renamed to ones no "
        "training prompt uses (data.renaming.HELD_OUT_SKILLS): coverage and hallucination on names the "
        "model must copy, not recall (0: off)",
    )
    full_match_prompts: int = Field(
        0,
        ge=0,
        description="Test-split full matches (the member has every required skill; a seeded draw) the "
        "published graph also explains in its check before publishing: hallucination there, where a gap "
        "claimed counts, a failure the random grounding pairs hold few chances of. Read by that check only: "
        "changing it re-publishes and re-runs no stage (0: off)",
    )


class GeneratorGates(_Strict):
    """Quality gates of the generator (None disables a gate)."""

    max_kl_increase: float | None = Field(
        0.05,
        description="KL on own held-out samples after (a)+(b) may exceed the KL after (a) alone by at "
        "most this (nats/token); negative values demand an improvement",
    )
    min_top1_agreement: float | None = Field(
        None, ge=0, le=1, description="Minimum top-1 agreement with the teacher on its held-out text"
    )
    max_hallucination_rate: float | None = Field(
        0.05,
        ge=0,
        le=1,
        description="Largest share of the held-out explanations of the published graph, as Explain serves it, "
        "that name a skill, company, city or industry of neither the member nor the item, or claim a skill "
        "the member lacks (and the other errors docs/generator-build.md lists)",
    )
    min_coverage: float | None = Field(
        0.85,
        ge=0,
        le=1,
        description="Smallest share of its explanations naming a truly shared skill (pairs that share one)",
    )
    min_verdict_agreement: float | None = Field(
        0.85, ge=0, le=1, description="Smallest share of its explanations whose verdict matches the facts"
    )
    min_decision_agreement: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Smallest share of its Strong/Weak verdicts agreeing with the scoring student's decision "
        "(needs the scorer's stages in the same work directory)",
    )
    min_unseen_coverage: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Smallest coverage of shared skills on the pairs renamed to unseen skills "
        "(evaluation.unseen_skill_prompts)",
    )
    max_unseen_hallucination_rate: float | None = Field(
        None, ge=0, le=1, description="Largest hallucination rate on those renamed pairs"
    )
    max_full_match_hallucination_rate: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Largest hallucination rate of the published graph on the test-split full matches "
        "(evaluation.full_match_prompts, which must then be above 0)",
    )


class GeneratorPublishSettings(GeneratorPublishOptions, _Strict):
    """How the final student is exported and published as the Triton model ``generator``."""

    quantize: Literal["int8", "int4", "none"] = Field(
        "int8", description="Weight-only quantization of the served graph (none: FP32)"
    )
    max_queued_requests: int = Field(64, ge=1, description="Bounded queue (beyond: 'queue full')")


class GeneratorSettings(_Strict):
    """The generator student of ``slimserve build``: grounded teacher fine-tune, teacher text, pruning,
    distillation (a) then (b)."""

    device: Literal["cpu", "cuda", "auto"] = Field(
        "cpu",
        description="Where generation, distillation and evaluation run (auto: cuda when available); "
        "pruning runs on the CPU",
    )

    generation_precision: Precision = Field(
        "fp32",
        description="Decoder weights of every text generation pass (the teacher's answers and text, the "
        "models' held-out samples and explanations, the student's samples in (b)): fp32, bf16 (a BF16 copy "
        "of the decoder, the LM head and the log-probs FP32) or auto (bf16 where the generator's device has "
        "BF16 units, as for the training precisions)",
    )
    finetune: TeacherFinetuneSettings = Field(default_factory=TeacherFinetuneSettings)
    teacher_text: TeacherTextSettings = Field(default_factory=TeacherTextSettings)
    student: GeneratorStudentSettings = Field(default_factory=GeneratorStudentSettings)
    offpolicy: OffPolicySettings = Field(default_factory=OffPolicySettings)
    onpolicy: OnPolicySettings = Field(default_factory=OnPolicySettings)
    evaluation: GeneratorEvalSettings = Field(default_factory=GeneratorEvalSettings)
    gates: GeneratorGates = Field(default_factory=GeneratorGates)
    publish: GeneratorPublishSettings = Field(default_factory=GeneratorPublishSettings)

    @model_validator(mode="after")
    def _full_match_gate_has_pairs(self) -> GeneratorSettings:
        if (
            self.gates.max_full_match_hallucination_rate is not None
            and not self.evaluation.full_match_prompts
        ):
            raise ValueError(
                "generator.gates.max_full_match_hallucination_rate needs generator.evaluation.full_match_prompts "
                "above 0 (the full matches the published graph explains)"
            )
        return self

    def resolved_device(self) -> Literal["cpu", "cuda"]:
        """``device`` on this machine (``auto``: cuda when torch sees a CUDA device)."""
        import torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        return self.device
