"""A build stage in a process of its own (``stage_process.run_apart``): the child's errors come back as
the parent's, with the child's message; a child killed without a word is a build error naming the
signal; an interrupted parent leaves no child behind. (Its success path runs in every build test:
``tests/test_build.py``, ``tests/test_up.py``.)"""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
import torch

from slimserve.buildstage import stage_process
from slimserve.buildstage.recipe import load_recipe
from slimserve.buildstage.stage_process import run_apart
from slimserve.errors import BuildError, UserError


def _tiny(tmp_path, **updates):
    recipe = load_recipe("tiny")
    return recipe.model_copy(update={"work_dir": tmp_path / "work", **updates})


def _endless_stage(tmp_path):
    """A tiny recipe whose teacher stage trains for 100,000 epochs: its process runs until it is stopped."""
    recipe = _tiny(tmp_path)
    teacher = recipe.teacher.model_copy(
        update={"train": recipe.teacher.train.model_copy(update={"epochs": 100_000})}
    )
    return recipe.model_copy(update={"teacher": teacher})


def _forkserver_children() -> list[psutil.Process]:
    """The children of the forkserver (this process's child), alive or not yet reaped."""
    for server in psutil.Process().children():
        if "forkserver" in " ".join(server.cmdline()):
            return server.children()
    return []


def _stage_process(known: set[int], timeout_s: float = 120.0) -> psutil.Process:
    """The stage's process: the forkserver's running child whose pid is not in ``known``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in _forkserver_children():
            if child.pid not in known and child.status() != psutil.STATUS_ZOMBIE:
                return child
        time.sleep(0.05)
    raise AssertionError(f"no stage process started (known: {known})")


def _in_thread(fn) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def run():
        try:
            fn()
        except BaseException as exc:  # handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch sees no CUDA device")
def test_a_user_error_in_the_child_is_the_parents_with_its_message(tmp_path):
    recipe = _tiny(tmp_path)
    recipe = recipe.model_copy(update={"generator": recipe.generator.model_copy(update={"device": "cuda"})})
    seconds: dict[str, float] = {}
    with pytest.raises(UserError, match=r"generator\.device: 'cuda' but torch sees no CUDA device"):
        run_apart(recipe, "generator", "gen_finetune", seconds)
    assert seconds == {}


def test_a_child_killed_without_a_result_is_a_build_error_naming_the_signal(tmp_path):
    recipe = _endless_stage(tmp_path)
    known = {p.pid for p in _forkserver_children()}
    thread, outcome = _in_thread(lambda: run_apart(recipe, "scorer", "teacher", {}))
    _stage_process(known).kill()
    thread.join(60)
    assert isinstance(outcome.get("error"), BuildError), outcome
    assert "stage teacher's process was killed by SIGKILL (out of memory?)" in str(outcome["error"])


def test_an_interrupted_parent_stops_the_stage_process(tmp_path):
    recipe = _endless_stage(tmp_path)
    known, child = {p.pid for p in _forkserver_children()}, {}

    def interrupt_once_it_runs():
        try:
            child["process"] = _stage_process(known)
        finally:
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_it_runs, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_apart(recipe, "scorer", "teacher", {})
    assert not child["process"].is_running()  # stopped (SIGTERM) and reaped before run_apart returned


def test_one_process_when_the_environment_asks(monkeypatch, tmp_path):
    recipe = _tiny(tmp_path)
    assert stage_process.apart(recipe, "scorer", {}) is not None
    monkeypatch.setenv(stage_process.ONE_PROCESS_ENV, "1")
    assert stage_process.apart(recipe, "scorer", {}) is None


def test_an_unknown_kind_of_stage_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown kind of stage 'nope'"):
        run_apart(_tiny(tmp_path), "nope", "teacher", {})
