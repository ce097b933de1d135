"""The reasoning CLI as a user runs it: `up` serves scorer and generator, then `explain` and `generate`."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess

import psutil

from tests.test_cli import CLI, _read_until, printed_port, run_cli

METADATA = re.compile(
    r"model generator v1 \(bundle [0-9a-f]{12}\), request (\S+): (\d+) tokens after a (\d+)-token prompt, "
    r"finish (\w[\w ']*); first token [\d.]+ ms, [\d.]+ tokens/s, total [\d.]+ ms"
)


def test_up_serves_both_then_explain_and_generate(tmp_path, tiny_repository, generator_repository):
    repository = tmp_path / "model_repository"
    shutil.copytree(tiny_repository / "scorer", repository / "scorer")
    shutil.copytree(generator_repository / "generator", repository / "generator")
    up = subprocess.Popen(
        [
            *CLI,
            "up",
            "--teacher-only",
            "--model-repository",
            str(repository),
            "--port",
            "0",
            "--metrics-port",
            "0",
            "--reasoning-port",
            "0",  # a port picked here could be Triton's pick inside `up` as well
            "--reasoning-metrics-port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    printed = ""
    try:
        printed = _read_until(up, "Serving; Ctrl-C to stop.", timeout_s=180)
        children = psutil.Process(up.pid).children(recursive=True)
        target = f"127.0.0.1:{printed_port(printed, 'ReasoningService')}"

        explain = run_cli(
            "explain", "--target", target, "--max-tokens", "16", "--request-id", "cli-explain-1"
        )
        assert explain.returncode == 0, explain.stderr
        assert explain.stdout.startswith("Why Senior Backend Engineer at Globex for member m-demo-1:")
        match = METADATA.search(explain.stdout)
        assert match, explain.stdout
        assert match.group(1) == "cli-explain-1" and int(match.group(2)) <= 16

        generate = run_cli(
            "generate", "--target", target, "--prompt", "Say hello.", "--max-tokens", "8", "--seed", "1",
            "--temperature", "1.0",
        )  # fmt: skip
        assert generate.returncode == 0, generate.stderr
        assert METADATA.search(generate.stdout), generate.stdout

        bad = run_cli("generate", "--target", target, "--prompt", "hi", "--temperature", "9")
        assert bad.returncode == 1
        assert "INVALID_ARGUMENT: options.temperature" in bad.stderr and "Traceback" not in bad.stderr
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
    assert up.returncode == 0
    assert "ReasoningService on" in printed and "Sample explanation" in printed
    assert METADATA.search(printed), printed
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
