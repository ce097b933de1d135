"""Whole-or-nothing file writes: a reader (or a resumed build) sees the old file or the new one, never a
half-written one, and a hard-linked copy of the old file keeps its content."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    """``write_bytes`` of ``text`` as UTF-8."""
    write_bytes(path, bytes(text, "utf-8"))
