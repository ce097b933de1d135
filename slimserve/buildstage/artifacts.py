"""Stage outputs on disk: models, logits, rows, and the done-marker that makes stages resumable."""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from pathlib import Path

import numpy as np

from .. import atomic
from ..evaluation.report import StageRow

DONE_FILE = "done.json"

# the fine-tuned teacher's FP32 scoring graph, in its stage's directory (``bench compare`` serves it)
SPEED_STAGE = "speed"
TEACHER_GRAPH = Path("teacher_fp32") / "model.onnx"


def config_hash(config: dict) -> str:
    """Stable hash of a stage's resolved settings (what makes its output valid)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def is_done(stage_dir: Path, config: dict) -> bool:
    """True when the stage finished before with the same settings."""
    marker = stage_dir / DONE_FILE
    return marker.is_file() and json.loads(marker.read_text()).get("config_hash") == config_hash(config)


def run_id(stage_dir: Path) -> str | None:
    """The id of the finished run of a stage (new each time it runs), or None when it has not finished."""
    marker = stage_dir / DONE_FILE
    return json.loads(marker.read_text()).get("run") if marker.is_file() else None


def mark_done(stage_dir: Path, config: dict, summary: dict | None = None) -> None:
    """Write the stage's resolved settings and its done-marker (last, so a crash leaves no marker)."""
    stage_dir.mkdir(parents=True, exist_ok=True)
    atomic.write_text(
        stage_dir / "config.json", json.dumps(config, indent=2, sort_keys=True, default=str) + "\n"
    )
    payload = {"config_hash": config_hash(config), "run": uuid.uuid4().hex, **(summary or {})}
    atomic.write_text(stage_dir / DONE_FILE, json.dumps(payload, indent=2, default=str) + "\n")


def prepare_stage(stage_dir: Path, config: dict) -> None:
    """Make ``stage_dir`` ready to run: keep an unfinished run's checkpoint only when it was started with
    the same settings (recorded in ``started.json``), else start from an empty directory."""
    marker = stage_dir / "started.json"
    resumable = marker.is_file() and json.loads(marker.read_text()).get("config_hash") == config_hash(config)
    if not resumable:
        reset(stage_dir)
        marker.write_text(json.dumps({"config_hash": config_hash(config)}) + "\n")


def reset(stage_dir: Path) -> None:
    """Remove a stage's previous (unfinished or outdated) output."""
    if stage_dir.exists():
        shutil.rmtree(stage_dir)
    stage_dir.mkdir(parents=True)


def save_arrays(stage_dir: Path, **arrays: np.ndarray) -> None:
    for name, array in arrays.items():
        np.save(stage_dir / f"{name}.npy", array)


def load_array(stage_dir: Path, name: str) -> np.ndarray:
    return np.load(stage_dir / f"{name}.npy")


ROWS_FILE = "rows.json"  # a scorer stage's rows


def save_rows(stage_dir: Path, rows: list[StageRow], name: str = ROWS_FILE) -> None:
    atomic.write_text(stage_dir / name, json.dumps([r.as_dict() for r in rows], indent=2) + "\n")


def load_rows(stage_dir: Path, name: str = ROWS_FILE) -> list[StageRow]:
    rows = []
    for data in json.loads((stage_dir / name).read_text()):
        data.pop("non_embedding_parameters", None)
        rows.append(StageRow(**{k: (float("nan") if v is None else v) for k, v in data.items()}))
    return rows


def save_causal_lm(model, directory: Path) -> None:
    """``save_pretrained``, also for models loaded from GGUF (which refuse to save as they are)."""
    try:
        model.save_pretrained(directory)
    except Exception:  # transformers refuses GGUF-marked models: save a plain copy instead
        plain = type(model)(model.config)
        plain.load_state_dict(model.state_dict())
        plain.save_pretrained(directory)


def load_causal_lm(directory: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(directory), dtype="float32").eval()


def parameter_counts(model) -> tuple[int, int]:
    """(all parameters, embedding parameters); tied weights counted once."""
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    return total, embedding
