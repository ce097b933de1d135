"""The multi-item graph's gates against its single-sequence reference (``gates.multi_item_spearman``,
``gates.multi_item_auc_gap``): the CPU build's INT8 stage and the TensorRT stage apply the same check."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .metrics import auc, spearman


def multi_item_gate(
    reference: Sequence[float],
    candidate: Sequence[float],
    labels: Sequence[float],
    min_spearman: float,
    max_auc_gap: float | None,
) -> tuple[dict[str, float], list[str]]:
    """Scores ``candidate`` (a multi-item graph or engine) against ``reference`` (the single-sequence
    graph, or the ONNX graph an engine was built from) on test ``labels``: (measures, failed checks).
    Non-finite candidate scores fail both checks; ``min_spearman`` 0 and ``max_auc_gap`` None turn a
    check off."""
    ref = np.asarray(reference, dtype=np.float64).ravel()
    cand = np.asarray(candidate, dtype=np.float64).ravel()
    measures = {"spearman": float("nan"), "reference_auc": auc(labels, ref), "candidate_auc": float("nan")}
    finite = bool(np.all(np.isfinite(cand)))
    if finite:
        measures.update(spearman=spearman(ref, cand), candidate_auc=auc(labels, cand))
    measures["auc_gap"] = abs(measures["candidate_auc"] - measures["reference_auc"])
    failures = []
    if min_spearman > 0 and not measures["spearman"] >= min_spearman:
        failures.append(f"multi-item spearman {measures['spearman']:.4f} < {min_spearman:.4f}")
    if max_auc_gap is not None and not measures["auc_gap"] <= max_auc_gap:
        failures.append(f"multi-item test AUC gap {measures['auc_gap']:.4f} > {max_auc_gap:.4f}")
    return measures, failures
