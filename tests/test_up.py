"""`slimserve up` on the tiny recipe as a user runs it: build (interrupted, then resumed), the scorer
served while the generator stages run, the stage tables and the closing table, then a rerun that serves
what was published without building."""

from __future__ import annotations

import signal
import subprocess
import time

import psutil
import yaml

from slimserve.buildstage.recipe import RECIPES_DIR
from tests.test_cli import CLI

TINY_UP = ["up", "--recipe", "tiny", "--port", "0", "--metrics-port", "0"]
TINY_UP += ["--reasoning-port", "0", "--reasoning-metrics-port", "0"]


def _up(tmp_path, *extra: str) -> list[str]:
    return [
        *CLI,
        *TINY_UP,
        "--work-dir",
        str(tmp_path / "build"),
        "--model-repository",
        str(tmp_path / "model_repository"),
        *extra,
    ]


def _wait_for(log_path, marker: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while marker not in log_path.read_text():
        assert process.poll() is None, log_path.read_text()[-4000:]
        assert time.monotonic() < deadline, (
            f"no {marker!r} within {timeout_s} s\n{log_path.read_text()[-4000:]}"
        )
        time.sleep(0.2)


def _ctrl_c_at(log_path, command: list[str], marker: str) -> tuple[int, str]:
    """Run ``command`` until ``marker`` is in its output, then Ctrl-C it: (exit code, output)."""
    with log_path.open("w") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, text=True)
        try:
            _wait_for(log_path, marker, process, timeout_s=600)
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=60)
    return process.returncode, log_path.read_text()


def test_up_builds_resumes_after_ctrl_c_then_serves_the_published_models_at_once(tmp_path):
    # 1. Interrupted during the build: it stops at once and leaves the finished stages.
    code, first = _ctrl_c_at(tmp_path / "first.log", _up(tmp_path), "stage distill: running")
    assert code == 130, first
    assert "Interrupted: the next `slimserve up` resumes the build" in first
    assert "Exception in thread" not in first  # the build thread's stopped stage is not a traceback
    assert "stage teacher: finished in" in first and "test AUC" in first  # the stage's closing line
    assert not (tmp_path / "model_repository" / "scorer").exists()

    # 2. Resumed: the finished stages are skipped; the scorer serves while the generator stages run.
    second = subprocess.run(
        _up(tmp_path, "--exit-after-sample"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )
    output = second.stdout
    assert second.returncode == 0, output
    assert "stage teacher: done before with the same settings, skipped" in output
    # distill may have finished in the moment between the marker and the interrupt; the stages after
    # it cannot have, so they run now
    assert "stage int8: finished in" in output
    for row in ("| pruned (osscar) |", "| pruned (magnitude+refit) |", "| pruned (magnitude) |", "| INT8"):
        assert row in output, row  # the scorer's stage table
    assert "| generator (a)+(b) on-policy |" in output  # the generator's
    assert "the generator stages run now" in output
    assert output.index("Sample request") < output.index("ReasoningService on")
    # the generator stages wait until the ScoringService answered (Triton starts on idle cores)
    assert output.index("Sample request") < output.index("stage gen_finetune: running")
    # the single-sequence INT8 graph is report-only: it runs once both students are published
    assert output.index("stage gen_onpolicy: finished") < output.index("stage int8_single: running")
    assert "Sample explanation" in output and "Grounding check (the build's evaluation): " in output
    assert "Teacher vs students" in output and "| scoring student (published)" in output
    assert "| generator student (published)" in output
    assert "(its graph as served: hallucination" in output  # the exported graph, gated as Explain decodes
    assert ", sentence repeated " in output  # ... and how often a text says one sentence twice
    assert "; on 2 full matches: hallucination" in output  # ... and on the test split's full matches
    assert "| generator (a)+(b), published FP32 graph as served |" in output  # in the generator's table
    # every model's grounding and speed (stage gen_report) come after the students serve, in a closing table
    closing = output.index("Build (recipe tiny), the generator's stages:\n")
    assert output.index("Sample explanation") < output.index("stage gen_report: running") < closing
    assert "stage gen_report: finished in" in output and "5 models' explanations and decode speeds" in output

    # 3. Again: everything is published from this recipe, so it serves at once, without a build.
    started = time.monotonic()
    third = subprocess.Popen(_up(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in third.stdout:
            lines.append(line)
            if "Serving; Ctrl-C to stop." in line:
                break
        elapsed = time.monotonic() - started
        children = psutil.Process(third.pid).children(recursive=True)
    finally:
        third.send_signal(signal.SIGINT)
        rest, _ = third.communicate(timeout=60)
    output = "".join(lines) + rest
    assert third.returncode == 0, output
    assert "Recipe 'tiny' built before: serving the models it published" in output
    assert "scorer version 1, generator version 1" in output
    assert "Building recipe" not in output and "done before" not in output
    assert "Sample request" in output and "Sample explanation" in output and "Teacher vs students" in output
    assert elapsed < 120, f"{elapsed:.0f} s to serving"
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]

    # 4. A generator gate that fails (same stages, stricter gate): the scorer keeps serving, said so.
    strict = yaml.safe_load((RECIPES_DIR / "tiny.yaml").read_text())
    strict["generator"]["gates"] = {"max_kl_increase": -100.0}  # demands 100 nats better: never met
    (tmp_path / "strict.yaml").write_text(yaml.safe_dump(strict))
    command = [part if part != "tiny" else str(tmp_path / "strict.yaml") for part in _up(tmp_path)]
    code, output = _ctrl_c_at(tmp_path / "fourth.log", command, "Serving; Ctrl-C to stop.")
    assert code == 1, output
    assert "The generator was not published: quality gate failed" in output
    assert "ScoringService keeps serving the scoring student" in output and "Sample request" in output


def test_the_build_thread_hands_nothing_to_a_closed_event_loop():
    """``slimserve up`` stopped while a stage runs after the services started: the stage's process is
    stopped, and the build thread's error arrives after the event loop closed. It is dropped, not a
    traceback from the thread (seen once on a Ctrl-C during the post-serving stage ``speed``)."""
    import asyncio

    from slimserve.up import _Build

    loop = asyncio.new_event_loop()
    build = _Build(loop, loop.create_future(), loop.create_future(), loop.create_future())
    loop.close()
    build.post(build.done, error=RuntimeError("stage speed's process exited with code 143"))
    assert not build.done.done()
