"""Atomic publishing of model versions into a Triton model repository.

Layout written (what Triton expects, plus the slimserve serving bundle and the model card)::

    <repo>/<model>/config.pbtxt
    <repo>/<model>/<version>/<files...>          e.g. model.py, model.onnx
    <repo>/<model>/<version>/bundle/             slimserve.bundle.write_bundle
    <repo>/<model>/<version>/MODEL_CARD.md

A new version of an existing model is assembled in ``<repo>/<model>/.staging-<uuid>`` (Triton ignores
non-numeric directories there) and moved into place with one ``os.rename``; the config is replaced
with write-temp + ``os.replace``. A brand-new model is assembled whole, config included, beside the
repository (``<repo>/../.<repo name>.staging-<uuid>/<model>``, falling back to ``<repo>/.staging-<uuid>``
when the parent is another filesystem or read-only) and renamed to ``<repo>/<model>``. On any error the staging directory is removed and the
repository is left as it was. One ``config.pbtxt`` covers every version of a model, so its
``slimserve_bundle_hash`` parameter is that of the newest version; the default version policy
(``latest { num_versions: 1 }``) makes Triton serve only that version.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from slimserve.bundle import (
    BUNDLE_DIR,
    BUNDLE_HASH_PARAMETER,
    ServingBundle,
    compute_content_hash,
    sha256_file,
)
from slimserve.export.triton_config import TritonModelSpec, render_config_pbtxt
from slimserve.generator_bundle import GeneratorBundle

CONFIG_FILE = "config.pbtxt"
MODEL_CARD_FILE = "MODEL_CARD.md"
STAGING_PREFIX = ".staging-"
CONFIG_TEMP_PREFIX = ".config.pbtxt.tmp-"
_RESERVED = {BUNDLE_DIR, MODEL_CARD_FILE}


@dataclass(frozen=True)
class PublishedVersion:
    """Where a published version lives and the content hash stamped in its bundle and config."""

    path: Path
    version: int
    content_hash: str
    config_path: Path


def list_versions(repository: Path, model: str) -> list[int]:
    """Published version numbers of a model, ascending (numeric directories only, as Triton reads them)."""
    model_dir = Path(repository) / model
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and _is_version_name(p.name))


def _is_version_name(name: str) -> bool:
    # Triton ignores non-numeric directories and those starting with "0".
    return name.isdigit() and not name.startswith("0")


def remove_stale_staging(repository: Path) -> list[Path]:
    """Remove staging directories and temp configs left by interrupted publishes; return what was removed.

    Looks inside the repository, inside each model directory and beside the repository
    (``.<repo name>.staging-*``). Only call it when no publish is running on this repository.
    """
    repository = Path(repository)
    removed: list[Path] = []
    if not repository.is_dir():
        return removed
    candidates = list(repository.glob(f"{STAGING_PREFIX}*"))
    candidates += repository.parent.glob(_sibling_staging_root(repository, "*").name)
    for model_dir in repository.iterdir():
        if model_dir.is_dir() and not model_dir.name.startswith(STAGING_PREFIX):
            candidates += model_dir.glob(f"{STAGING_PREFIX}*")
            candidates += model_dir.glob(f"{CONFIG_TEMP_PREFIX}*")
    for path in candidates:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def _sibling_staging_root(repository: Path, token: str) -> Path:
    return repository.parent / f".{repository.name}{STAGING_PREFIX}{token}"


def _same_filesystem(a: Path, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b).st_dev


def _new_model_staging_root(repository: Path, token: str) -> Path:
    """Where a brand-new model is assembled before its rename into the repository.

    Beside the repository when that is the same filesystem and writable: Triton takes every directory
    of the repository for a model, and a server starting while ``<repo>/.staging-*`` exists fails
    with "failed to load all models" (seen with Triton 2.51). Else inside the repository.
    """
    sibling = _sibling_staging_root(repository, token)
    try:
        if _same_filesystem(repository.parent, repository):
            sibling.mkdir()
            return sibling
    except OSError:
        pass
    inside = repository / f"{STAGING_PREFIX}{token}"
    inside.mkdir()
    return inside


def _place_file(source: Path, target: Path) -> None:
    """Hard-link ``source`` to ``target`` when possible (same filesystem), else copy it."""
    try:
        os.link(source, target)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES):
            raise
        shutil.copy2(source, target)


def _check_file_names(files: Mapping[str, Path]) -> None:
    for name in files:
        parts = PurePosixPath(name).parts
        if not parts or PurePosixPath(name).is_absolute() or ".." in parts or "\\" in name:
            raise ValueError(f"file name {name!r} must be a relative path inside the version directory")
        if parts[0] in _RESERVED:
            raise ValueError(f"file name {name!r} collides with {parts[0]!r}, which publish_version writes")
    for name, source in files.items():
        if not Path(source).is_file():
            raise ValueError(f"file {name!r}: source {source} does not exist or is not a file")


def publish_version(
    repository: Path,
    spec: TritonModelSpec,
    files: Mapping[str, Path],
    bundle: ServingBundle | GeneratorBundle | None,
    tokenizer_file: Path | None,
    model_card: str,
    version: int | None = None,
    weight_files: tuple[str, ...] | None = None,
    link_files: bool = True,
) -> PublishedVersion:
    """Publish ``files`` as a new version of ``spec.name`` in ``repository``, atomically.

    ``files`` maps names inside the version directory (``"model.onnx"``) to source paths. With
    ``link_files`` sources are hard-linked when on the same filesystem, else copied; a hard-linked
    source rewritten in place afterwards (``open(path, "wb")``, as ``onnx.save`` does) changes the
    published version too, so replace such files (write elsewhere, then rename) or pass
    ``link_files=False``.

    ``version`` None takes the next number after the highest existing one; an explicit version must
    not be older than the newest. ``weight_files`` names the files whose SHA-256 enters the content
    hash (None: every file in ``files``). The content hash covers the bundle (with this model name and
    version) and those weight hashes; it is written into the bundle and into the config parameter
    ``slimserve_bundle_hash``. Without a bundle it covers the model name, the version and the weights.
    """
    repository = Path(repository)
    files = {name: Path(source) for name, source in files.items()}
    _check_file_names(files)
    weights = tuple(files) if weight_files is None else tuple(weight_files)
    unknown = sorted(set(weights) - set(files))
    if unknown:
        raise ValueError(f"weight_files {unknown} are not among the published files {sorted(files)}")
    if bundle is not None:
        if tokenizer_file is None:
            raise ValueError("a bundle needs its tokenizer_file")
        if sha256_file(Path(tokenizer_file)) != bundle.tokenizer_sha256:
            raise ValueError(f"tokenizer {tokenizer_file} does not match the bundle's tokenizer_sha256")
    existing = list_versions(repository, spec.name)
    if version is None:
        version = (existing[-1] + 1) if existing else 1
    if version < 1:
        raise ValueError(f"version must be >= 1, got {version}")
    model_dir = repository / spec.name
    if (model_dir / str(version)).exists():
        raise FileExistsError(f"version {version} of model {spec.name!r} already exists in {repository}")
    if existing and version < existing[-1]:
        # The config's bundle hash must be that of the newest version, the one Triton serves.
        raise ValueError(f"version {version} is older than the newest published version {existing[-1]}")
    # Render once up front so an invalid spec fails before anything touches the disk.
    render_config_pbtxt(spec)

    repository.mkdir(parents=True, exist_ok=True)
    new_model = not model_dir.is_dir()
    token = uuid.uuid4().hex
    if new_model:
        staging_root = _new_model_staging_root(repository, token)
        staged_model = staging_root / spec.name
        staged_version = staged_model / str(version)
    else:
        staging_root = model_dir / f"{STAGING_PREFIX}{token}"
        staged_model = None
        staged_version = staging_root
    config_temp = model_dir / f"{CONFIG_TEMP_PREFIX}{token}"
    moved_version: Path | None = None
    try:
        staged_version.mkdir(parents=True, exist_ok=False)
        content_hash, config_text = _stage_version(
            staged_version, spec, files, weights, bundle, tokenizer_file, model_card, version, link_files
        )
        if new_model:
            assert staged_model is not None
            (staged_model / CONFIG_FILE).write_text(config_text)
            os.rename(staged_model, model_dir)
            staging_root.rmdir()
        else:
            config_temp.write_text(config_text)
            moved_version = model_dir / str(version)
            os.rename(staged_version, moved_version)
            os.replace(config_temp, model_dir / CONFIG_FILE)
    except BaseException:
        shutil.rmtree(staging_root, ignore_errors=True)
        config_temp.unlink(missing_ok=True)
        if moved_version is not None:
            # The version moved in but the config could not follow: take the version back out.
            shutil.rmtree(moved_version, ignore_errors=True)
        raise
    return PublishedVersion(
        path=model_dir / str(version),
        version=version,
        content_hash=content_hash,
        config_path=model_dir / CONFIG_FILE,
    )


def _stage_version(
    directory: Path,
    spec: TritonModelSpec,
    files: dict[str, Path],
    weights: tuple[str, ...],
    bundle: ServingBundle | GeneratorBundle | None,
    tokenizer_file: Path | None,
    model_card: str,
    version: int,
    link_files: bool,
) -> tuple[str, str]:
    """Fill a staged version directory; return (content hash, config.pbtxt text)."""
    for name, source in files.items():
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if link_files:
            _place_file(source, target)
        else:
            shutil.copy2(source, target)
    # Hash what was published, not the sources: that is what Triton will load.
    weight_hashes = {name: sha256_file(directory / name) for name in sorted(weights)}
    if bundle is not None:
        assert tokenizer_file is not None
        named = dataclasses.replace(bundle, model_name=spec.name, model_version=version, content_hash="")
        content_hash = compute_content_hash(named, weight_hashes)
        # Each bundle type writes itself (ServingBundle: bundle.json; GeneratorBundle: generation.json).
        dataclasses.replace(named, content_hash=content_hash).write(directory / BUNDLE_DIR, tokenizer_file)
    else:
        payload = json.dumps(
            {"model": spec.name, "version": version, "weights": weight_hashes}, sort_keys=True
        )
        content_hash = hashlib.sha256(payload.encode()).hexdigest()
    (directory / MODEL_CARD_FILE).write_text(model_card)
    stamped = dataclasses.replace(spec, parameters={**spec.parameters, BUNDLE_HASH_PARAMETER: content_hash})
    return content_hash, render_config_pbtxt(stamped)
