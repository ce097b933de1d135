"""hf2onnx for the generator: a Llama causal LM -> ONNX decoder with a KV cache, via ONNX Runtime GenAI.

The graph is built by ONNX Runtime GenAI's model builder (``onnxruntime_genai.models.builder``), run in a
subprocess (it prints a lot and holds a second copy of the weights). It writes fused CPU operators
(``GroupQueryAttention`` with rotary embedding, ``SkipSimplifiedLayerNormalization``) and, for ``int8`` /
``int4``, block-wise weight-only ``MatMulNBits``. ``prune_lm_head`` makes the LM head run on the last
position only, so the output is ``logits`` [batch, 1, vocab]: a prompt's prefill costs one LM-head row.
Why this path and not a hand-written wrapper: see docs/generator.md.
"""

from __future__ import annotations

import copy
import logging
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..bundle import TOKENIZER_FILE
from .onnx_export import ExportError

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "int8", "int4")
ONNX_FILE = "model.onnx"
BUILDER_LOG = "builder.log"
DEFAULT_EXTRA_OPTIONS = {"prune_lm_head": "true"}


@dataclass(frozen=True)
class DecoderGraph:
    """A built decoder: its graph file, every file it needs, its precision and build time."""

    onnx_path: Path
    files: tuple[Path, ...]
    precision: str
    seconds: float

    @property
    def size_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.files)


def save_hf_model(model, directory: Path, tokenizer_file: Path | None = None) -> Path:
    """Save a transformers causal LM (float32 safetensors + config) where the builder can read it.

    A model loaded from GGUF is marked quantized and refuses ``save_pretrained``: its weights are then
    copied into a fresh model of the same config first.
    """
    import torch

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    try:
        model.save_pretrained(directory)
    except Exception as exc:  # GGUF-loaded models: "quantized" mark
        log.info("save_pretrained refused (%s): saving a fresh copy of the weights", exc)
        config = copy.deepcopy(model.config)
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        with torch.no_grad():
            fresh = type(model)(config)
            fresh.load_state_dict(model.state_dict())
        fresh.save_pretrained(directory)
    if tokenizer_file is not None:
        shutil.copy(tokenizer_file, directory / TOKENIZER_FILE)
    return directory


def build_decoder_onnx(
    hf_dir: Path,
    out_dir: Path,
    precision: str = "fp32",
    extra_options: Mapping[str, str] | None = None,
    timeout_s: float = 3600,
) -> DecoderGraph:
    """Run the model builder on a HF model directory; returns the graph written to ``out_dir``."""
    if precision not in PRECISIONS:
        raise ExportError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    options = {**DEFAULT_EXTRA_OPTIONS, **(extra_options or {})}
    command = [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "--input",
        str(hf_dir),
        "--output",
        str(out_dir),
        "--precision",
        precision,
        "--execution_provider",
        "cpu",
        "--cache_dir",
        str(out_dir / ".builder-cache"),
        "--extra_options",
        *[f"{key}={value}" for key, value in options.items()],
    ]
    log_path = out_dir.parent / f"{out_dir.name}.{BUILDER_LOG}"
    log.info("building the %s decoder graph (onnxruntime-genai model builder), log: %s", precision, log_path)
    started = time.perf_counter()
    with open(log_path, "w") as log_file:
        try:
            result = subprocess.run(
                command, stdout=log_file, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise ExportError(f"the model builder ran past {timeout_s:.0f} s (log: {log_path})") from exc
    shutil.rmtree(out_dir / ".builder-cache", ignore_errors=True)
    onnx_path = out_dir / ONNX_FILE
    if result.returncode != 0 or not onnx_path.is_file():
        tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-15:])
        raise ExportError(f"the model builder failed (exit {result.returncode}, log {log_path}):\n{tail}")
    files = [onnx_path, *sorted(out_dir.glob(f"{ONNX_FILE}.data"))]
    graph = DecoderGraph(onnx_path, tuple(files), precision, time.perf_counter() - started)
    log.info(
        "%s decoder: %s (%.1f MB) in %.1f s", precision, onnx_path, graph.size_bytes / 1e6, graph.seconds
    )
    return graph
