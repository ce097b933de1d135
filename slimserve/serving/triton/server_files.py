"""Locate the ``tritonserver`` binary and prepare a python-backend folder for the running interpreter.

The ``nvidia-pytriton`` wheel carries Triton 2.51 (``pytriton/tritonserver/bin/tritonserver``), its python
backend (``backends/python/``) and one ``triton_python_backend_stub`` per Python minor version
(``python_backend_stubs/3.X/``). Triton looks for the stub next to ``libtriton_python.so``, so we build
``<cache>/triton-backends/py3.X/python/`` holding symlinks to the three files (measured: symlinks need no
``LD_LIBRARY_PATH``, the binaries' ``$ORIGIN`` RPATH resolves through them). Nothing is written into
site-packages, and pytriton's own (heavy) modules are never imported.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")
STUB_NAME = "triton_python_backend_stub"


def cache_root(cache_dir: Path | str | None = None) -> Path:
    """``cache_dir``, else ``$SLIMSERVE_CACHE``, else ``~/.cache/slimserve``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("SLIMSERVE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "slimserve"


def pytriton_dir() -> Path | None:
    """The installed ``pytriton`` package folder, found without importing it (None when absent)."""
    spec = importlib.util.find_spec("pytriton")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    try:
        located = Path(str(importlib.metadata.distribution("nvidia-pytriton").locate_file("pytriton")))
    except importlib.metadata.PackageNotFoundError:
        return None
    return located if located.is_dir() else None


def _pytriton_server_dir() -> Path | None:
    root = pytriton_dir()
    return root / "tritonserver" if root is not None else None


def find_tritonserver() -> Path:
    """``tritonserver`` on ``PATH``, else the binary in the nvidia-pytriton wheel; FileNotFoundError if none."""
    on_path = shutil.which("tritonserver")
    if on_path:
        return Path(on_path)
    server_dir = _pytriton_server_dir()
    if server_dir is not None:
        binary = server_dir / "bin" / "tritonserver"
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    raise FileNotFoundError(
        "no tritonserver binary: none on PATH and nvidia-pytriton is not installed "
        "(pip install 'slimserve[triton]', or run inside a Triton container)"
    )


def is_pytriton_binary(binary: Path) -> bool:
    """Whether ``binary`` is the wheel's server (which needs a prepared backend directory)."""
    server_dir = _pytriton_server_dir()
    return server_dir is not None and Path(binary).resolve().is_relative_to(server_dir.resolve())


def _backend_sources(python_version: str) -> dict[str, Path]:
    server_dir = _pytriton_server_dir()
    if server_dir is None:
        raise FileNotFoundError("nvidia-pytriton is not installed: no python backend to prepare")
    backend = server_dir / "backends" / "python"
    sources = {name: backend / name for name in BACKEND_FILES}
    sources[STUB_NAME] = server_dir / "python_backend_stubs" / python_version / STUB_NAME
    missing = [str(path) for path in sources.values() if not path.is_file()]
    if missing:
        raise FileNotFoundError(
            f"nvidia-pytriton lacks python backend files for Python {python_version}: {missing}"
        )
    return sources


def _is_complete(python_dir: Path, sources: dict[str, Path]) -> bool:
    for name, source in sources.items():
        link = python_dir / name
        if not link.is_symlink() or link.resolve() != source.resolve():
            return False
    return True


def prepare_python_backend(cache_dir: Path | str | None = None) -> Path:
    """Prepare (once) and return the ``--backend-directory`` for this interpreter's python backend.

    The folder is ``<cache>/triton-backends/py3.X/`` with a ``python/`` subfolder. It is built in a
    temporary folder and renamed into place, so concurrent callers never see half a folder; one left by
    another environment (symlinks to other files) is replaced.
    """
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    sources = _backend_sources(version)
    parent = cache_root(cache_dir) / "triton-backends"
    final = parent / f"py{version}"
    if _is_complete(final / "python", sources):
        return final
    parent.mkdir(parents=True, exist_ok=True)
    for _attempt in range(5):
        staging = Path(tempfile.mkdtemp(prefix=f".py{version}-", dir=parent))
        (staging / "python").mkdir()
        for name, source in sources.items():
            (staging / "python" / name).symlink_to(source.resolve())
        try:
            os.rename(staging, final)
            return final
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
        if _is_complete(final / "python", sources):
            return final  # another process won the race
        # A stale or broken folder: move it aside atomically, then retry.
        trash = Path(tempfile.mkdtemp(prefix=f".stale-py{version}-", dir=parent))
        with contextlib.suppress(OSError):
            os.rename(final, trash / "old")
        shutil.rmtree(trash, ignore_errors=True)
    raise OSError(f"could not prepare the python backend folder {final}")
