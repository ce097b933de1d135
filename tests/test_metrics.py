"""Metrics against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from slimserve.evaluation.metrics import (
    auc,
    average_ranks,
    log_loss,
    mean_ndcg_per_member,
    ndcg_at_k,
    sigmoid,
    spearman,
)


def test_average_ranks_with_ties():
    assert average_ranks(np.array([10, 20, 20, 5])).tolist() == [2.0, 3.5, 3.5, 1.0]


def test_auc_known_values():
    assert auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    assert auc([1, 0], [0.5, 0.5]) == pytest.approx(0.5)  # a tie counts half
    assert auc([0, 1, 1], [3, 2, 1]) == 0.0
    assert math.isnan(auc([1, 1], [0.2, 0.3]))


def test_log_loss_and_sigmoid():
    assert log_loss([1, 0], [0.0, 0.0]) == pytest.approx(math.log(2))
    assert log_loss([1], [100.0]) == pytest.approx(0.0, abs=1e-12)
    assert np.isfinite(log_loss([0], [1000.0]))
    assert sigmoid(np.array([0.0, 1000.0, -1000.0])).tolist() == [0.5, 1.0, 0.0]


def test_ndcg():
    assert ndcg_at_k([1, 0, 0], [3, 2, 1]) == pytest.approx(1.0)
    assert ndcg_at_k([0, 1], [2, 1]) == pytest.approx(1 / math.log2(3))
    assert math.isnan(ndcg_at_k([0, 0], [1, 2]))
    value = mean_ndcg_per_member(["a", "a", "b", "b", "c"], [1, 0, 0, 1, 0], [2, 1, 2, 1, 5])
    assert value == pytest.approx((1.0 + 1 / math.log2(3)) / 2)  # member c has no positive: skipped


def test_spearman():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
