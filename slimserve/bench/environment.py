"""What a report records about where it ran: machine, load, and package versions."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path

PACKAGES = (
    "slimserve",
    "numpy",
    "onnxruntime",
    "torch",
    "transformers",
    "tokenizers",
    "grpcio",
    "tritonclient",
    "nvidia-pytriton",
    "matplotlib",
)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return None


def machine_info() -> dict:
    """CPU model, cores, memory, OS, Python, and the load average when called."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    memory = _memory_gb()
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gb": round(memory, 1) if memory else None,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "load_average_1_5_15": [round(v, 2) for v in load],
    }


def versions() -> dict[str, str]:
    """Installed versions of the packages a benchmark depends on (Triton 2.51.0 comes with nvidia-pytriton)."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    found["tritonserver"] = (
        "2.51.0 (nvidia-pytriton wheel)" if found["nvidia-pytriton"] != "not installed" else "?"
    )
    return found
