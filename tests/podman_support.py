"""podman for the image and manifest tests: the runner, the images `make images` builds, skip reasons.

The live tests run only where podman works and the images exist (`make images` builds them). Set
``SLIMSERVE_REQUIRE_IMAGES=1`` (``make images`` does) to make a missing piece a failure, not a skip.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONTAINERS_CONF = ROOT / "scripts" / "podman" / "containers.conf"
VERSION = importlib.metadata.version("slimserve")  # the tag scripts/images.sh gives the images
SERVICE_IMAGE = f"localhost/slimserve-service:{VERSION}"
TRITON_IMAGE = f"localhost/slimserve-triton-cpu:{VERSION}"


def podman_env() -> dict[str, str]:
    """The environment for podman: this project's containers.conf unless one is set."""
    return {"CONTAINERS_CONF": str(CONTAINERS_CONF), **os.environ}


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``podman ARGS``; on failure with ``check`` raise with podman's output."""
    result = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, env=podman_env()
    )
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def _missing(images: tuple[str, ...]) -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (make images installs it: scripts/podman-setup.sh)"
    try:
        info = podman("info", "--format", "{{.Host.OCIRuntime.Name}}", check=False, timeout=60)
    except subprocess.TimeoutExpired:
        return "podman info timed out"
    if info.returncode != 0:
        return f"podman does not work here: {info.stderr.strip()[-300:]}"
    absent = [image for image in images if podman("image", "exists", image, check=False).returncode != 0]
    if absent:
        return f"images not built: {', '.join(absent)} (run `make images`)"
    return None


def require_images(*images: str) -> None:
    """Skip (or fail, under SLIMSERVE_REQUIRE_IMAGES=1) unless podman works and ``images`` exist."""
    reason = _missing(images)
    if reason is None:
        return
    if os.environ.get("SLIMSERVE_REQUIRE_IMAGES") == "1":
        pytest.fail(reason)
    pytest.skip(reason)
