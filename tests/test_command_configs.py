"""`slimserve up`, `triton` and the `bench` commands: flags derived from their typed configs, the flag
names users type, and defaults taken from the service configs and the bench settings (nothing repeated)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slimserve.bench.config import (
    CompareConfig,
    CompareSettings,
    GeneratorsBenchConfig,
    GrpcBenchConfig,
    LatencyBenchConfig,
    LayoutsConfig,
    LayoutSettings,
    TritonBenchConfig,
)
from slimserve.bench.grpc_load import LoadPlan
from slimserve.bench.perf_analyzer import PerfSettings
from slimserve.cli import build_parser, run_handler
from slimserve.errors import UserError
from slimserve.serving.reasoning.config import ReasoningServiceConfig
from slimserve.serving.scoring.config import ScoringServiceConfig
from slimserve.settings import ConfigError, config_from_args
from slimserve.triton_config import TritonConfig
from slimserve.up_config import UpConfig

COMMANDS = {
    ("up",): UpConfig,
    ("triton",): TritonConfig,
    ("bench", "compare"): CompareConfig,
    ("bench", "report"): CompareConfig,
    ("bench", "latency"): LatencyBenchConfig,
    ("bench", "triton"): TritonBenchConfig,
    ("bench", "grpc"): GrpcBenchConfig,
    ("bench", "layouts"): LayoutsConfig,
    ("bench", "generators"): GeneratorsBenchConfig,
}
REPOSITORY = Path("model_repository")
# The defaults these commands had when their flags were listed by hand (README.md and docs/ use them).
HAND_LISTED_DEFAULTS = {
    ("triton",): {
        "model_repository": REPOSITORY, "host": "127.0.0.1", "grpc_port": 8001, "http_port": 8000,
        "metrics_port": 8002, "startup_timeout": 300.0, "grpc_server_cert": None, "grpc_server_key": None,
        "grpc_root_cert": None,
    },
    ("bench", "latency"): {"target": "127.0.0.1:50051", "candidates": (1, 50), "requests": 100, "warmup": 5},
    ("bench", "triton"): {
        "model_repository": REPOSITORY, "triton_url": None, "triton_tls": False, "triton_tls_ca_file": None,
        "triton_tls_cert_file": None, "triton_tls_key_file": None, "models": (), "bundle_model": "scorer",
        "concurrency": (1, 2, 4, 8, 16), "request_rate": (), "buckets": (), "window_requests": 100,
        "max_trials": 3, "stability": 1000.0, "batch_size": 1, "max_tokens": 32, "dataset": None,
        "requests": 64, "candidates": 8,
    },
    ("bench", "grpc"): {
        "target": "127.0.0.1:50051", "method": "Score", "concurrency": (1, 4, 16), "rate": (),
        "max_requests": 500, "max_seconds": 10.0, "warmup": 8, "timeout": 30.0, "max_tokens": 32,
        "dataset": None, "requests": 64, "candidates": 8,
    },
    ("bench", "layouts"): {
        "build_dir": None, "model_repository": REPOSITORY, "model_name": "scorer",
        "candidates": (1, 10, 50, 200), "concurrency": (1, 2, 4), "requests": 16, "floor_seconds": 4.0,
        "max_requests": 200, "max_seconds": 8.0, "dataset": None,
    },
    ("bench", "generators"): {
        "model_repository": REPOSITORY, "teacher": "default", "teacher_repository": None,
        "teacher_precision": None, "streams": (1, 8), "max_tokens": 64, "max_requests": 48,
        "max_seconds": 60.0, "warmup": 2, "timeout": 300.0, "dataset": None, "requests": 64,
    },
}  # fmt: skip


def _flags(*command: str) -> set[str]:
    """The option strings of a subcommand's parser."""
    parser = build_parser()
    for name in command:
        action = next(a for a in parser._actions if a.dest in ("command", "bench"))
        parser = action.choices[name]
    return {option for action in parser._actions for option in action.option_strings}


