"""The build GPU: its compute capability, the precision it supports, and the engine file named after it.

An engine runs only on the GPU architecture (and TensorRT version) that built it, so each one is written as
``model_sm<major><minor>.plan`` and Triton picks it through ``cc_model_filenames`` ("9.0" -> that file).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Literal

from ...errors import BuildError

Precision = Literal["int8", "fp8"]
PrecisionChoice = Literal["auto", "int8", "fp8"]
ComputeCapability = tuple[int, int]

# FP8 tensor cores: Ada (8.9) and Hopper (9.0) onwards.
FP8_MIN_CC: ComputeCapability = (8, 9)
# INT8 tensor cores in TensorRT 10: Turing (7.5) onwards.
INT8_MIN_CC: ComputeCapability = (7, 5)


def choose_precision(requested: PrecisionChoice, cc: ComputeCapability) -> Precision:
    """``auto``: FP8 where the GPU has FP8 tensor cores, else INT8; an explicit choice is checked."""
    if cc < INT8_MIN_CC:
        raise BuildError(
            f"GPU compute capability {cc_key(cc)} is below {cc_key(INT8_MIN_CC)}: no INT8 engines"
        )
    if requested == "auto":
        return "fp8" if cc >= FP8_MIN_CC else "int8"
    if requested == "fp8" and cc < FP8_MIN_CC:
        raise BuildError(
            f"tensorrt.precision: fp8 needs compute capability {cc_key(FP8_MIN_CC)} or newer, this GPU is "
            f"{cc_key(cc)}; use int8 or auto"
        )
    if requested not in ("int8", "fp8"):
        raise BuildError(f"tensorrt.precision: unknown value {requested!r} (allowed: auto, int8, fp8)")
    return requested


def cc_key(cc: ComputeCapability) -> str:
    """Triton's ``cc_model_filenames`` key: ``"9.0"``."""
    return f"{cc[0]}.{cc[1]}"


def plan_filename(cc: ComputeCapability) -> str:
    return f"model_sm{cc[0]}{cc[1]}.plan"


PLAN_NAME = re.compile(r"^model_sm(\d+)(\d)\.plan$")  # minor versions are one digit


def cc_of_plan(filename: str) -> ComputeCapability:
    """Inverse of :func:`plan_filename`."""
    match = PLAN_NAME.match(filename)
    if not match:
        raise ValueError(f"{filename!r} is not an engine file name like model_sm90.plan")
    return int(match.group(1)), int(match.group(2))


def parse_compute_cap(text: str) -> ComputeCapability:
    """``"8.9"`` (as ``nvidia-smi --query-gpu=compute_cap`` prints it) -> (8, 9)."""
    match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", text)
    if not match:
        raise ValueError(f"not a compute capability: {text!r}")
    return int(match.group(1)), int(match.group(2))


def compute_capability(device: int = 0) -> ComputeCapability:
    """Compute capability of CUDA device ``device`` (torch if it sees CUDA, else ``nvidia-smi``)."""
    try:
        import torch

        if torch.cuda.is_available():
            return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]
    except ImportError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise BuildError(
            "the tensorrt target needs an NVIDIA GPU: torch sees no CUDA device and nvidia-smi is missing"
        )
    out = subprocess.run(
        [smi, "--query-gpu=compute_cap", "--format=csv,noheader", f"--id={device}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise BuildError(
            f"nvidia-smi could not report GPU {device}: {out.stderr.strip() or out.stdout.strip()}"
        )
    return parse_compute_cap(out.stdout.splitlines()[0])
