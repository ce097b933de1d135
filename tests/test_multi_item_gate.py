"""The multi-item gate that the INT8 stage and the TensorRT stage share."""

from __future__ import annotations

import numpy as np

from slimserve.evaluation.multi_item_gate import multi_item_gate


def _scores(seed: int = 0, size: int = 400):
    rng = np.random.default_rng(seed)
    reference = rng.normal(size=size)
    labels = (reference + rng.normal(scale=0.8, size=size) > 0).astype(float)
    return rng, reference, labels


def test_a_candidate_that_keeps_the_ranking_passes():
    rng, reference, labels = _scores()
    measures, failures = multi_item_gate(
        reference, reference + rng.normal(scale=1e-4, size=400), labels, 0.99, 0.002
    )
    assert failures == [] and measures["spearman"] > 0.999 and measures["auc_gap"] < 0.002


def test_each_missed_gate_is_named_and_non_finite_scores_fail_both():
    rng, reference, labels = _scores(1)
    noisy = reference + rng.normal(scale=0.7, size=400)
    measures, failures = multi_item_gate(reference, noisy, labels, 0.99, 0.002)
    assert measures["spearman"] < 0.99 and measures["auc_gap"] > 0.002
    assert [f.split(" ")[1] for f in failures] == ["spearman", "test"]
    noisy[5] = np.nan
    measures, failures = multi_item_gate(reference, noisy, labels, 0.99, 0.002)
    assert len(failures) == 2 and np.isnan(measures["spearman"]) and np.isnan(measures["auc_gap"])


def test_zero_spearman_and_no_auc_gap_turn_the_checks_off():
    _, reference, labels = _scores(2)
    measures, failures = multi_item_gate(reference, -reference, labels, 0.0, None)
    assert failures == [] and measures["spearman"] < -0.99
