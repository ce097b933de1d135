"""The scorers' generated batcher configs keep Triton 2.51's payload prefetching on (docs/bench.md, "Tail
latency"): any queue policy (a bound, a default timeout, a timeout override, priorities) turns it off,
and a request that arrives while the instance is busy then waits for the batcher's 500 ms idle timeout.
No speed is asserted here; the stall is measured by the benchmarks."""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace

import pytest

from slimserve.export.scorer_model import (
    multi_item_scorer_triton_spec,
    scorer_batching,
    scorer_triton_spec,
)
from slimserve.export.triton_config import (
    DynamicBatchingSpec,
    batcher_prefetches,
    parse_config_pbtxt,
    render_config_pbtxt,
)


def _queue_policy(spec):
    cfg = parse_config_pbtxt(render_config_pbtxt(spec))
    assert cfg.HasField("dynamic_batching")
    return cfg.dynamic_batching


def _assert_prefetching(spec):
    batching = _queue_policy(spec)
    policy = batching.default_queue_policy
    # Triton 2.51 (core r24.10, PriorityQueue) prefetches only with all of these at their zero values.
    assert batching.priority_levels == 0
    assert policy.default_timeout_microseconds == 0
    assert policy.allow_timeout_override is False
    assert policy.max_queue_size == 0
    assert batcher_prefetches(spec.dynamic_batching)


def _bundle(multi_item):
    return SimpleNamespace(
        multi_item=multi_item,
        max_batch_size=8,
        length_buckets=(64, 192),
        item_length_buckets=(32, 64),
    )


@pytest.mark.parametrize("multi_item", [False, True])
def test_export_defaults_render_a_prefetching_batcher(multi_item):
    from slimserve.export.pipeline import ScorerExportConfig, scorer_spec

    config = ScorerExportConfig()
    assert (config.max_queue_size, config.default_timeout_us) == (0, 0)
    _assert_prefetching(scorer_spec(config, _bundle(multi_item), {}))


@pytest.mark.parametrize("multi_item", [False, True])
def test_build_publish_defaults_render_a_prefetching_batcher(multi_item):
    from slimserve.buildstage.recipe import PublishSettings
    from slimserve.export.pipeline import scorer_spec

    settings = PublishSettings()
    assert (settings.max_queue_size, settings.default_timeout_us) == (0, 0)
    _assert_prefetching(scorer_spec(settings, _bundle(multi_item), {}))


def test_bench_layout_publish_defaults_have_no_queue_policy():
    from slimserve.bench.layouts import _Publish

    publish = _Publish(model_name="scorer")
    assert (publish.max_queue_size, publish.default_timeout_us) == (0, 0)


def test_spec_function_defaults_render_a_prefetching_batcher():
    _assert_prefetching(scorer_triton_spec("scorer", 64, (96, 192)))
    _assert_prefetching(multi_item_scorer_triton_spec("scorer", 8, (32, 64)))


def test_timeout_override_follows_the_default_timeout_unless_given():
    with_timeout = scorer_triton_spec("scorer", 8, (32,), default_timeout_us=100_000)
    assert _queue_policy(with_timeout).default_queue_policy.allow_timeout_override is True
    explicit = dataclasses.replace(
        with_timeout,
        dynamic_batching=dataclasses.replace(with_timeout.dynamic_batching, allow_timeout_override=False),
    )
    assert _queue_policy(explicit).default_queue_policy.allow_timeout_override is False


@pytest.mark.parametrize(
    "changes",
    [
        {"max_queue_size": 1024},
        {"default_timeout_us": 30_000_000},
        {"allow_timeout_override": True},
        {"priority_levels": 2},
    ],
)
def test_any_queue_policy_turns_prefetching_off(changes):
    assert batcher_prefetches(DynamicBatchingSpec(max_queue_delay_us=200))
    assert not batcher_prefetches(DynamicBatchingSpec(max_queue_delay_us=200, **changes))


def test_scorer_batching_warns_about_a_queue_policy(caplog):
    with caplog.at_level(logging.WARNING, logger="slimserve.export.scorer_model"):
        scorer_batching(200, 0, 0)
        assert not caplog.records
        scorer_batching(200, 1024, 30_000_000)
    assert "500 ms" in caplog.text
