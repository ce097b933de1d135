"""Each bench command on the tiny model for a few seconds, against the real Triton and the real service.

Checks well-formed output only: no test asserts a speed.
"""

from __future__ import annotations

import asyncio
import csv
import json

import pytest

from slimserve.bench.grpc_load import LoadPlan, bench_service, explain_requests, score_requests
from slimserve.bench.perf_analyzer import PerfSettings
from slimserve.bench.service import scoring_service
from slimserve.bench.triton_bench import run_triton_bench
from slimserve.bench.workload import Workload, load_calls, load_workload
from slimserve.bundle import bundle_dir_for
from slimserve.cli import main
from slimserve.serving.triton.launcher import TritonServer, TritonServerConfig, free_port


def read_csv(path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def tiny_bundle(tiny_repository):
    return bundle_dir_for(tiny_repository, "scorer")


def test_perf_analyzer_on_the_tiny_scorer(tiny_repository, tiny_triton, tiny_bundle):
    workload = load_workload(tiny_bundle, requests=8, candidates=4)
    assert workload.items == 32 and set(workload.by_bucket()) <= {64, 192, 320}
    points = run_triton_bench(
        tiny_repository,
        workload,
        triton_url=tiny_triton.grpc_url,
        concurrencies=(2,),
        request_rates=(20,),
        settings=PerfSettings(window_requests=20),
    )
    buckets = len(workload.by_bucket())
    assert [(p.mode, p.load) for p in points] == [("concurrency", 2.0), ("request_rate", 20.0)] * buckets
    assert all(p.model == "scorer" and p.infer_per_s > 0 and 0 < p.p50_ms <= p.p99_ms for p in points)


def test_perf_analyzer_on_the_tiny_multi_item_scorer(tiny_multi_item_repository, tiny_multi_item_triton):
    workload = load_workload(bundle_dir_for(tiny_multi_item_repository, "scorer"), requests=6, candidates=3)
    points = run_triton_bench(
        tiny_multi_item_repository,
        workload,
        triton_url=tiny_multi_item_triton.grpc_url,
        concurrencies=(1,),
        settings=PerfSettings(window_requests=20),
    )
    assert [(p.mode, p.load, p.bucket) for p in points] == [("concurrency", 1.0, 3)]
    (point,) = points
    assert point.infer_per_s > 0 and 0 < point.p50_ms <= point.p99_ms
    assert point.items_per_s == pytest.approx(3 * point.infer_per_s)  # three candidates per request


def test_bench_triton_command_rejects_unknown_model(tiny_repository, tiny_triton, capsys):
    code = main(
        ["bench", "triton", "--model-repository", str(tiny_repository), "--triton-url", tiny_triton.grpc_url,
         "--models", "nope", "--requests", "2", "--candidates", "2"]
    )  # fmt: skip
    assert code == 1 and "nope" in capsys.readouterr().err


def test_grpc_load_against_the_tiny_service(tiny_triton, tiny_bundle):
    calls, _ = load_calls(None, requests=4, candidates=3)
    plan = LoadPlan(concurrencies=(1, 3), rates=(15,), max_requests=30, max_seconds=2, warmup_requests=2)
    with scoring_service(tiny_bundle, tiny_triton.grpc_url) as target:
        points = asyncio.run(bench_service(target, "Score", score_requests(calls), plan))
    assert [(p.mode, p.load) for p in points] == [("closed", 1), ("closed", 3), ("open", 15)]
    for point in points:
        assert point.errors == {} and point.ok > 0 and point.items == 3 * point.ok
        assert 0 < point.latency.p50_ms <= point.latency.p95_ms <= point.latency.p99_ms
        assert point.ttft is None


def test_bench_grpc_command_counts_unavailable(tmp_path, capsys):
    out = tmp_path / "points.json"
    code = main(
        ["bench", "grpc", "--target", f"127.0.0.1:{free_port()}", "--concurrency", "2", "--max-requests", "4",
         "--warmup", "0", "--timeout", "1", "--requests", "2", "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    [point] = json.loads(out.read_text())
    assert point["ok"] == 0 and point["errors_by_code"] == {"UNAVAILABLE": 4}
    assert "UNAVAILABLE 4" in capsys.readouterr().out


def test_bench_grpc_refuses_remote_targets(capsys):
    assert main(["bench", "grpc", "--target", "192.0.2.1:50051", "--requests", "1"]) == 1
    assert "loopback" in capsys.readouterr().err


def test_bench_report_on_the_tiny_model(tiny_repository, tiny_bundle, tmp_path, capsys):
    """The whole comparison (ONNX Runtime, PyTorch, served with batching off and on, perf_analyzer) briefly."""
    out = tmp_path / "report"
    onnx = tiny_bundle.parent / "model.onnx"
    code = main(
        ["bench", "report", "--variant", f"tiny={onnx}@tiny", "--model-repository", str(tiny_repository),
         "--engine-seconds", "0.5", "--concurrency", "1,4", "--max-requests", "24", "--max-seconds", "1.5", "--open-loop-seconds", "1.5",
         "--delays-us", "0", "--main-delay-us", "0", "--perf-concurrency", "2", "--perf-window-requests", "20",
         "--requests", "6", "--candidates", "4", "--out", str(out), "--note", "test run"]
    )  # fmt: skip
    assert code == 0
    assert "report written to" in capsys.readouterr().out
    text = (out / "report.md").read_text()
    assert "**Note:** test run" in text and "## Ratios and targets" in text
    assert "dynamic batching off (max batch 1)" in text and "queue delay 0 us" in text
    engines = read_csv(out / "engines.csv")
    assert [e["engine"] for e in engines] == [
        "onnxruntime in process",
        "pytorch in process",
        "onnxruntime in process (end of run)",
    ]
    assert "ONNX Runtime floor of tiny:" in text
    load = read_csv(out / "grpc_load.csv")
    assert {(r["batching"], r["mode"]) for r in load} == {
        ("off", "closed"),
        ("off", "open"),
        ("on-0us", "closed"),
        ("on-0us", "open"),
    }
    assert all(int(r["errors"]) == 0 for r in load)
    perf = read_csv(out / "perf_analyzer.csv")
    assert perf and all(r["batching"] == "on-0us" for r in perf)
    configs = {p.name: p.read_text() for p in (out / "configs").iterdir()}
    assert (
        "dynamic_batching" not in configs["tiny-off.pbtxt"]
        and "max_batch_size: 1\n" in configs["tiny-off.pbtxt"]
    )
    assert "dynamic_batching" in configs["tiny-on-0us.pbtxt"]
    ratios = json.loads((out / "results.json").read_text())["ratios"]
    assert any("off (max batch 1) at concurrency 4" in r["name"] for r in ratios)
    assert (out / "throughput_vs_p99.png").stat().st_size > 1000


async def test_streams_of_the_tiny_generator(generator_repository):
    """Explain streams through the ReasoningService (TTFT, tokens/s) and perf_analyzer --streaming on Triton."""
    from slimserve.serving.reasoning.config import ReasoningServiceConfig
    from slimserve.serving.reasoning.server import ReasoningServer

    calls, source = load_calls(None, requests=3, candidates=1)
    config = TritonServerConfig(
        model_repository=generator_repository,
        model_control_mode="explicit",
        load_models=("generator",),
        startup_timeout_s=120,
    )
    loop = asyncio.get_running_loop()
    with TritonServer(config) as triton:
        server = ReasoningServer(
            ReasoningServiceConfig(
                port=0,
                metrics_port=-1,
                triton_url=triton.grpc_url,
                model_repository=generator_repository,
                health_poll_interval_s=0.2,
                drain_grace_s=2,
            )
        )
        await server.start()
        try:
            assert await server.core.watcher.wait_until_ready(timeout=30)
            plan = LoadPlan(concurrencies=(2,), rates=(4,), max_requests=6, max_seconds=3, warmup_requests=1)
            points = await bench_service(
                f"127.0.0.1:{server.port}", "Explain", explain_requests(calls, 8), plan
            )
        finally:
            await server.stop(grace=1)
        perf = await loop.run_in_executor(
            None,
            lambda: run_triton_bench(
                generator_repository,
                Workload(calls, [], (), source),
                triton_url=triton.grpc_url,
                concurrencies=(2,),
                settings=PerfSettings(window_requests=5),
                max_tokens=8,
            ),
        )
    assert [(p.mode, p.load) for p in points] == [("closed", 2), ("open", 4)]
    for point in points:
        assert point.errors == {} and point.ok > 0 and point.items == point.ok
        assert point.ttft is not None and 0 < point.ttft.p50_ms <= point.latency.p99_ms
        assert 0 < point.tokens <= 8 * point.ok
    assert [(p.model, p.bucket, p.mode) for p in perf] == [("generator", 0, "concurrency")]
    assert perf[0].infer_per_s > 0


def test_bench_generators_student_against_exported_teacher(generator_repository, tmp_path, capsys):
    """`bench generators`: the repository's generator and a teacher exported at its precision, same stack."""
    out = tmp_path / "generators.json"
    code = main(
        ["bench", "generators", "--model-repository", str(generator_repository), "--teacher", "tiny",
         "--streams", "1,3", "--teacher-precision", "fp32", "--max-tokens", "6", "--max-requests", "6", "--max-seconds", "3",
         "--warmup", "1", "--requests", "3", "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    assert "student / teacher decode throughput at 3 stream(s)" in text and "TTFT p50 with the batch" in text
    result = json.loads(out.read_text())
    assert result["max_tokens"] == 6 and result["command"].startswith("slimserve ")
    for variant in ("student", "teacher"):
        run = result[variant]
        assert run["variant"] == variant and run["precision"] == "fp32"
        assert [p["load"] for p in run["points"]] == [1, 3]
        for point in run["points"]:
            assert point["errors"] == 0 and point["ok"] > 0 and 0 < point["tokens"] <= 6 * point["ok"]
        assert run["ttft_busy_over_idle"] > 0
    assert result["teacher"]["repository"] != str(generator_repository)
    assert set(result["student_over_teacher_tokens_per_s"]) == {"1", "3"}
    assert all(r > 0 for r in result["student_over_teacher_tokens_per_s"].values())
