"""Benchmark pieces on known data: perf_analyzer CSV and input data, the load generator's bounds and error
counting, the workload's requests, the ratios against the targets, and the report files."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from slimserve.bench.compare import CompareResult, ServedRun
from slimserve.bench.grpc_load import CallOutcome, LoadPoint, check_loopback, closed_loop, open_loop
from slimserve.bench.inprocess import EngineResult
from slimserve.bench.perf_analyzer import (
    PerfAnalyzerError,
    PerfSettings,
    input_data_json,
    measure_point,
    parse_perf_csv,
    perf_command,
)
from slimserve.bench.ratios import compute_ratios, format_ratios
from slimserve.bench.stats import LatencySummary
from slimserve.errors import UserError

# Captured from perf_analyzer 2.51 (-f) against the tiny scorer; latencies in microseconds.
CONCURRENCY_CSV = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency\n"
    "4,889.036,2,664,1340,24,2316,133,1,4043,5924,7700,10181\n"
)
RATE_CSV = (
    "Request Rate,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,"
    "Avg latency,request/response,response wait\n"
    "50,49.8,4,689,850,16,2700,97,2,3000,6000,9500,31800,3900,1,3800\n"
    "\n"
    "Server Metrics\nsomething,else\n"
)


def test_parse_perf_csv_concurrency():
    [point] = parse_perf_csv(CONCURRENCY_CSV, "scorer", 192, batch_size=2)
    assert (point.model, point.bucket, point.mode, point.load) == ("scorer", 192, "concurrency", 4.0)
    assert point.infer_per_s == pytest.approx(889.036) and point.items_per_s == pytest.approx(1778.072)
    assert (point.p50_ms, point.p90_ms, point.p95_ms, point.p99_ms) == pytest.approx(
        (4.043, 5.924, 7.7, 10.181)
    )
    assert point.server_queue_ms == pytest.approx(1.34)
    assert point.server_compute_ms == pytest.approx((24 + 2316 + 133) / 1000)
    assert np.isnan(point.avg_ms)  # this CSV has no Avg column
    assert point.extra["Client Send"] == "2"
    assert set(point.as_dict()) >= {"items_per_s", "p99_ms", "mode"}


def test_parse_perf_csv_request_rate_ignores_the_metrics_table():
    [point] = parse_perf_csv(RATE_CSV, "scorer", 96)
    assert point.mode == "request_rate" and point.load == 50.0
    assert point.avg_ms == pytest.approx(3.9) and point.p99_ms == pytest.approx(31.8)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("Foo,Bar\n1,2\n", "unexpected header"),
        ("Concurrency,Inferences/Second,p50 latency\n1,abc,3\n", "'Inferences/Second'"),
    ],
)
def test_parse_perf_csv_rejects_malformed_text(text, message):
    with pytest.raises(ValueError, match=message):
        parse_perf_csv(text, "scorer", 96)


def test_input_data_pads_real_sequences_to_the_bucket():
    data = input_data_json([[5, 6, 7], [8]], 4, ("input_ids", "attention_mask"))
    assert data["data"][0]["input_ids"] == {"content": [5, 6, 7, 0], "shape": [4]}
    assert data["data"][1]["attention_mask"] == {"content": [1, 0, 0, 0], "shape": [4]}
    assert list(input_data_json([[1]], 2, ("input_ids",))["data"][0]) == ["input_ids"]
    with pytest.raises(ValueError, match="max_new_tokens"):
        input_data_json([[1]], 2, ("input_ids", "max_new_tokens"))


def test_perf_command_modes_and_streaming(tmp_path):
    settings = PerfSettings(window_requests=50)
    base = (Path("/bin/pa"), "scorer", "127.0.0.1:1", tmp_path / "in.json", tmp_path / "o.csv")
    concurrency = perf_command(*base, "concurrency", 8, settings)
    assert "--concurrency-range=8:8:1" in concurrency and "--measurement-request-count=50" in concurrency
    assert "--streaming" not in concurrency
    rate = perf_command(*base, "request_rate", 12.5, settings, streaming=True)
    assert "--request-rate-range=12.5:12.5:1" in rate and "--request-distribution=poisson" in rate
    assert rate[-1] == "--streaming"
    with pytest.raises(ValueError, match="mode"):
        perf_command(*base, "burst", 1, settings)
    with pytest.raises(ValueError, match="max_trials"):
        PerfSettings(max_trials=2)


def test_unstable_measurement_is_retried_once_with_larger_windows(tmp_path):
    csv_path, seen = tmp_path / "points.csv", []

    def make_command(settings: PerfSettings) -> list[str]:
        seen.append(settings)
        if len(seen) == 1:  # what perf_analyzer prints and returns when its windows never agree
            return ["sh", "-c", "echo 'Failed to obtain stable measurement.'; exit 2"]
        return ["sh", "-c", f"printf '%s' '{CONCURRENCY_CSV}' > {csv_path}"]

    text = measure_point(make_command, csv_path, PerfSettings(window_requests=10))
    assert [(s.window_requests, s.max_trials) for s in seen] == [(10, 3), (20, 6)]
    assert parse_perf_csv(text, "scorer", 96)[0].load == 4.0
    with pytest.raises(PerfAnalyzerError, match="exited with 3"):
        measure_point(lambda _: ["sh", "-c", "exit 3"], tmp_path / "none.csv", PerfSettings())


def test_workload_requests_from_a_dataset_split():
    from slimserve.bench.workload import build_calls, load_calls

    calls, source = load_calls(None, requests=5, candidates=10)
    assert len(calls) == 5 and all(len(c.items) == 10 for c in calls) and "synthetic" in source
    # Each member's own impressions come first, then the split's other items fill up.
    assert len({c.member.id for c in calls}) == 5
    with pytest.raises(ValueError):
        build_calls([], 0, 1)
    many, _ = load_calls(None, requests=3, candidates=40)  # topped up with distinct items only
    assert all(len({item.id for item in c.items}) == 40 for c in many)
    with pytest.raises(ValueError, match="distinct items"):
        load_calls(None, requests=1, candidates=100_000)


def _rpc_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="test")


async def test_closed_loop_is_bounded_and_counts_errors_by_code():
    calls = []

    async def call(index: int) -> CallOutcome:
        calls.append(index)
        await asyncio.sleep(0.001)
        if index % 5 == 4:
            raise _rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED)
        return CallOutcome(items=3)

    point = await closed_loop(call, "Score", concurrency=4, max_requests=20, max_seconds=30)
    assert sorted(calls) == list(range(20))
    assert point.ok == 16 and point.errors == {"RESOURCE_EXHAUSTED": 4} and point.items == 48
    assert point.latency.count == 16 and point.items_per_s == pytest.approx(3 * point.requests_per_s)

    slow = await closed_loop(lambda i: asyncio.sleep(0.05, CallOutcome(1)), "Score", 2, 10_000, 0.3)
    assert 0 < slow.ok < 30  # the time bound stopped it


async def test_open_loop_keeps_arrivals_and_measures_streams():
    async def call(index: int) -> CallOutcome:
        await asyncio.sleep(0.01)
        first = time.perf_counter()
        await asyncio.sleep(0.02)
        return CallOutcome(items=1, tokens=5, first_token_s=first)

    point = await open_loop(call, "Explain", rate=200, max_requests=30, max_seconds=10, seed=1)
    assert point.mode == "open" and point.ok == 30 and point.tokens == 150
    assert point.ttft is not None and point.ttft.p50_ms >= 10
    assert point.latency.p50_ms >= 30 and point.stream_tokens_per_s > 0
    assert "ttft_p99_ms" in point.as_dict()
    with pytest.raises(ValueError):
        await open_loop(call, "Explain", rate=0, max_requests=1, max_seconds=1)


def test_check_loopback():
    check_loopback("127.0.0.1:50051")
    check_loopback("localhost:1")
    with pytest.raises(UserError, match="loopback"):
        check_loopback("192.0.2.1:50051")


def _point(mode: str, load: float, items_per_s: float, p50: float, p99: float) -> LoadPoint:
    summary = LatencySummary(100, p50, p50, p50, p50, p99, p99)
    return LoadPoint("Score", mode, load, 100, 10.0, int(items_per_s * 10), summary)


def _result() -> CompareResult:
    def run(variant, batching, c16, extra=()):
        points = [_point("closed", 1, c16 / 4, 10, 20), _point("closed", 16, c16, 50, 100), *extra]
        return ServedRun(variant, batching, batching, 'name: "scorer"\n', points)

    engines = [
        EngineResult("teacher FP32", "onnxruntime in process", 10.0, 32, 2),
        EngineResult("teacher FP32", "pytorch in process", 5.0, 32, 2),
        EngineResult("student INT8", "onnxruntime in process", 100.0, 32, 2, 5.0, 9.0),
        EngineResult("student INT8", "onnxruntime in process (end of run)", 80.0, 32, 2, 5.0, 9.0),
    ]
    served = [
        run("teacher FP32", "on-300us", 8.0),
        run("student INT8", "off", 30.0),
        run("student INT8", "on-0us", 75.0),
        run("student INT8", "on-300us", 90.0, [_point("open", 5.0, 40.0, 20.0, 70.0)]),
    ]
    settings = {"concurrencies": [1, 16], "main_batching": "on-300us"}
    return CompareResult("test workload", settings, engines, served, 60.0, {"student INT8": "INT8"})


def test_ratios_against_the_targets():
    ratios = {r.name: r for r in compute_ratios(_result())}
    floor = ratios["student INT8: slimserve best concurrency (16) / ONNX Runtime floor"]
    assert floor.value == pytest.approx(1.0) and floor.met is True  # 90 / mean(100, 80)
    assert ratios["teacher FP32: ONNX Runtime / PyTorch in process"].value == pytest.approx(2.0)
    batching = ratios["student INT8: on-300us / off (max batch 1) at concurrency 16"]
    assert batching.value == pytest.approx(3.0) and batching.met is True
    assert ratios["student INT8: on-0us / off (max batch 1) at concurrency 16"].met is True
    e2e = ratios["student INT8 / teacher FP32: slimserve end to end, best concurrency"]
    assert e2e.value == pytest.approx(90 / 8) and e2e.met is True
    [tail] = [r for r in ratios.values() if "open loop" in r.name]
    assert tail.value == pytest.approx(3.5) and tail.met is False and tail.target_text() == "<= 3"
    assert "| **no** |" in format_ratios(list(ratios.values()))


def test_report_files(tmp_path):
    from slimserve.bench.report import ReportInputs, write_report

    build = {
        "stages": [
            {"stage": "teacher fine-tuned", "test_auc": 0.70, "items_per_s_batch32": 7.0, "file_mb": 541.0},
            {"stage": "student distilled", "test_auc": 0.67, "items_per_s_batch32": None},
            {"stage": "INT8 (static)", "test_auc": 0.69, "items_per_s_batch32": 50.0, "file_mb": 155.0},
            {"stage": "INT8 multi-item (static)", "test_auc": 0.69, "items_per_s_batch32": 120.0},
        ]
    }
    inputs = ReportInputs(
        "slimserve bench report (test)",
        {"cpu": "x", "cores": 2, "memory_gb": 1, "os": "l", "python": "3", "load_average_1_5_15": [0, 0, 0]},
        {"slimserve": "0"},
        build,
        "shared",
    )
    out = tmp_path / "reports" / "run"
    (out).mkdir(parents=True)
    (out / "stale.txt").write_text("replaced")
    path = write_report(_result(), inputs, out)
    names = {p.name for p in out.iterdir()}
    assert names >= {
        "report.md",
        "engines.csv",
        "grpc_load.csv",
        "ratios.csv",
        "stages.csv",
        "results.json",
        "throughput_vs_p99.png",
        "quality_vs_throughput.png",
        "configs",
    }
    assert "stale.txt" not in names
    for png in ("throughput_vs_p99.png", "quality_vs_throughput.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = path.read_text()
    assert "**Note:** shared" in text and "![throughput_vs_p99.png]" in text and "| INT8 (static) |" in text
    results = json.loads((out / "results.json").read_text())
    assert results["stages"][2]["served_items_per_s"] == pytest.approx(90.0)
    # The single-sequence INT8 variant is not the multi-item graph: that row has no served figure.
    assert results["stages"][3]["served_items_per_s"] is None
    assert len(results["grpc_load"]) == 9 and len(list((out / "configs").iterdir())) == 4
    assert (out / "grpc_load.csv").read_text().splitlines()[0].startswith("variant,batching,method,mode")


def test_report_puts_the_layouts_side_by_side(tmp_path):
    from slimserve.bench.layouts import LayoutPoint, LayoutResult
    from slimserve.bench.report import ReportInputs, write_report

    def point(layout, n, floor, served):
        points = [_point("closed", load, ips, p50, 2 * p50) for load, ips, p50 in served]
        return LayoutPoint(layout, n, floor, n / floor * 1e3, points)

    result = _result()
    result.layouts = LayoutResult(
        [
            # single-sequence serves most at c=4, where its p50 is mostly queueing
            point("single", 50, 100.0, [(1, 70.0, 600.0), (4, 80.0, 2400.0)]),
            point("multi_item", 50, 400.0, [(1, 360.0, 150.0), (4, 300.0, 700.0)]),
        ],
        {"candidates": [50]},
        {"single": "a.onnx", "multi_item": "b.onnx"},
    )
    machine = {"cpu": "x", "cores": 2, "memory_gb": 1, "os": "l", "python": "3", "load_average_1_5_15": [0]}
    out = tmp_path / "run"
    text = write_report(result, ReportInputs("cmd", machine, {}), out).read_text()
    assert "## Multi-item vs single-sequence scoring, same student" in text
    # served items/s (best concurrency of each), p50 single / multi at the same concurrency, floor
    assert "| 50 | 4.50x | 4.00x (c=1) | 4.00x |" in text
    rows = (out / "layouts.csv").read_text().splitlines()
    assert rows[0].startswith("layout,candidates,floor_items_per_s") and len(rows) == 3
    assert json.loads((out / "results.json").read_text())["layouts"]["points"][1]["layout"] == "multi_item"


def test_multi_item_input_data_keeps_each_request_shape():
    from slimserve.bench.perf_analyzer import multi_item_input_data_json
    from slimserve.scoring_tokens import ScoringTokens, multi_item_requests

    short = multi_item_requests(ScoringTokens([1, 2, 3], [[4], [5, 6]]), (2, 4), 8)
    long = multi_item_requests(ScoringTokens([1, 2], [[7, 8, 9]]), (2, 4), 8)
    data = multi_item_input_data_json(short + long)["data"]
    assert [e["item_ids"]["shape"] for e in data] == [[2, 2], [1, 1]]  # one candidate: folded
    assert data[1]["prefix_ids"] == {"content": [1, 2, 7, 8], "shape": [4]}
    assert data[0]["prefix_ids"] == {"content": [1, 2, 3], "shape": [3]}
    assert data[0]["item_mask"]["content"] == [1, 0, 1, 1]
    with pytest.raises(ValueError, match="input_ids"):
        multi_item_input_data_json(short, ("input_ids",))


def test_a_multi_item_build_gives_its_single_sequence_graphs_to_bench_compare(tmp_path):
    import json as json_module

    from slimserve.bench.variants import variants_from_build

    work = tmp_path / "work"
    graphs = ["teacher_speed/teacher_fp32", "int8/fp32", "int8/int8_static", "int8/multi_item_int8_static"]
    for graph in graphs:
        (work / graph).mkdir(parents=True)
        (work / graph / "model.onnx").write_bytes(b"")
    chosen = work / "int8" / "multi_item_int8_static" / "model.onnx"
    (work / "int8" / "chosen.json").write_text(json_module.dumps({"path": str(chosen)}))
    teacher, student, int8 = variants_from_build(work)
    assert teacher.onnx == work / "teacher_speed" / "teacher_fp32" / "model.onnx"  # a build before `speed`
    assert student.onnx == work / "int8" / "fp32" / "model.onnx"
    assert int8.onnx == work / "int8" / "int8_static" / "model.onnx"  # not the multi-item graph
    (work / "int8" / "int8_static" / "model.onnx").unlink()
    with pytest.raises(FileNotFoundError, match="int8_static"):
        variants_from_build(work)
    for graph in ("int8_single/fp32", "int8_single/int8_static"):  # built after publishing (int8_single)
        (work / graph).mkdir(parents=True)
        (work / graph / "model.onnx").write_bytes(b"")
    _, student, int8 = variants_from_build(work)
    assert student.onnx == work / "int8_single" / "fp32" / "model.onnx"
    assert int8.onnx == work / "int8_single" / "int8_static" / "model.onnx"
