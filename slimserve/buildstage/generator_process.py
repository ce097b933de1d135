"""The generator stages in a process of their own (``run_generator_apart``).

A build runs the scorer's stages first, in the process of ``slimserve build`` (or ``slimserve up``, which
serves the scorer meanwhile). The same PyTorch passes ran up to 1.7x slower there, after the scorer's
stages, than in a fresh process on the same machine minutes apart (docs/build-times.md, "The generator's
stages in a process of their own"), so the generator's five stages run in a child process:
``python -m slimserve.buildstage.generator_process RECIPE_JSON RESULT_JSON``. It reads the recipe the
build wrote, runs ``generator_stages.run_generator`` and writes the seconds per stage and, on failure,
the error to ``RESULT_JSON``; the stages write their outputs to the work directory as always, so the
parent reads the rows from there. Its log lines and progress bars go to the parent's terminal.
"""

from __future__ import annotations

import atexit
import json
import logging
import subprocess
import sys
from pathlib import Path

from .. import atomic
from ..errors import BuildError, StageError, UserError
from .recipe import Recipe

log = logging.getLogger(__name__)

RESULT_FILE = "generator_process.json"  # in the work directory: {"seconds": {...}, "error": {...}}
_ERRORS = {cls.__name__: cls for cls in (BuildError, StageError, UserError)}  # raised again in the parent
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def run_generator_apart(ctx, seconds: dict[str, float]) -> list:
    """``generator_stages.run_generator(ctx, seconds)`` in a child process: the same rows (read from the
    stage directories), the same gates, the same errors (``BuildError``, ``StageError``, ``UserError``
    with the child's message); ``ctx``'s teacher is the fine-tuned one afterwards, as in-process. When
    every stage finished before, no child is started (a second ``slimserve up`` serves in seconds)."""
    from . import generator_stages

    if generator_stages.all_done(ctx):
        return generator_stages.run_generator(ctx, seconds)
    work = ctx.recipe.resolved_work_dir()
    recipe_file, result_file = work / "generator_recipe.json", work / RESULT_FILE
    atomic.write_text(recipe_file, ctx.recipe.model_dump_json(indent=2) + "\n")
    result_file.unlink(missing_ok=True)
    command = [sys.executable, "-m", __name__, str(recipe_file), str(result_file), *_log_format()]
    child = subprocess.Popen(command)
    stop = lambda: child.poll() is None and child.terminate()  # noqa: E731  (the parent exits first)
    atexit.register(stop)
    try:
        code = child.wait()
    finally:
        atexit.unregister(stop)
        stop()
    result = json.loads(result_file.read_text()) if result_file.is_file() else {}
    seconds.update(result.get("seconds", {}))
    error = result.get("error")
    if error is not None:
        raise _ERRORS.get(error["kind"], BuildError)(error["message"])
    if code != 0:
        raise BuildError(f"the generator stages' process exited with code {code} (its log is above)")
    if "gen_finetune" in generator_stages.active_stages(ctx.settings):  # as ``run_generator`` does
        generator_stages.use_finetuned_teacher(ctx)
    return generator_stages.saved_rows(ctx)


def _log_format() -> tuple[str, str]:
    """The format and date format of the parent's log lines (its first handler's), for the child's."""
    handlers = logging.getLogger().handlers
    formatter = handlers[0].formatter if handlers else None
    return getattr(formatter, "_fmt", None) or _LOG_FORMAT, getattr(formatter, "datefmt", None) or ""


class _Defaults(logging.Filter):
    """Fields a parent's format may name that the child's records lack (a service's request id)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = "-"
        return True


def _die_with_parent() -> None:
    """Ask Linux to end this process when its parent does (elsewhere the parent's atexit does it)."""
    import contextlib
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def main(argv: list[str]) -> int:
    from ..signals import exit_on_sigterm
    from .generator_stages import run_generator, standalone_context

    recipe_file, result_file, log_format, date_format = argv
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(log_format, date_format or None))
    handler.addFilter(_Defaults())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    exit_on_sigterm()
    _die_with_parent()
    recipe = Recipe.model_validate_json(Path(recipe_file).read_text())
    seconds: dict[str, float] = {}
    result: dict = {"seconds": seconds}
    code = 0
    try:
        run_generator(standalone_context(recipe), seconds)
    except tuple(_ERRORS.values()) as exc:
        result["error"] = {"kind": type(exc).__name__, "message": str(exc)}
        code = 2
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the parent reports it
        code = 130
    finally:
        atomic.write_text(Path(result_file), json.dumps(result) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
