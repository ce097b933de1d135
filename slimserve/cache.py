"""Where slimserve keeps things it derives once per machine (tokenizers, Triton backend folders)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$SLIMSERVE_CACHE`` (default ``~/.cache/slimserve``) joined with ``parts``, created."""
    root = Path(os.environ.get("SLIMSERVE_CACHE") or Path.home() / ".cache" / "slimserve")
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
