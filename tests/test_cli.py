"""The CLI as a user runs it: processes, signals, real Triton; `up` then `score`, SIGTERM drains."""

from __future__ import annotations

import asyncio
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import psutil

from slimserve.bundle import bundle_dir_for
from slimserve.client import build_request
from slimserve.examples import EXAMPLE_MEMBER, example_candidates
from slimserve.serving.triton.launcher import free_port, free_ports
from tests.test_e2e_failures import HEALTHY, health_status

CLI = [sys.executable, "-m", "slimserve.cli"]


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


async def wait_healthy(
    port: int, process: subprocess.Popen, timeout_s: float, log: Path | None = None
) -> None:
    started = time.monotonic()
    tail = (lambda: log.read_text()[-4000:]) if log else (lambda: "")
    while time.monotonic() - started < timeout_s:
        assert process.poll() is None, f"process exited early with {process.returncode}\n{tail()}"
        try:
            if await health_status(port) == HEALTHY:
                return
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError(f"not healthy on port {port} within {timeout_s} s\n{tail()}")


def test_help_for_every_command():
    for command in ("export", "triton", "serve", "up", "score"):
        result = run_cli(command, "--help", timeout=60)
        assert result.returncode == 0, result.stderr
        assert "usage: slimserve " + command in result.stdout


def test_config_errors_exit_1_with_the_field_named(tmp_path):
    result = run_cli("serve", "--port", "not-a-number", "--bundle-dir", str(tmp_path))
    assert result.returncode == 1
    assert "port" in result.stderr and "Traceback" not in result.stderr
    result = run_cli("score", "--input", str(tmp_path / "missing.json"))
    assert result.returncode == 1 and "missing.json" in result.stderr


async def test_up_then_score_then_ctrl_c(tmp_path, tiny_repository):
    """`up --teacher-only` on a published scorer (the build path: tests/test_up.py), `score`, Ctrl-C."""
    repository = tmp_path / "model_repository"
    shutil.copytree(tiny_repository / "scorer", repository / "scorer")
    log_path = tmp_path / "up.log"
    log_file = log_path.open("w")
    up = subprocess.Popen(
        [
            *CLI,
            "up",
            "--teacher-only",
            "--no-generator",
            "--model-repository",
            str(repository),
            "--port",
            "0",  # a port picked here could be Triton's pick inside `up` as well
            "--metrics-port",
            "0",
        ],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        port = _wait_for_printed_port(log_path, up, "ScoringService", timeout_s=300)
        await wait_healthy(port, up, timeout_s=60, log=log_path)
        children = psutil.Process(up.pid).children(recursive=True)
        assert any("tritonserver" in c.name() for c in children)

        result = run_cli("score", "--target", f"127.0.0.1:{port}", "--top-k", "3")
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0].split() == ["rank", "score", "item", "title"]
        assert [line.split()[0] for line in lines[1:4]] == ["1", "2", "3"]
        assert "model scorer v1" in result.stdout
        deadline = time.monotonic() + 60
        while "Serving; Ctrl-C to stop." not in log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
        log_file.close()
    output = log_path.read_text()
    assert up.returncode == 0, output
    assert "Sample request" in output and "Serving; Ctrl-C to stop." in output
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


