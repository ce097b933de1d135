"""Waiting for Ctrl-C or SIGTERM in the foreground commands, without tracebacks."""

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