def _config(*argv: str):
    """The config a command line resolves to (no environment), through its command's model."""
    command = tuple(word for word in argv[:2] if not word.startswith("-"))
    model = COMMANDS.get(command) or COMMANDS[command[:1]]
    return config_from_args(model, build_parser().parse_args(list(argv)), environ={})


@pytest.mark.parametrize(("command", "model"), COMMANDS.items())
def test_every_field_is_a_flag(command, model):
    flags = _flags(*command)
    assert "--config" in flags
    for name in model.model_fields:
        assert "--" + name.replace("_", "-") in flags, name
    for name, info in model.model_fields.items():
        assert info.description, name


@pytest.mark.parametrize("command", HAND_LISTED_DEFAULTS)
def test_defaults_are_the_hand_listed_ones(command):
    expected = HAND_LISTED_DEFAULTS[command]
    assert set(expected) == set(COMMANDS[command].model_fields)
    assert _config(*command).model_dump() == expected


def test_bench_defaults_are_the_bench_settings():
    assert TritonBenchConfig().perf_settings() == PerfSettings()
    assert GrpcBenchConfig().load_plan() == LoadPlan()
    assert LayoutsConfig().settings() == LayoutSettings()
    generators = GeneratorsBenchConfig().load_plan()
    assert (generators.concurrencies, generators.warmup_requests, generators.timeout_s) == ((1, 8), 2, 300.0)


def test_bench_flags_come_from_the_config():
    """The command lines of README.md and docs/bench.md, and comma-separated levels as users type them."""
    grpc = _config("bench", "grpc", "--concurrency", "", "--rate", "0.72", "--candidates", "10",
                   "--max-seconds", "40", "--method", "Explain", "--warmup", "0", "--timeout", "1")  # fmt: skip
    assert (grpc.concurrency, grpc.rate, grpc.candidates, grpc.method) == ((), (0.72,), 10, "Explain")
    plan = grpc.load_plan()
    assert (plan.concurrencies, plan.rates, plan.max_seconds, plan.warmup_requests, plan.timeout_s) == (
        (), (0.72,), 40.0, 0, 1.0,
    )  # fmt: skip
    triton = _config("bench", "triton", "--models", "scorer,,generator", "--concurrency", "1, 4,16",
                     "--request-rate", "5,10", "--buckets", "64", "--window-requests", "200",
                     "--max-trials", "4", "--stability", "10", "--batch-size", "2")  # fmt: skip
    assert (triton.models, triton.concurrency, triton.request_rate, triton.buckets) == (
        ("scorer", "generator"), (1, 4, 16), (5.0, 10.0), (64,),
    )  # fmt: skip
    assert triton.perf_settings() == PerfSettings(200, 4, 10.0, 2)
    assert _config("bench", "triton", "--models", "yes").models == ("yes",)  # text, not YAML
    layouts = _config("bench", "layouts", "--build-dir", "build_output/cpu", "--candidates", "1,10",
                      "--concurrency", "2", "--requests", "3", "--floor-seconds", "1",
                      "--max-requests", "5", "--max-seconds", "2")  # fmt: skip
    assert layouts.build_dir == Path("build_output/cpu")
    assert layouts.settings() == LayoutSettings(
        candidates=(1, 10), concurrencies=(2,), requests=3, floor_seconds=1.0, max_requests=5, max_seconds=2.0
    )
    generators = _config("bench", "generators", "--teacher", "tiny", "--teacher-precision", "fp32",
                         "--streams", "1,3", "--max-tokens", "6", "--max-requests", "6")  # fmt: skip
    assert (generators.teacher, generators.teacher_precision, generators.max_tokens) == ("tiny", "fp32", 6)
    assert (generators.load_plan().concurrencies, generators.load_plan().max_requests) == ((1, 3), 6)


