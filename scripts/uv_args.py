"""Print, one per line, the `uv pip install` options that carry pip's own configuration.

uv does not read pip's configuration files or PIP_* variables; scripts/install.sh installs with uv
(several times faster than pip) and passes it what `pip config list` says: index URLs, find-links,
constraint files and no-index. A local index directory that does not exist is left out, as pip
ignores it. Run with the interpreter whose pip configuration applies (the venv's).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

# pip option -> the uv option that means the same (each value of a list becomes one option)
OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def _exists(location: str) -> bool:
    """False only for a local path or file:// URL that is not there."""
    parsed = urlparse(location)
    if parsed.scheme in ("http", "https"):
        return True
    path = unquote(parsed.path) if parsed.scheme == "file" else location
    return Path(path).exists()


def uv_args(config_lines: list[str]) -> list[str]:
    """uv options from the lines of `pip config list` (``scope.key='value'``)."""
    args: list[str] = []
    seen: set[tuple[str, str]] = set()  # a setting in several scopes (global, :env:) is passed once
    for line in config_lines:
        name, _, raw = line.partition("=")
        key = name.rpartition(".")[2]
        values = shlex.split(raw)[0].split() if raw.strip() else []
        if key == "no-index" and values and values[0].lower() in ("1", "true", "yes", "on"):
            args.append("--no-index")
        elif key in OPTIONS:
            for value in values:
                if _exists(value) and (key, value) not in seen:
                    seen.add((key, value))
                    args += [OPTIONS[key], value]
    return args


def main() -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    )
    print("\n".join(uv_args(listed.stdout.splitlines())))


if __name__ == "__main__":
    main()
