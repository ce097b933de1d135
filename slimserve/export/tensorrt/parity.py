"""The parity gate of an engine: its scores against the ONNX graph's on the same held-out prompts.

Quantized engines move every score a little, so ``allclose`` alone says little; what the service needs is
the same ranking. The gate measures score correlation (Pearson, Spearman), the share of each member's
candidate pairs ordered the same way, and the overlap of each member's top-k, and reports the largest
score difference (a bound only when the recipe sets one).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from ...errors import BuildError
from ...evaluation.metrics import spearman
from ..parity import swapped_pairs
from .settings import ParityThresholds


@dataclass
class EngineParityReport:
    """Agreement of candidate (engine) scores with reference (ONNX) scores, and the verdict."""

    prompts: int
    groups: int
    pearson: float
    spearman: float
    pairwise_agreement: float
    topk_overlap: float
    max_abs_diff: float
    mean_abs_diff: float
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def as_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    if a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def _grouped(groups: Sequence[str] | None, n: int) -> list[np.ndarray]:
    if groups is None:
        return [np.arange(n)]
    if len(groups) != n:
        raise ValueError(f"groups has {len(groups)} entries for {n} scores")
    by_group: dict[str, list[int]] = defaultdict(list)
    for index, group in enumerate(groups):
        by_group[group].append(index)
    return [np.asarray(v) for v in by_group.values()]


def pairwise_agreement(
    reference: np.ndarray, candidate: np.ndarray, groups: Sequence[str] | None, tie_tolerance: float = 0.0
) -> float:
    """Share of within-group pairs the candidate orders as the reference does (reference ties skipped)."""
    agreed = total = 0
    for index in _grouped(groups, len(reference)):
        ref = reference[index]
        gaps = np.abs(ref[:, None] - ref[None, :])
        pairs = int(np.triu(gaps > tie_tolerance, k=1).sum())
        total += pairs
        agreed += pairs - swapped_pairs(ref, candidate[index], tie_tolerance)
    return agreed / total if total else float("nan")


def topk_overlap(reference: np.ndarray, candidate: np.ndarray, groups: Sequence[str] | None, k: int) -> float:
    """Mean over groups of |top-k(reference) ∩ top-k(candidate)| / min(k, group size)."""
    overlaps = []
    for index in _grouped(groups, len(reference)):
        size = min(k, len(index))
        top_ref = set(index[np.argsort(-reference[index], kind="stable")[:size]])
        top_cand = set(index[np.argsort(-candidate[index], kind="stable")[:size]])
        overlaps.append(len(top_ref & top_cand) / size)
    return float(np.mean(overlaps)) if overlaps else float("nan")


def engine_parity(
    reference: Sequence[float],
    candidate: Sequence[float],
    thresholds: ParityThresholds,
    groups: Sequence[str] | None = None,
) -> EngineParityReport:
    """Measure agreement and list every threshold the candidate misses (NaN counts as a miss)."""
    ref = np.asarray(reference, dtype=np.float64).ravel()
    cand = np.asarray(candidate, dtype=np.float64).ravel()
    if ref.shape != cand.shape or ref.size < 2:
        raise ValueError(
            f"parity needs two score vectors of the same length >= 2, got {ref.shape}, {cand.shape}"
        )
    if not np.all(np.isfinite(cand)):
        bad = int((~np.isfinite(cand)).sum())
        report = EngineParityReport(len(ref), 0, *(float("nan"),) * 4, float("inf"), float("inf"))
        report.failures.append(f"{bad} candidate scores are not finite")
        return report
    diff = np.abs(ref - cand)
    report = EngineParityReport(
        prompts=len(ref),
        groups=len(_grouped(groups, len(ref))),
        pearson=_pearson(ref, cand),
        spearman=spearman(ref, cand),
        pairwise_agreement=pairwise_agreement(ref, cand, groups),
        topk_overlap=topk_overlap(ref, cand, groups, thresholds.top_k),
        max_abs_diff=float(diff.max()),
        mean_abs_diff=float(diff.mean()),
    )
    checks = (
        ("pearson", report.pearson, thresholds.min_pearson),
        ("spearman", report.spearman, thresholds.min_spearman),
        ("pairwise_agreement", report.pairwise_agreement, thresholds.min_pairwise_agreement),
        ("topk_overlap", report.topk_overlap, thresholds.min_topk_overlap),
    )
    for name, value, minimum in checks:
        if minimum > 0 and not value >= minimum:
            report.failures.append(f"{name} {value:.4f} < {minimum:.4f}")
    if thresholds.max_abs_diff is not None and not report.max_abs_diff <= thresholds.max_abs_diff:
        report.failures.append(f"max_abs_diff {report.max_abs_diff:.4g} > {thresholds.max_abs_diff:.4g}")
    return report


def require_parity(report: EngineParityReport, what: str) -> None:
    """Raise ``BuildError`` naming every failed check."""
    if not report.passed:
        raise BuildError(
            f"parity gate failed for {what} on {report.prompts} held-out prompts: "
            + "; ".join(report.failures)
            + "; nothing was published"
        )


def onnx_reference_scores(
    onnx_path, sequences: Sequence[Sequence[int]], buckets, provider: str = "cpu"
) -> np.ndarray:
    """Scores of the ONNX graph in ONNX Runtime (CUDA when asked and available), bucket-padded batches."""
    import onnxruntime as ort

    from ...models.batching import padded_batches

    providers = ["CPUExecutionProvider"]
    if provider == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, "CUDAExecutionProvider")
    session = ort.InferenceSession(str(onnx_path), providers=providers)
    out = np.zeros(len(sequences), dtype=np.float64)
    for chunk, ids, mask in padded_batches([list(s) for s in sequences], buckets, batch_size=32):
        out[chunk] = session.run(None, {"input_ids": ids, "attention_mask": mask})[0].ravel()
    return out
