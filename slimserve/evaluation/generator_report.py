"""The generator's rows in the build report: held-out loss and KL to the teacher per stage, size, speed."""

from __future__ import annotations

from dataclasses import dataclass, field

from .report import ReportRow, _fmt


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
    notes: dict = field(default_factory=dict)

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
)


def generator_table(rows: list[GeneratorRow]) -> str:
    """The generator's stage table (markdown)."""
    lines = ["| " + " | ".join(name for name, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r) for _, cell in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)
