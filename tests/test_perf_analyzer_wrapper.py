"""The perf_analyzer the install puts on the venv's PATH runs by hand (its libraries found)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slimserve.bench import perf_analyzer as pa

BIN = Path(sys.executable).parent
REAL = BIN.parent / "lib" / f"perf_analyzer-{pa.PERF_ANALYZER_VERSION}" / "perf_analyzer"


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}


def _run(binary: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *args], capture_output=True, text=True, env=_clean_env(), timeout=60)


def _elf_binary() -> Path:
    for candidate in (
        REAL,
        BIN / "perf_analyzer",
        pa.cache_dir("perf_analyzer", pa.PERF_ANALYZER_VERSION) / "perf_analyzer",
    ):
        if candidate.is_file() and candidate.read_bytes()[:4] == b"\x7fELF":
            return candidate
    pytest.skip("no perf_analyzer binary installed (tritonclient 2.51.0 wheel)")


def test_venv_perf_analyzer_runs_as_it_is():
    entry = BIN / "perf_analyzer"
    if not entry.is_file():
        pytest.skip(f"no {entry}")
    done = _run(entry, "--version")
    output = done.stdout + done.stderr
    assert "cannot open shared object file" not in output
    assert done.returncode == 0 and pa.PERF_ANALYZER_VERSION in output, output


def test_wrap_moves_the_binary_behind_a_script_and_is_idempotent(tmp_path):
    binary = _elf_binary()
    try:
        pa._pytriton_libs()
    except pa.PerfAnalyzerError as exc:
        pytest.skip(str(exc))
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    entry = bin_dir / "perf_analyzer"
    entry.symlink_to(binary)  # what pip leaves there (a link: no 20 MB copy)

    assert pa.wrap_venv_binary(bin_dir) == entry
    script = entry.read_text()
    assert pa.WRAPPER_MARK in script and os.access(entry, os.X_OK)
    real = tmp_path / "venv" / "lib" / f"perf_analyzer-{pa.PERF_ANALYZER_VERSION}" / "perf_analyzer"
    assert real.resolve() == binary.resolve()
    done = _run(entry, "--version")
    assert done.returncode == 0 and pa.PERF_ANALYZER_VERSION in done.stdout + done.stderr, done.stderr

    before = entry.stat().st_mtime_ns
    pa.wrap_venv_binary(bin_dir)  # again: nothing to do
    assert entry.read_text() == script and entry.stat().st_mtime_ns == before

    entry.unlink()
    entry.symlink_to(binary)  # a reinstall of tritonclient puts the binary back
    pa.wrap_venv_binary(bin_dir)
    assert entry.read_text() == script and _run(entry, "--version").returncode == 0

    entry.unlink()
    entry.write_text("#!/bin/sh\necho something else\n")
    with pytest.raises(pa.PerfAnalyzerError, match="left alone"):
        pa.wrap_venv_binary(bin_dir)
