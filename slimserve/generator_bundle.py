"""The generator's serving bundle: ``<repo>/generator/<version>/bundle/{generation.json,tokenizer.json}``.

Written at publish (``slimserve.export.generator_repository``), read by the Triton model ``generator``
(eos ids and limits) and by the ReasoningService (prompt template version, limits, tokenizer). Its
``content_hash`` covers these fields and the model's weight files, and is stamped into the Triton config
as ``slimserve_bundle_hash`` like the scorer's bundle.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .bundle import BUNDLE_DIR, BundleError, check_bundle_files, read_manifest, write_manifest

GENERATION_FILE = "generation.json"
GENERATION_SCHEMA_VERSION = 1
# Fields of bundles published under an older name (old name -> name now), read under the new one.
RENAMED_FIELDS = {"template_version": "prompt_template_version"}


@dataclass(frozen=True)
class GeneratorBundle:
    """What a service must know about the generator version it calls."""

    model_name: str
    model_version: int
    prompt_template_version: str
    eos_token_ids: tuple[int, ...]
    max_context: int
    max_new_tokens_limit: int
    vocab_size: int
    tokenizer_sha256: str
    precision: str = "fp32"
    source_model: str = ""
    task: str = "generation"
    copy_names: bool = False  # the model takes input copy_names (Explain sends the prompt's names)
    content_hash: str = ""

    def manifest(self) -> dict:
        """The bundle as JSON-ready data (what ``generation.json`` holds)."""
        data = asdict(self)
        data["eos_token_ids"] = list(self.eos_token_ids)
        data["schema_version"] = GENERATION_SCHEMA_VERSION
        return data

    def write(self, directory: Path, tokenizer_file: Path) -> Path:
        """Write ``generation.json`` and ``tokenizer.json`` into ``directory`` (created)."""
        return write_manifest(directory, GENERATION_FILE, self.manifest(), tokenizer_file)


def load_generator_bundle(directory: Path) -> GeneratorBundle:
    """Read and check a generator bundle directory; raise ``BundleError`` naming what is wrong."""
    directory = Path(directory)
    path = directory / GENERATION_FILE
    data = read_manifest(path, GENERATION_SCHEMA_VERSION, "generator bundle")
    for old, new in RENAMED_FIELDS.items():
        if old in data and new not in data:
            data[new] = data.pop(old)
    unknown = sorted(set(data) - {f.name for f in fields(GeneratorBundle)})
    if unknown:
        raise BundleError(f"{path}: unknown fields {unknown}")
    try:
        bundle = GeneratorBundle(**{**data, "eos_token_ids": tuple(data["eos_token_ids"])})
    except (TypeError, KeyError) as exc:
        raise BundleError(f"{path}: malformed generator bundle: {exc}") from exc
    check_bundle_files(directory, GENERATION_FILE, bundle.tokenizer_sha256, bundle.content_hash)
    return bundle


def generator_bundle_dir(repository: Path, model_name: str = "generator", version: int | None = None) -> Path:
    """The bundle directory of a generator version (latest when None)."""
    from .bundle import bundle_dir_for

    if version is not None:
        return Path(repository) / model_name / str(version) / BUNDLE_DIR
    return bundle_dir_for(repository, model_name, None)
