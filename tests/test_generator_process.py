"""The generator stages in a process of their own: the child's errors come back as the parent's, with the
child's message; a child that dies without a word is a build error. (Its success path runs in every
build test: ``tests/test_build.py`` publishes the generator it trained.)"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from slimserve.buildstage import generator_process
from slimserve.buildstage.generator_process import RESULT_FILE, run_generator_apart
from slimserve.buildstage.recipe import load_recipe
from slimserve.errors import BuildError, UserError


def _context(tmp_path, **generator):
    """What ``run_generator_apart`` reads of a generator context, for a tiny recipe in ``tmp_path``."""
    recipe = load_recipe("tiny")
    recipe = recipe.model_copy(
        update={"work_dir": tmp_path / "work", "generator": recipe.generator.model_copy(update=generator)}
    )
    recipe.resolved_work_dir().mkdir(parents=True)
    return SimpleNamespace(recipe=recipe, settings=recipe.generator, work=recipe.resolved_work_dir())


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch sees no CUDA device")
def test_a_user_error_in_the_child_is_the_parents_with_its_message(tmp_path):
    ctx = _context(tmp_path, device="cuda")
    seconds: dict[str, float] = {}
    with pytest.raises(UserError, match=r"generator\.device: 'cuda' but torch sees no CUDA device"):
        run_generator_apart(ctx, seconds)
    result = json.loads((ctx.recipe.resolved_work_dir() / RESULT_FILE).read_text())
    assert result["error"]["kind"] == "UserError" and seconds == {}


def test_a_child_that_dies_without_a_result_is_a_build_error(tmp_path, monkeypatch):
    ctx = _context(tmp_path)
    real_popen = subprocess.Popen

    def dies(command, **kwargs):
        assert command[1:3] == ["-m", generator_process.__name__]
        return real_popen([sys.executable, "-c", "raise SystemExit(3)"], **kwargs)

    monkeypatch.setattr(generator_process.subprocess, "Popen", dies)
    with pytest.raises(BuildError, match="exited with code 3"):
        run_generator_apart(ctx, {})
