"""Per-stage quality and size report of a build: one row per stage, as JSON and as a markdown table."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from .metrics import auc, log_loss, mean_ndcg_per_member, spearman


class ReportRow:
    """What every stage-table row (a dataclass with ``parameters`` and ``embedding_parameters``) shares:
    the parameter split and a JSON-ready dict (NaN -> None)."""

    @property
    def non_embedding_parameters(self) -> int:
        return self.parameters - self.embedding_parameters

    def as_dict(self) -> dict:
        data = asdict(self)
        data["non_embedding_parameters"] = self.non_embedding_parameters
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in data.items()}


@dataclass
class StageRow(ReportRow):
    """Measured figures of one stage's model."""

    stage: str
    test_auc: float
    ndcg_at_10: float
    log_loss: float
    teacher_agreement_auc: float = float("nan")
    teacher_spearman: float = float("nan")
    retention: float = float("nan")
    parameters: int = 0
    embedding_parameters: int = 0
    file_mb: float = float("nan")
    items_per_s_batch32: float = float("nan")
    single_item_ms: float = float("nan")
    notes: dict = field(default_factory=dict)


def quality_row(
    stage: str,
    margins: np.ndarray,
    labels: np.ndarray,
    member_ids: list[str],
    teacher_margins: np.ndarray | None = None,
) -> StageRow:
    """Quality of scores (``margins`` = logit(yes) - logit(no)) on labelled held-out data."""
    row = StageRow(
        stage=stage,
        test_auc=auc(labels, margins),
        ndcg_at_10=mean_ndcg_per_member(member_ids, labels, margins, k=10),
        log_loss=log_loss(labels, margins),
    )
    if teacher_margins is not None:
        teacher_top = (teacher_margins > np.median(teacher_margins)).astype(np.float64)
        row.teacher_agreement_auc = auc(teacher_top, margins)
        row.teacher_spearman = spearman(teacher_margins, margins)
    return row


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return f"{value:,}"


def markdown_table(rows: list[StageRow]) -> str:
    """The stage table (quality, agreement with the teacher, size, speed)."""
    header = (
        "| stage | test AUC | retention | NDCG@10 | log loss | teacher AUC | teacher rank corr | "
        "params (non-emb) | file MB | items/s @32 | 1-item ms |"
    )
    lines = [header, "|" + "---|" * 11]
    for r in rows:
        params = (
            f"{r.parameters / 1e6:.1f}M ({r.non_embedding_parameters / 1e6:.1f}M)" if r.parameters else "-"
        )
        lines.append(
            f"| {r.stage} | {_fmt(r.test_auc)} | {_fmt(r.retention)} | {_fmt(r.ndcg_at_10)} | "
            f"{_fmt(r.log_loss)} | {_fmt(r.teacher_agreement_auc)} | {_fmt(r.teacher_spearman)} | {params} | "
            f"{_fmt(r.file_mb, 1)} | {_fmt(r.items_per_s_batch32, 1)} | {_fmt(r.single_item_ms, 1)} |"
        )
    return "\n".join(lines)
