"""Quiet third-party loggers for the length of a call (exporters and quantizers log a line per node)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence


@contextlib.contextmanager
def quiet_loggers(names: Sequence[str], level: int = logging.WARNING) -> Iterator[None]:
    """While inside, the loggers ``names`` (and their children) pass only records at ``level`` or above."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, previous in zip(loggers, levels, strict=True):
            logger.setLevel(previous)
