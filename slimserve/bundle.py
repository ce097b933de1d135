"""The serving bundle: everything a service needs to speak for one model version.

Written by the export next to the Triton model (``<repo>/<model>/<version>/bundle/``), read by the
services. Its ``content_hash`` covers the tokenizer, the prompt template version, the label tokens, the
length buckets and the model weights; the same hash is stamped into the Triton model's config
(parameter ``slimserve_bundle_hash``) so a service refuses to serve a model it was not built for.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import UserError

BUNDLE_DIR = "bundle"
BUNDLE_FILE = "bundle.json"
TOKENIZER_FILE = "tokenizer.json"
BUNDLE_HASH_PARAMETER = "slimserve_bundle_hash"
BUNDLE_SCHEMA_VERSION = 1


class BundleError(UserError, ValueError):
    """A serving bundle is missing, malformed or does not match its content."""


@dataclass(frozen=True)
class TensorNames:
    """Tensor names shared by the ONNX graph, the Triton config, the bundle and the client."""

    input_ids: str = "input_ids"
    attention_mask: str = "attention_mask"
    score: str = "score"
    # Extra output of the CPU python-backend scorer: compute time of the batch the request ran in.
    compute_ms: str = "compute_ms"
    # The multi-item scorer's inputs: one member prefix, many item suffixes.
    prefix_ids: str = "prefix_ids"
    prefix_mask: str = "prefix_mask"
    item_ids: str = "item_ids"
    item_mask: str = "item_mask"


SCORING_SINGLE = "single"  # one sequence per candidate: input_ids, attention_mask -> score
SCORING_MULTI_ITEM = "multi_item"  # one prefix per call, the candidates as item suffixes -> score
SCORING_MODES = (SCORING_SINGLE, SCORING_MULTI_ITEM)


@dataclass(frozen=True)
class PromptSplit:
    """How a split scoring prompt is tokenized: the member prefix and each item suffix on their own,
    each cut to its budget (head and tail kept), then concatenated (prefix first)."""

    prefix_max_tokens: int = 320
    item_max_tokens: int = 128


@dataclass(frozen=True)
class ServingBundle:
    """What a service must know about the model version it calls."""

    model_name: str
    model_version: int
    task: str
    prompt_template_version: str
    yes_token_id: int
    no_token_id: int
    length_buckets: tuple[int, ...]
    max_batch_size: int
    tokenizer_sha256: str
    source_model: str = ""
    tensors: TensorNames = field(default_factory=TensorNames)
    # Multi-item scoring (absent in bundles written before it: single-sequence, whole-text prompts).
    scoring_mode: str = SCORING_SINGLE
    prompt_split: PromptSplit | None = None
    item_length_buckets: tuple[int, ...] = ()
    max_items_per_request: int = 0
    content_hash: str = ""

    def __post_init__(self):
        if self.scoring_mode not in SCORING_MODES:
            raise BundleError(f"scoring_mode: {self.scoring_mode!r} is not one of {SCORING_MODES}")
        if self.scoring_mode == SCORING_MULTI_ITEM and (
            self.prompt_split is None or not self.item_length_buckets or self.max_items_per_request < 1
        ):
            raise BundleError(
                "a multi_item bundle needs prompt_split, item_length_buckets and max_items_per_request >= 1"
            )

    @property
    def max_length(self) -> int:
        """Longest sequence the model accepts (the largest bucket)."""
        return max(self.length_buckets)

    @property
    def multi_item(self) -> bool:
        return self.scoring_mode == SCORING_MULTI_ITEM

    def manifest(self) -> dict:
        """The bundle as JSON-ready data (what ``bundle.json`` holds)."""
        data = asdict(self)
        data["length_buckets"] = list(self.length_buckets)
        data["item_length_buckets"] = list(self.item_length_buckets)
        data["schema_version"] = BUNDLE_SCHEMA_VERSION
        return data

    def write(self, directory: Path, tokenizer_file: Path) -> Path:
        """Write the bundle into ``directory`` (what ``publish_version`` calls for any bundle type)."""
        return write_bundle(self, directory, tokenizer_file)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def compute_content_hash(bundle: ServingBundle, weight_hashes: dict[str, str]) -> str:
    """Hash of the bundle's fields (without the hash itself) and of the model's weight files."""
    manifest = bundle.manifest()
    manifest.pop("content_hash", None)
    payload = json.dumps({"bundle": manifest, "weights": weight_hashes}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def write_manifest(directory: Path, file_name: str, manifest: dict, tokenizer_file: Path) -> Path:
    """Write a bundle's JSON ``manifest`` as ``file_name`` and copy the tokenizer into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / TOKENIZER_FILE).write_bytes(Path(tokenizer_file).read_bytes())
    path = directory / file_name
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return path


def write_bundle(bundle: ServingBundle, directory: Path, tokenizer_file: Path) -> Path:
    """Write ``bundle.json`` and the tokenizer into ``directory`` (created)."""
    return write_manifest(directory, BUNDLE_FILE, bundle.manifest(), tokenizer_file)


def read_manifest(path: Path, schema_version: int, what: str = "serving bundle") -> dict:
    """A bundle's JSON manifest without its ``schema_version``; ``BundleError`` when absent or wrong."""
    if not path.is_file():
        raise BundleError(f"no {what} at {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise BundleError(f"{path} is not valid JSON: {exc}") from exc
    schema = data.pop("schema_version", None)
    if schema != schema_version:
        raise BundleError(f"{path}: schema_version {schema!r}, expected {schema_version}")
    return data


def check_bundle_files(directory: Path, manifest_file: str, tokenizer_sha256: str, content_hash: str) -> None:
    """The tokenizer next to a manifest must match its hash, and the manifest must carry a content hash."""
    tokenizer = directory / TOKENIZER_FILE
    if not tokenizer.is_file():
        raise BundleError(f"{directory}: missing {TOKENIZER_FILE}")
    if sha256_file(tokenizer) != tokenizer_sha256:
        raise BundleError(f"{tokenizer}: content does not match tokenizer_sha256 in {manifest_file}")
    if not content_hash:
        raise BundleError(f"{directory / manifest_file}: content_hash is empty")


def load_bundle(directory: Path) -> ServingBundle:
    """Read and check a bundle directory; raise ``BundleError`` naming what is wrong."""
    directory = Path(directory)
    path = directory / BUNDLE_FILE
    data = read_manifest(path, BUNDLE_SCHEMA_VERSION)
    try:
        tensors = TensorNames(**data.pop("tensors", {}))
        split = data.pop("prompt_split", None)
        bundle = ServingBundle(
            **{
                **data,
                "length_buckets": tuple(data["length_buckets"]),
                "item_length_buckets": tuple(data.get("item_length_buckets", ())),
                "prompt_split": None if split is None else PromptSplit(**split),
                "tensors": tensors,
            }
        )
    except (TypeError, KeyError) as exc:
        raise BundleError(f"{path}: malformed bundle: {exc}") from exc
    check_bundle_files(directory, BUNDLE_FILE, bundle.tokenizer_sha256, bundle.content_hash)
    return bundle


def bundle_dir_for(repository: Path, model_name: str, version: int | None = None) -> Path:
    """The bundle directory of a model version in a repository (latest version when None)."""
    model_dir = Path(repository) / model_name
    if version is None:
        versions = (
            sorted(int(p.name) for p in model_dir.iterdir() if p.name.isdigit()) if model_dir.is_dir() else []
        )
        if not versions:
            raise BundleError(f"no published version of model {model_name!r} in {repository}")
        version = versions[-1]
    return model_dir / str(version) / BUNDLE_DIR
