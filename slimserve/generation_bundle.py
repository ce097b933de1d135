"""The generator's serving bundle: ``<repo>/generator/<version>/bundle/{generation.json,tokenizer.json}``.

Written at publish (``slimserve.export.generator_repository``), read by the Triton model ``generator``
(eos ids and limits) and by the ReasoningService (template version, limits, tokenizer). Its
``content_hash`` covers these fields and the model's weight files, and is stamped into the Triton config
as ``slimserve_bundle_hash`` like the scorer's bundle.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .bundle import BUNDLE_DIR, TOKENIZER_FILE, BundleError, sha256_file

GENERATION_FILE = "generation.json"
GENERATION_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class GenerationBundle:
    """What a service must know about the generator version it calls."""

    model_name: str
    model_version: int
    template_version: str
    eos_token_ids: tuple[int, ...]
    max_context: int
    max_new_tokens_limit: int
    vocab_size: int
    tokenizer_sha256: str
    precision: str = "fp32"
    source_model: str = ""
    task: str = "generation"
    content_hash: str = ""

    def manifest(self) -> dict:
        """The bundle as JSON-ready data (what ``generation.json`` holds)."""
        data = asdict(self)
        data["eos_token_ids"] = list(self.eos_token_ids)
        data["schema_version"] = GENERATION_SCHEMA_VERSION
        return data

    def write(self, directory: Path, tokenizer_file: Path) -> Path:
        """Write ``generation.json`` and ``tokenizer.json`` into ``directory`` (created)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / TOKENIZER_FILE).write_bytes(Path(tokenizer_file).read_bytes())
        path = directory / GENERATION_FILE
        path.write_text(json.dumps(self.manifest(), indent=2, sort_keys=True) + "\n")
        return path


def load_generation_bundle(directory: Path) -> GenerationBundle:
    """Read and check a generator bundle directory; raise ``BundleError`` naming what is wrong."""
    directory = Path(directory)
    path = directory / GENERATION_FILE
    if not path.is_file():
        raise BundleError(f"no generator bundle at {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise BundleError(f"{path} is not valid JSON: {exc}") from exc
    schema = data.pop("schema_version", None)
    if schema != GENERATION_SCHEMA_VERSION:
        raise BundleError(f"{path}: schema_version {schema!r}, expected {GENERATION_SCHEMA_VERSION}")
    known = {f.name for f in fields(GenerationBundle)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise BundleError(f"{path}: unknown fields {unknown}")
    try:
        bundle = GenerationBundle(**{**data, "eos_token_ids": tuple(data["eos_token_ids"])})
    except (TypeError, KeyError) as exc:
        raise BundleError(f"{path}: malformed generator bundle: {exc}") from exc
    tokenizer = directory / TOKENIZER_FILE
    if not tokenizer.is_file():
        raise BundleError(f"{directory}: missing {TOKENIZER_FILE}")
    if sha256_file(tokenizer) != bundle.tokenizer_sha256:
        raise BundleError(f"{tokenizer}: content does not match tokenizer_sha256 in {GENERATION_FILE}")
    if not bundle.content_hash:
        raise BundleError(f"{path}: content_hash is empty")
    return bundle


def generation_bundle_dir(
    repository: Path, model_name: str = "generator", version: int | None = None
) -> Path:
    """The bundle directory of a generator version (latest when None)."""
    from .bundle import bundle_dir_for

    if version is not None:
        return Path(repository) / model_name / str(version) / BUNDLE_DIR
    return bundle_dir_for(repository, model_name, None)
