"""Waiting for Ctrl-C or SIGTERM in the foreground commands, without tracebacks; SIGTERM as an exit
that runs cleanups everywhere else."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable


def wait_for_stop_signal(alive: Callable[[], bool] = lambda: True, poll_s: float = 0.5) -> str:
    """Block until SIGINT/SIGTERM arrives or ``alive()`` turns false; returns the reason."""
    stop = threading.Event()
    reason = {"why": "stopped"}

    def _handler(signum, _frame):
        reason["why"] = signal.Signals(signum).name
        stop.set()

    previous = {sig: signal.signal(sig, _handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(poll_s):
            if not alive():
                return "process exited"
        return reason["why"]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


SIGTERM_EXIT_CODE = 128 + signal.SIGTERM


def exit_on_sigterm() -> None:
    """Make SIGTERM raise ``SystemExit`` (code 143) in the main thread, so ``finally`` blocks and
    ``atexit`` hooks run (a Triton a command started is stopped, never left running). Commands that
    wait for signals themselves replace this handler while they wait."""

    def _exit(_signum, _frame):
        raise SystemExit(SIGTERM_EXIT_CODE)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit)
