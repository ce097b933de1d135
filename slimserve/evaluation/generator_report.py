"""The generator's rows in the build report: held-out loss and KL to the teacher per stage, grounding of
its explanations (``evaluation.grounding``), size, speed."""

from __future__ import annotations

from dataclasses import dataclass, field

from .report import ReportRow, _fmt

# The label ending of the published graph's row (``buildstage.generator_served``).
SERVED_SUFFIX = " as served"


def is_served(stage: str) -> bool:
    """Whether ``stage`` labels the published graph's row (grounding as served, no teacher-forced figures)."""
    return stage.endswith(SERVED_SUFFIX)


@dataclass
class GeneratorRow(ReportRow):
    """Measured figures of one generator stage on held-out prompts (nats per response token)."""

    stage: str
    loss_teacher_text: float  # teacher-forced loss on the teacher's held-out text
    kl_teacher_text: float  # KL(teacher || model) on that text
    top1_agreement: float  # same most likely next token as the teacher, on that text
    kl_own_samples: float = float("nan")  # KL(teacher || model) on the model's own samples
    own_sample_tokens: float = float("nan")  # mean length of those samples
    parameters: int = 0
    embedding_parameters: int = 0
    decode_tokens_per_s: float = float("nan")  # PyTorch, greedy, one stream
    hallucination_rate: float = float("nan")  # held-out explanations naming a foreign term or a false skill
    coverage: float = float("nan")  # of those with a shared skill, the share naming one
    verdict_agreement: float = float("nan")  # verdict = the facts' verdict
    decision_agreement: float = float("nan")  # Strong/Weak verdict = the scoring student's decision
    repetition_rate: float = float("nan")  # held-out explanations stating a sentence twice
    grounding_pairs: int = 0
    unseen_hallucination_rate: float = float("nan")  # the same, on pairs renamed to unseen skills
    unseen_coverage: float = float("nan")
    unseen_pairs: int = 0
    full_match_hallucination_rate: float = float("nan")  # the published graph on test-split full matches
    full_match_pairs: int = 0
    notes: dict = field(default_factory=dict)

    def set_grounding(self, summary, decision_source: str | None = None) -> None:
        """Take the figures of a ``GroundingSummary`` (details in ``notes["grounding"]``)."""
        self.hallucination_rate = summary.hallucination_rate
        self.coverage = summary.coverage
        self.verdict_agreement = summary.verdict_agreement
        self.decision_agreement = summary.decision_agreement
        self.repetition_rate = summary.repetition_rate
        self.grounding_pairs = summary.pairs
        details = {
            k: v
            for k, v in summary.as_dict().items()
            if k in ("coverage_pairs", "decision_pairs", "verdicts")
        }
        self.notes["grounding"] = {**details, "decision_source": decision_source}

    def set_unseen_grounding(self, summary) -> None:
        """Take hallucination and coverage on the pairs renamed to unseen skills."""
        self.unseen_hallucination_rate = summary.hallucination_rate
        self.unseen_coverage = summary.coverage
        self.unseen_pairs = summary.pairs

    def set_full_match_grounding(self, summary) -> None:
        """Take the hallucination rate on the test-split full matches (a gap claimed counts)."""
        self.full_match_hallucination_rate = summary.hallucination_rate
        self.full_match_pairs = summary.pairs

    @classmethod
    def from_dict(cls, data: dict) -> GeneratorRow:
        data = {k: v for k, v in data.items() if k != "non_embedding_parameters"}
        return cls(**{k: (float("nan") if v is None else v) for k, v in data.items()})


def _params(row: GeneratorRow) -> str:
    if not row.parameters:
        return "-"
    return f"{row.parameters / 1e6:.1f}M ({row.non_embedding_parameters / 1e6:.1f}M)"


COLUMNS = (
    ("generator stage", lambda r: r.stage),
    ("loss on teacher text", lambda r: _fmt(r.loss_teacher_text)),
    ("KL to teacher (teacher text)", lambda r: _fmt(r.kl_teacher_text)),
    ("top-1 agreement", lambda r: _fmt(r.top1_agreement)),
    ("KL to teacher (own samples)", lambda r: _fmt(r.kl_own_samples)),
    ("own sample tokens", lambda r: _fmt(r.own_sample_tokens, 1)),
    ("params (non-emb)", _params),
    ("decode tokens/s (PyTorch)", lambda r: _fmt(r.decode_tokens_per_s, 1)),
    ("hallucination", lambda r: _fmt(r.hallucination_rate, 2)),
    ("coverage", lambda r: _fmt(r.coverage, 2)),
    ("verdict = facts", lambda r: _fmt(r.verdict_agreement, 2)),
    ("verdict = scorer", lambda r: _fmt(r.decision_agreement, 2)),
    ("sentence repeated", lambda r: _fmt(r.repetition_rate, 2)),
    ("unseen skills: hallucination", lambda r: _fmt(r.unseen_hallucination_rate, 2)),
    ("unseen skills: coverage", lambda r: _fmt(r.unseen_coverage, 2)),
    ("full matches: hallucination", lambda r: _fmt(r.full_match_hallucination_rate, 2)),
)


def generator_table(rows: list[GeneratorRow]) -> str:
    """The generator's stage table (markdown)."""
    lines = ["| " + " | ".join(name for name, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r) for _, cell in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)
