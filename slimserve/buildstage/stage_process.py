"""A build stage in a process of its own (``run_apart``).

The same PyTorch passes ran up to 1.7x slower in a process that had run other stages before than in a
fresh one on the same machine minutes apart (docs/build-times.md, "Every stage in a process of its
own"), so a build runs each stage that trains, decodes or measures in a child process. The children are
forked from a clean process that has only imported the stage modules (multiprocessing's forkserver): a
child starts in milliseconds instead of the seconds it takes to import torch and transformers, and its
memory starts as fresh as that process's. The child builds what the stage reads from the recipe and the
work directory (``kind``'s ``run_stage(recipe, stage, seconds)``, through the same ``StageRunner``),
writes the stage's outputs and done-marker, and sends back the seconds and any error; the parent reads
the rows the stage saved. Log lines and progress bars go to the parent's terminal, in its format.

``SLIMSERVE_BUILD_IN_ONE_PROCESS=1`` runs every stage in the build's own process (a debugger, a profiler).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable

from ..errors import BuildError, StageError, UserError
from .recipe import Recipe

log = logging.getLogger(__name__)

ONE_PROCESS_ENV = "SLIMSERVE_BUILD_IN_ONE_PROCESS"
# kind -> the module whose ``run_stage(recipe, stage, seconds)`` runs one of its stages in the child
KINDS = {"scorer": "slimserve.buildstage.scorer_stages", "generator": "slimserve.buildstage.generator_stages"}
_PRELOAD = [__name__, *KINDS.values(), "slimserve.buildstage.stages", "slimserve.buildstage.int8_stage"]
_PRELOAD += ["transformers.models.llama.modeling_llama", "onnxruntime"]
_ERRORS = {cls.__name__: cls for cls in (BuildError, StageError, UserError)}  # raised again in the parent
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_STOP_WAIT_S = 30.0
_HELD = (signal.SIGINT, signal.SIGTERM)
_running: set = set()  # the stages' processes that run now
_stopping = threading.Event()  # set by ``stop_all``


def apart(recipe: Recipe, kind: str, seconds: dict[str, float]) -> Callable[[str], None] | None:
    """``StageRunner.apart`` for ``kind``'s stages (each ``run_apart``), or None when the environment asks
    for one process."""
    if os.environ.get(ONE_PROCESS_ENV, "") not in ("", "0"):
        return None
    return lambda stage: run_apart(recipe, kind, stage, seconds)


def run_apart(recipe: Recipe, kind: str, stage: str, seconds: dict[str, float]) -> None:
    """Run ``kind``'s ``stage`` of ``recipe`` in a child process and wait; its seconds go into ``seconds``.
    The child's ``BuildError``, ``StageError`` or ``UserError`` is raised here with its message; a child
    that ends without a result is a ``BuildError`` naming its exit code. Interrupted (Ctrl-C, SIGTERM),
    the child is stopped before this returns."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind of stage {kind!r} (known: {', '.join(KINDS)})")
    if _stopping.is_set():
        raise BuildError(f"stage {stage} not started: the build is stopping")
    context = _context()
    reader, writer = context.Pipe(duplex=False)
    arguments = (kind, stage, recipe.model_dump_json(), writer, dict(os.environ), os.getcwd(), *_log_format())
    # daemon: when the build's process exits without waiting for the stage (``slimserve up`` stopped by a
    # signal, its build thread left to the exit), multiprocessing ends the child instead of joining it
    child = context.Process(
        target=_child, args=arguments, name=f"slimserve {kind} stage {stage}", daemon=True
    )
    try:
        with _signals_held():  # a Ctrl-C while it starts must not leave it running unseen
            child.start()
            _running.add(child)
        writer.close()
        child.join()
    finally:
        _running.discard(child)
        _stop(child)
    result = _received(reader)
    seconds.update(result.get("seconds", {}))
    error = result.get("error")
    if error is not None:
        raise _ERRORS.get(error["kind"], BuildError)(error["message"])
    if child.exitcode != 0:
        raise BuildError(f"stage {stage}'s process {_ended(child.exitcode)} (its log is above)")


def stop_all() -> None:
    """Stop the stages' processes that run now and start no more (``slimserve up`` interrupted: its build
    thread is left to the process's exit)."""
    _stopping.set()
    for child in list(_running):
        child.terminate()


def _ended(code: int) -> str:
    """How a child process ended, from its exit code (negative: the signal that killed it)."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:  # a number no signal of this platform has
        name = str(-code)
    return f"was killed by {name}" + (" (out of memory?)" if -code == signal.SIGKILL else "")


def _received(reader) -> dict:
    """The child's result, or {} when it ended without sending one."""
    try:
        return reader.recv() if reader.poll() else {}
    except EOFError:
        return {}
    finally:
        reader.close()


def _context():
    """The forkserver context, its server preloading the stage modules (``spawn`` where there is none)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    return context


@contextlib.contextmanager
def _signals_held():
    """SIGINT and SIGTERM that arrive in the block take effect when it ends (in the main thread; elsewhere
    signals reach the main thread anyway)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {sig: signal.signal(sig, lambda number, _frame: held.append(number)) for sig in _HELD}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for number in held:
            signal.raise_signal(number)


def _stop(child) -> None:
    """End ``child`` if it started and still runs (the parent was interrupted), SIGKILL after
    ``_STOP_WAIT_S``."""
    if child.pid is None or child.exitcode is not None:
        return
    child.terminate()
    child.join(_STOP_WAIT_S)
    if child.exitcode is None:
        child.kill()
        child.join()


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
    """Ask Linux to end this process when its parent (the forkserver, which ends with the build) does."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _child(kind, stage, recipe_json, writer, environ, cwd, log_format, date_format) -> None:
    """The child: the parent's environment, directory and log format, then the stage; the result (seconds,
    error) goes back through ``writer``. Exit codes: 0, 2 (an error sent back), 130 (Ctrl-C)."""
    from ..signals import exit_on_sigterm

    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(log_format, date_format or None))
    handler.addFilter(_Defaults())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    logging.getLogger("slimserve.buildstage.context").setLevel(logging.WARNING)  # its data line: the parent's
    exit_on_sigterm()
    _die_with_parent()
    seconds: dict[str, float] = {}
    result: dict = {"seconds": seconds}
    code = 0
    try:
        importlib.import_module(KINDS[kind]).run_stage(
            Recipe.model_validate_json(recipe_json), stage, seconds
        )
    except tuple(_ERRORS.values()) as exc:
        result["error"] = {"kind": type(exc).__name__, "message": str(exc)}
        code = 2
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the parent reports it
        code = 130
    finally:
        writer.send(result)
        writer.close()
    if code:
        raise SystemExit(code)
