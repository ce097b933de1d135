"""Atomic publishing of model versions into a Triton model repository."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slimserve import bundle as bundle_mod
from slimserve.bundle import BUNDLE_HASH_PARAMETER, ServingBundle, bundle_dir_for, load_bundle, sha256_file
from slimserve.export import repository as repo_mod
from slimserve.export.repository import (
    CONFIG_FILE,
    MODEL_CARD_FILE,
    list_versions,
    publish_version,
    remove_stale_staging,
)
from slimserve.export.scorer_model import scorer_triton_spec
from slimserve.export.triton_config import parse_config_pbtxt


@pytest.fixture
def sources(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.onnx").write_bytes(b"onnx-bytes-v1")
    (src / "model.onnx.data").write_bytes(b"weights" * 100)
    (src / "model.py").write_text("# python backend model\n")
    (src / "tokenizer.json").write_text('{"version": "1.0", "model": {}}')
    return src


def make_bundle(tokenizer):
    return ServingBundle(
        model_name="placeholder",
        model_version=0,
        task="scoring",
        prompt_template_version="v1",
        yes_token_id=10,
        no_token_id=11,
        length_buckets=(32, 64),
        max_batch_size=8,
        tokenizer_sha256=sha256_file(tokenizer),
        source_model="tiny",
    )


def spec():
    return scorer_triton_spec("scorer", 8, (32, 64), 500, 0, 0, 1, None, {})


def publish(repo, src, **kwargs):
    files = {name: src / name for name in ("model.py", "model.onnx", "model.onnx.data")}
    defaults = dict(
        bundle=make_bundle(src / "tokenizer.json"),
        tokenizer_file=src / "tokenizer.json",
        model_card="# scorer\n",
    )
    return publish_version(repo, spec(), files, **{**defaults, **kwargs})


def leftovers(repo):
    """Hidden staging/temp paths inside the repository and staging directories beside it."""
    inside = [p.relative_to(repo).as_posix() for p in repo.rglob(".*")]
    beside = [p.name for p in repo.parent.glob(f".{repo.name}.staging-*")]
    return sorted(inside + beside)


def test_publish_twice_gives_versions_1_and_2(tmp_path, sources):
    repo = tmp_path / "repo"
    first = publish(repo, sources)
    assert first.version == 1
    assert first.path == repo / "scorer" / "1"
    # Sources are hard-linked: replace the file (new inode) rather than rewriting it in place.
    (sources / "model.onnx").unlink()
    (sources / "model.onnx").write_bytes(b"onnx-bytes-v2")
    second = publish(repo, sources, model_card="# scorer v2\n")
    assert second.version == 2
    assert list_versions(repo, "scorer") == [1, 2]
    assert second.content_hash != first.content_hash
    assert (repo / "scorer" / "1" / "model.onnx").read_bytes() == b"onnx-bytes-v1"
    assert (repo / "scorer" / "2" / "model.onnx").read_bytes() == b"onnx-bytes-v2"
    assert (repo / "scorer" / "2" / MODEL_CARD_FILE).read_text() == "# scorer v2\n"
    assert sorted(p.name for p in (repo / "scorer").iterdir()) == ["1", "2", CONFIG_FILE]
    assert leftovers(repo) == []


def test_bundle_is_loadable_and_hash_is_in_config(tmp_path, sources):
    repo = tmp_path / "repo"
    published = publish(repo, sources)
    loaded = load_bundle(bundle_dir_for(repo, "scorer"))
    assert (loaded.model_name, loaded.model_version) == ("scorer", 1)
    assert loaded.content_hash == published.content_hash
    weights = {n: sha256_file(published.path / n) for n in ("model.onnx", "model.onnx.data", "model.py")}
    unhashed = bundle_mod.compute_content_hash(loaded, weights)
    assert unhashed == published.content_hash
    cfg = parse_config_pbtxt(published.config_path.read_text())
    assert cfg.parameters[BUNDLE_HASH_PARAMETER].string_value == published.content_hash
    assert cfg.name == "scorer"
    second = publish(repo, sources)
    cfg = parse_config_pbtxt(second.config_path.read_text())
    assert cfg.parameters[BUNDLE_HASH_PARAMETER].string_value == second.content_hash
    assert load_bundle(second.path / "bundle").content_hash == second.content_hash


def test_weight_files_select_what_is_hashed(tmp_path, sources):
    repo = tmp_path / "repo"
    a = publish(repo, sources, weight_files=("model.onnx", "model.onnx.data"))
    (sources / "model.py").write_text("# edited\n")
    b = publish(repo, sources, weight_files=("model.onnx", "model.onnx.data"))
    # Same weights and bundle, different version number: different hashes, each reproducible.
    assert a.content_hash != b.content_hash
    with pytest.raises(ValueError, match="weight_files \\['nope'\\]"):
        publish(repo, sources, weight_files=("nope",))


def test_publish_without_bundle(tmp_path, sources):
    published = publish(tmp_path / "repo", sources, bundle=None, tokenizer_file=None)
    assert not (published.path / "bundle").exists()
    cfg = parse_config_pbtxt(published.config_path.read_text())
    assert cfg.parameters[BUNDLE_HASH_PARAMETER].string_value == published.content_hash


def test_explicit_versions(tmp_path, sources):
    repo = tmp_path / "repo"
    assert publish(repo, sources, version=5).version == 5
    assert publish(repo, sources).version == 6
    with pytest.raises(FileExistsError):
        publish(repo, sources, version=6)
    with pytest.raises(ValueError, match="older than the newest"):
        publish(repo, sources, version=3)
    assert list_versions(repo, "scorer") == [5, 6]


def test_bad_inputs_rejected_before_touching_disk(tmp_path, sources):
    repo = tmp_path / "repo"
    with pytest.raises(ValueError, match="tokenizer_sha256"):
        publish(repo, sources, tokenizer_file=sources / "model.py")
    with pytest.raises(ValueError, match="needs its tokenizer_file"):
        publish(repo, sources, tokenizer_file=None)
    for name in ("../evil", "/abs", "bundle/x", MODEL_CARD_FILE):
        with pytest.raises(ValueError, match=repr(name).replace("/", ".")[1:-1]):
            publish_version(repo, spec(), {name: sources / "model.py"}, None, None, "")
    assert not repo.exists()


@pytest.mark.parametrize("existing_model", [False, True])
def test_failure_mid_publish_leaves_nothing(tmp_path, sources, monkeypatch, existing_model):
    repo = tmp_path / "repo"
    if existing_model:
        publish(repo, sources)
    before = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")) if existing_model else None
    config_before = (repo / "scorer" / CONFIG_FILE).read_text() if existing_model else None
    real_place = repo_mod._place_file
    calls = []

    def failing_place(source, target):
        calls.append(target)
        if len(calls) == 2:
            assert any(".staging-" in part for part in target.parts)
            raise OSError("disk full")
        real_place(source, target)

    monkeypatch.setattr(repo_mod, "_place_file", failing_place)
    with pytest.raises(OSError, match="disk full"):
        publish(repo, sources)
    assert leftovers(repo) == []
    if existing_model:
        assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")) == before
        assert (repo / "scorer" / CONFIG_FILE).read_text() == config_before
        assert list_versions(repo, "scorer") == [1]
    else:
        assert list(repo.iterdir()) == []


def test_config_is_replaced_atomically(tmp_path, sources, monkeypatch):
    repo = tmp_path / "repo"
    first = publish(repo, sources)
    config = repo / "scorer" / CONFIG_FILE
    old_text = config.read_text()
    old_inode = config.stat().st_ino
    replaced = []
    real_replace = os.replace

    def recording_replace(src, dst):
        replaced.append((os.path.basename(src), os.path.basename(dst), Path(src).read_text()))
        real_replace(src, dst)

    monkeypatch.setattr(repo_mod.os, "replace", recording_replace)
    second = publish(repo, sources)
    assert [(s.startswith(".config.pbtxt.tmp-"), d) for s, d, _ in replaced] == [(True, CONFIG_FILE)]
    assert replaced[0][2] == config.read_text() != old_text
    assert config.stat().st_ino != old_inode  # a new file renamed over the old, never rewritten in place
    assert second.content_hash in config.read_text() and first.content_hash not in config.read_text()

    def failing_replace(src, dst):
        raise OSError("replace failed")

    monkeypatch.setattr(repo_mod.os, "replace", failing_replace)
    current = config.read_text()
    with pytest.raises(OSError, match="replace failed"):
        publish(repo, sources)
    assert config.read_text() == current
    assert list_versions(repo, "scorer") == [1, 2]  # the moved-in version 3 was taken back out
    assert leftovers(repo) == []


def test_remove_stale_staging(tmp_path, sources):
    repo = tmp_path / "repo"
    publish(repo, sources)
    stale = [
        repo / ".staging-abc" / "scorer" / "1",
        repo / "scorer" / ".staging-def",
        tmp_path / ".repo.staging-ghi" / "other",
    ]
    for path in stale:
        path.mkdir(parents=True)
        (path / "f").write_text("x")
    (repo / "scorer" / ".config.pbtxt.tmp-123").write_text("x")
    removed = remove_stale_staging(repo)
    assert len(removed) == 4
    assert leftovers(repo) == []
    assert list_versions(repo, "scorer") == [1]
    assert remove_stale_staging(tmp_path / "missing") == []


def test_link_files_false_copies(tmp_path, sources):
    published = publish(tmp_path / "repo", sources, link_files=False)
    (sources / "model.onnx").write_bytes(b"rewritten in place")
    assert (published.path / "model.onnx").read_bytes() == b"onnx-bytes-v1"


def test_hard_link_falls_back_to_copy(tmp_path, sources, monkeypatch):
    def no_link(src, dst):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(repo_mod.os, "link", no_link)
    published = publish(tmp_path / "repo", sources)
    target = published.path / "model.onnx"
    assert target.read_bytes() == b"onnx-bytes-v1"
    assert target.stat().st_ino != (sources / "model.onnx").stat().st_ino


@pytest.mark.parametrize("beside", [True, False])
def test_new_model_staging_location(tmp_path, sources, monkeypatch, beside):
    repo = tmp_path / "repo"
    repo.mkdir()
    seen = []
    real_place = repo_mod._place_file

    def spying_place(source, target):
        seen.append(target)
        real_place(source, target)

    monkeypatch.setattr(repo_mod, "_place_file", spying_place)
    if not beside:
        monkeypatch.setattr(repo_mod, "_same_filesystem", lambda a, b: False)  # e.g. a volume mount
    publish(repo, sources)
    staging = seen[0].parents[2]
    if beside:  # Triton never sees it: every directory inside the repository is taken for a model
        assert staging.parent == tmp_path and staging.name.startswith(".repo.staging-")
    else:
        assert staging.parent == repo and staging.name.startswith(".staging-")
    assert leftovers(repo) == []
    assert list_versions(repo, "scorer") == [1]