async def test_sigterm_drains_in_flight_requests(tiny_repository, tiny_triton):
    from slimserve.v1 import scoring_pb2_grpc

    port = free_port()
    serve = subprocess.Popen(
        [
            *CLI,
            "serve",
            "--triton-url",
            tiny_triton.grpc_url,
            "--port",
            str(port),
            "--metrics-port",
            "-1",
            "--bundle-dir",
            str(bundle_dir_for(tiny_repository, "scorer")),
            "--drain-grace-s",
            "30",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    signalled_at = 0.0
    try:
        await wait_healthy(port, serve, timeout_s=60)
        request = build_request(EXAMPLE_MEMBER, example_candidates(120))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = scoring_pb2_grpc.ScoringServiceStub(channel)
            await stub.Score(request, timeout=60)  # warm

            async def call():
                response = await stub.Score(request, timeout=60)
                return len(response.items), time.monotonic()

            calls = [asyncio.create_task(call()) for _ in range(24)]
            await asyncio.sleep(0.5)
            assert not all(c.done() for c in calls), "load finished before SIGTERM: test is vacuous"
            signalled_at = time.monotonic()
            serve.send_signal(signal.SIGTERM)
            results = await asyncio.gather(*calls)
    finally:
        if serve.poll() is None and not signalled_at:
            serve.send_signal(signal.SIGTERM)
        output, _ = serve.communicate(timeout=60)
    assert [n for n, _ in results] == [120] * 24, "an accepted request did not get its answer"
    assert any(done > signalled_at for _, done in results), "no request was in flight at SIGTERM"
    assert serve.returncode == 0, output
    assert "draining" in output


def printed_port(output: str, service: str) -> int:
    """The port ``slimserve up`` printed for ``service`` ("ScoringService on 127.0.0.1:PORT ...")."""
    match = re.search(rf"{service} on [\d.]+:(\d+)", output)
    assert match, f"no address printed for {service}:\n{output}"
    return int(match.group(1))


def _wait_for_printed_port(log_path, process: subprocess.Popen, service: str, timeout_s: float) -> int:
    """Wait until the process's log names the port ``service`` listens on; fail if it exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        output = log_path.read_text()
        if f"{service} on " in output:
            return printed_port(output, service)
        assert process.poll() is None, output
        time.sleep(0.2)
    raise AssertionError(f"{service} printed no address within {timeout_s} s:\n{log_path.read_text()}")


def _read_until(process: subprocess.Popen, marker: str, timeout_s: float) -> str:
    """Read the process's stdout until a line contains `marker`; fail if it exits or times out."""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    seen = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            assert process.poll() is None, "".join(seen)
            continue
        seen.append(line)
        if marker in line:
            return "".join(seen)
    raise AssertionError(f"no line with {marker!r} within {timeout_s} s:\n{''.join(seen)}")


def test_triton_command_serves_the_repository_until_ctrl_c(tiny_repository):
    import urllib.request

    ports = free_ports(3)
    triton = subprocess.Popen(
        [
            *CLI,
            "triton",
            "--model-repository",
            str(tiny_repository),
            "--grpc-port",
            str(ports[0]),
            "--http-port",
            str(ports[1]),
            "--metrics-port",
            str(ports[2]),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output = _read_until(triton, "Ctrl-C to stop", timeout_s=120)
        assert f"gRPC 127.0.0.1:{ports[0]}" in output
        with urllib.request.urlopen(f"http://127.0.0.1:{ports[1]}/v2/models/scorer/ready", timeout=5) as r:
            assert r.status == 200
        children = psutil.Process(triton.pid).children(recursive=True)
        assert any("tritonserver" in c.name() for c in children)
    finally:
        triton.send_signal(signal.SIGINT)
        triton.wait(timeout=60)
    assert triton.returncode == 0
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_up_without_a_build_exports_the_teacher_as_scorer_and_generator(tmp_path):
    """The path of `slimserve up` with nothing published and no recipe: both services, real samples."""
    repository = tmp_path / "model_repository"
    result = run_cli(
        "up",
        "--teacher-only",
        "--teacher",
        "tiny",
        "--model-repository",
        str(repository),
        "--port",
        "0",
        "--metrics-port",
        "0",
        "--reasoning-port",
        "0",
        "--reasoning-metrics-port",
        "0",
        "--exit-after-sample",
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Sample request" in result.stdout and "Sample explanation" in result.stdout
    assert (repository / "scorer" / "1").is_dir() and (repository / "generator" / "1").is_dir()


def test_sigterm_stops_the_triton_a_command_started(tiny_repository):
    """SIGTERM to a command that started Triton (a bench, a build) exits 143 and stops that Triton:
    no orphan server keeps the cores busy (``signals.exit_on_sigterm``, installed by ``main``)."""
    script = (
        "import sys, time\n"
        "from slimserve.signals import exit_on_sigterm\n"
        "from tests.conftest import start_triton\n"
        "exit_on_sigterm()\n"
        f"server = start_triton({str(tiny_repository)!r})\n"
        "print(server.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        triton_pid = int(process.stdout.readline())
        assert psutil.pid_exists(triton_pid)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 143
    finally:
        process.kill()
    deadline = time.monotonic() + 10
    while psutil.pid_exists(triton_pid) and psutil.Process(triton_pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "Triton outlived the command that started it"
        time.sleep(0.1)