def test_bench_settings_from_a_file_and_the_environment(tmp_path):
    """defaults < --config file < SLIMSERVE_BENCH_<COMMAND>_* < flags, as for every other command."""
    file = tmp_path / "layouts.yaml"
    file.write_text("build_dir: build_output/cpu\ncandidates: [1, 50]\nconcurrency: 1,2\nrequests: 4\n")
    args = build_parser().parse_args(["bench", "layouts", "--config", str(file), "--requests", "5"])
    environ = {"SLIMSERVE_BENCH_LAYOUTS_CONCURRENCY": "4", "SLIMSERVE_BENCH_LAYOUTS_REQUESTS": "9"}
    config = config_from_args(LayoutsConfig, args, args.config, environ=environ)
    assert (config.build_dir, config.candidates, config.concurrency, config.requests) == (
        Path("build_output/cpu"), (1, 50), (4,), 5,
    )  # fmt: skip
    environ = {"SLIMSERVE_BENCH_GRPC_RATE": "2,4", "SLIMSERVE_BENCH_GRPC_METHOD": "Explain"}
    grpc = config_from_args(GrpcBenchConfig, build_parser().parse_args(["bench", "grpc"]), environ=environ)
    assert (grpc.rate, grpc.method) == ((2.0, 4.0), "Explain")
    environ = {"SLIMSERVE_TRITON_GRPC_PORT": "9001"}
    triton = config_from_args(TritonConfig, build_parser().parse_args(["triton"]), environ=environ)
    assert triton.grpc_port == 9001


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["bench", "latency", "--candidates", "1,0"], "candidates"),
        (["bench", "grpc", "--concurrency", "0,4"], "concurrency"),
        (["bench", "grpc", "--rate", "-1"], "rate"),
        (["bench", "grpc", "--method", "Generate"], "method"),
        (["bench", "grpc", "--max-requests", "many"], "max_requests"),
        (["bench", "triton", "--max-trials", "2"], "max_trials"),
        (["bench", "triton", "--buckets", "64,x"], "buckets"),
        (["bench", "layouts", "--build-dir", "b", "--floor-seconds", "0"], "floor_seconds"),
        (["bench", "generators", "--max-tokens", "0"], "max_tokens"),
        (["bench", "generators", "--teacher-precision", "fp16"], "teacher_precision"),
        (["bench", "generators", "--teacher", "tiny", "--teacher-repository", "r"], "teacher_repository"),
        (["triton", "--grpc-port", "70000"], "grpc_port"),
        (["triton", "--startup-timeout", "0"], "startup_timeout"),
    ],
)
def test_bad_values_exit_1_naming_the_field(argv, field, capsys):
    assert run_handler(build_parser().parse_args(argv)) == 1
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err, err


def test_bench_layouts_needs_a_build_dir(capsys):
    assert run_handler(build_parser().parse_args(["bench", "layouts"])) == 1
    assert "--build-dir" in capsys.readouterr().err


def test_triton_settings_are_the_launchers(tmp_path):
    config = _config("triton", "--model-repository", str(tmp_path), "--host", "0.0.0.0", "--grpc-port", "0",
                     "--http-port", "9000", "--metrics-port", "9002", "--startup-timeout", "5")  # fmt: skip
    server = config.server_config()
    assert (server.model_repository, server.host, server.grpc_tls) == (tmp_path.resolve(), "0.0.0.0", None)
    assert (server.grpc_port, server.http_port, server.metrics_port, server.startup_timeout_s) == (
        0, 9000, 9002, 5.0,
    )  # fmt: skip
    cert, key, ca = (tmp_path / name for name in ("cert.pem", "key.pem", "ca.pem"))
    tls = TritonConfig(
        model_repository=tmp_path, grpc_server_cert=cert, grpc_server_key=key, grpc_root_cert=ca
    )
    assert tls.server_config().grpc_tls.args()[-1] == f"--grpc-root-cert={ca}"
    with pytest.raises(UserError, match="go together"):
        TritonConfig(model_repository=tmp_path, grpc_root_cert=ca).server_config()
    with pytest.raises(UserError, match="does not exist"):
        TritonConfig(model_repository=tmp_path / "missing").server_config()


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
