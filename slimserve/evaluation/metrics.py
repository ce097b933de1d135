"""Quality metrics on held-out data: AUC, log loss, NDCG@k per member, agreement with a teacher.

Pure numpy; ties are handled exactly (average ranks), so results match scikit-learn's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of ``values`` with ties given their average rank."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=np.float64)
    sorted_values = values[order]
    boundaries = np.flatnonzero(np.diff(sorted_values)) + 1
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [len(values)]))
    for start, end in zip(starts, ends, strict=True):
        ranks[order[start:end]] = (start + end + 1) / 2.0
    return ranks


def auc(labels: Sequence[float], scores: Sequence[float]) -> float:
    """Area under the ROC curve (Mann-Whitney); NaN when only one class is present."""
    labels = np.asarray(labels, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    positives = labels > 0.5
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = average_ranks(scores)
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function."""
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(logits, dtype=np.float64)))


def log_loss(labels: Sequence[float], logits: Sequence[float]) -> float:
    """Mean binary cross-entropy of labels (0/1, or soft in [0, 1]) under ``sigmoid(logits)``."""
    y = np.asarray(labels, dtype=np.float64)
    z = np.asarray(logits, dtype=np.float64)
    # log(1 + exp(-|z|)) form avoids overflow; equals -[y log p + (1-y) log(1-p)]
    return float(np.mean(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))))


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (Pearson correlation of average ranks)."""
    ra, rb = average_ranks(np.asarray(a)), average_ranks(np.asarray(b))
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def ndcg_at_k(labels: Sequence[float], scores: Sequence[float], k: int = 10) -> float:
    """NDCG@k of one ranked list (binary or graded gains); NaN when there is no positive."""
    labels = np.asarray(labels, dtype=np.float64)
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")[:k]
    discounts = 1 / np.log2(np.arange(2, k + 2))
    dcg = float((labels[order] * discounts[: len(order)]).sum())
    ideal = np.sort(labels)[::-1][:k]
    idcg = float((ideal * discounts[: len(ideal)]).sum())
    return dcg / idcg if idcg > 0 else float("nan")


def mean_ndcg_per_member(
    member_ids: Sequence[str], labels: Sequence[float], scores: Sequence[float], k: int = 10
) -> float:
    """NDCG@k averaged over members that have at least one positive."""
    groups: dict[str, list[int]] = defaultdict(list)
    for index, member in enumerate(member_ids):
        groups[member].append(index)
    labels, scores = np.asarray(labels), np.asarray(scores)
    values = [ndcg_at_k(labels[idx], scores[idx], k) for idx in groups.values()]
    values = [v for v in values if not np.isnan(v)]
    return float(np.mean(values)) if values else float("nan")
