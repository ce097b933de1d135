"""`slimserve up` and `bench compare`/`report`: flags derived from their typed configs, the flag names
users type, and defaults taken from the service configs and the bench settings (nothing repeated)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slimserve.bench.config import CompareConfig, CompareSettings, LayoutSettings
from slimserve.cli import build_parser
from slimserve.serving.reasoning.config import ReasoningServiceConfig
from slimserve.serving.scoring.config import ScoringServiceConfig
from slimserve.settings import ConfigError, config_from_args
from slimserve.up_config import UpConfig


def _flags(*command: str) -> set[str]:
    """The option strings of a subcommand's parser."""
    parser = build_parser()
    for name in command:
        action = next(a for a in parser._actions if a.dest in ("command", "bench"))
        parser = action.choices[name]
    return {option for action in parser._actions for option in action.option_strings}


@pytest.mark.parametrize(("command", "model"), [(("up",), UpConfig), (("bench", "compare"), CompareConfig)])
def test_every_field_is_a_flag(command, model):
    flags = _flags(*command)
    for name in model.model_fields:
        assert "--" + name.replace("_", "-") in flags, name
    for name, info in model.model_fields.items():
        assert info.description, name


def test_up_flags_come_from_the_config():
    args = build_parser().parse_args(
        ["up", "--teacher-only", "--no-generator", "--no-sample", "--grpc-port", "8101", "--http-port", "8100",
         "--triton-metrics-port", "8102", "--startup-timeout", "5", "--port", "0", "--exit-after-sample"]
    )  # fmt: skip
    config = config_from_args(UpConfig, args, environ={})
    assert (config.teacher_only, config.generator, config.sample, config.exit_after_sample) == (
        True,
        False,
        False,
        True,
    )
    assert (config.grpc_port, config.http_port, config.triton_metrics_port) == (8101, 8100, 8102)
    assert config.startup_timeout_s == 5.0 and config.port == 0
    triton = config.triton_config(("scorer",), Path("repo"))
    assert (triton.grpc_port, triton.http_port, triton.metrics_port, triton.startup_timeout_s) == (
        8101,
        8100,
        8102,
        5.0,
    )
    assert triton.model_control_mode == "explicit" and triton.load_models == ("scorer",)


def test_up_defaults_are_the_services():
    up, scoring, reasoning = UpConfig(), ScoringServiceConfig(), ReasoningServiceConfig()
    assert (up.host, up.port, up.metrics_port) == (scoring.host, scoring.port, scoring.metrics_port)
    assert (up.model_repository, up.model_name) == (scoring.model_repository, scoring.model_name)
    assert (up.reasoning_port, up.reasoning_metrics_port, up.generator_name) == (
        reasoning.port,
        reasoning.metrics_port,
        reasoning.model_name,
    )
    served = up.scoring_config("127.0.0.1:8001", Path("bundle"))
    assert (served.port, served.metrics_port, served.bundle_dir) == (up.port, up.metrics_port, Path("bundle"))
    explained = up.reasoning_config("127.0.0.1:8001", Path("gen"))
    assert (explained.port, explained.metrics_port) == (up.reasoning_port, up.reasoning_metrics_port)
    with pytest.raises(ConfigError, match="metrics_port"):
        config_from_args(UpConfig, build_parser().parse_args(["up", "--metrics-port", "-2"]), environ={})


@pytest.mark.parametrize("command", ["compare", "report"])
def test_compare_flags_come_from_the_config(command):
    args = build_parser().parse_args(
        ["bench", command, "--variant", "a=a.onnx", "--variant", "b=b.onnx@tiny", "--concurrency", "1,4",
         "--delays-us", "0", "--perf-concurrency", "2", "--no-pytorch", "--no-layouts", "--requests", "6",
         "--layout-candidates", "1, 10", "--max-seconds", "1.5"]
    )  # fmt: skip
    config = config_from_args(CompareConfig, args, environ={})
    assert config.variant == ["a=a.onnx", "b=b.onnx@tiny"]
    assert (config.requests, config.layouts, config.layout_candidates) == (6, False, (1, 10))
    settings = config.settings()
    assert (settings.concurrencies, settings.delays_us, settings.perf_concurrencies) == ((1, 4), (0,), (2,))
    assert settings.pytorch is False and settings.max_seconds == 1.5
    assert config.layout_settings() == LayoutSettings(candidates=(1, 10), max_seconds=1.5)


def test_compare_defaults_are_the_bench_settings():
    config = CompareConfig()
    assert config.settings() == CompareSettings()
    assert config.layout_candidates == LayoutSettings().candidates
    assert (config.model_repository, config.model_name) == (
        ScoringServiceConfig().model_repository,
        ScoringServiceConfig().model_name,
    )
    assert CompareConfig(concurrency="").concurrency == ()  # `--concurrency ''`: no closed-loop level
    for bad in ({"concurrency": "0,4"}, {"delays_us": "-1"}):
        with pytest.raises(ValueError):
            CompareConfig(**bad)
