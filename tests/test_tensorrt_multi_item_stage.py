"""The GPU target's multi-item wiring, every part that runs without a GPU: the stage id and engine key,
the calibration feeds, the profile each request runs in, the gate on synthetic scores, the scores of
member requests, the published layout (a plan file written here, not an engine) and the agreement of the
published ``tensorrt_plan`` config with what the scoring service sends. Building and running the engine:
tests/test_tensorrt_gpu.py (scripts/gpu-check.sh)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from slimserve.buildstage.context import BuildData, stage_config
from slimserve.buildstage.recipe import Recipe, load_recipe
from slimserve.buildstage.tensorrt_stage import (
    calibration_feeds,
    engine_config,
    engine_stage,
    engines_dir,
    held_groups,
    multi_item_parity,
    publish_tensorrt,
    recipe_profiles,
)
from slimserve.bundle import TOKENIZER_FILE, bundle_dir_for, load_bundle
from slimserve.errors import BuildError
from slimserve.export.tensorrt.parity import require_parity
from slimserve.export.tensorrt.profiles import MultiItemProfile, profile_for_shapes
from slimserve.export.tensorrt.triton_spec import request_problems
from slimserve.export.triton_config import parse_config_pbtxt
from slimserve.models.teacher import LazyTeacher
from slimserve.tokenization import PromptTokenizer
from tests.tensorrt_fixtures import multi_item_groups

CC = (9, 0)


def _recipe(tmp_path: Path, mode: str = "multi_item", **publish) -> Recipe:
    data = load_recipe("tiny-gpu").model_dump(mode="json")
    data["work_dir"] = str(tmp_path / "work")
    data["publish"].update(scoring_mode=mode, model_repository=str(tmp_path / "repo"), **publish)
    return Recipe.model_validate(data)


def test_single_sequence_stage_keeps_its_id_and_key(tmp_path):
    recipe = _recipe(tmp_path, "single")
    stage, config = engine_stage(recipe, CC)
    assert stage == "tensorrt_sm90"
    assert config == {**stage_config(recipe, "tensorrt"), "compute_capability": "9.0"}
    assert engine_config(recipe) == stage_config(recipe, "tensorrt")


def test_multi_item_stage_has_its_own_id_and_engine_key(tmp_path):
    recipe = _recipe(tmp_path)
    stage, config = engine_stage(recipe, CC)
    assert stage == "tensorrt_multi_item_sm90"
    assert config["multi_item"] == {
        "prefix_max_tokens": 192,
        "item_max_tokens": 128,
        "item_length_buckets": [32, 48, 64, 80, 96, 128],
        "max_items_per_request": 256,
    }
    assert config["multi_item_gates"] == {"spearman": 0.0, "auc_gap": None}
    key = engines_dir(recipe, engine_config(recipe))
    assert key != engines_dir(_recipe(tmp_path, "single"), engine_config(_recipe(tmp_path, "single")))
    fewer = _recipe(tmp_path, max_items_per_request=64)
    assert engines_dir(fewer, engine_config(fewer)) != key  # other request shapes: another engine
    stricter = _recipe(tmp_path)
    stricter.gates.multi_item_spearman = 0.99
    assert engines_dir(stricter, engine_config(stricter)) == key  # a gate re-runs the stage only
    assert engine_stage(stricter, CC)[1] != config


def test_multi_item_masks_stay_finite_in_the_q_dq_graph_s_fp16_and_bf16_layers():
    """The graph builds its additive masks as (masked: 1, visible: 0) * MASKED_SCORE; with float32's
    lowest value, FP16 and BF16 hold -inf and every visible position became 0 * -inf = NaN."""
    from slimserve.models.multi_item import MASKED_SCORE

    for dtype in (torch.float16, torch.bfloat16):
        masked = torch.tensor([1.0, 0.0], dtype=dtype) * torch.tensor(MASKED_SCORE, dtype=dtype)
        assert torch.isfinite(masked).all() and masked[1] == 0
        weights = torch.softmax(torch.tensor([3.0, 5.0], dtype=dtype) + masked, dim=-1)
        assert weights.tolist() == [0.0, 1.0]
    assert torch.exp(torch.tensor(MASKED_SCORE)) == 0  # FP32 scores are exactly those of a -inf mask


def test_multi_item_profiles_hold_a_folded_one_candidate_call(tmp_path):
    profiles = recipe_profiles(_recipe(tmp_path))
    assert all(isinstance(p, MultiItemProfile) for p in profiles)
    assert [p.bucket for p in profiles] == [32, 48, 64, 80, 96, 128]
    assert {(p.prefix_max, p.max_items, p.max_members, p.triton_max_batch) for p in profiles} == {
        (192 + 128 - 1, 256, 1, 0)
    }


@pytest.fixture(scope="module")
def tokenizer_file() -> Path:
    return LazyTeacher("tiny").tokenizer_file


def _build_data(tokenizer_file: Path, groups: list) -> BuildData:
    sequences = [g.prefix + item for g in groups for item in g.items]
    count = len(sequences)
    return BuildData(
        tokenizer=PromptTokenizer(tokenizer_file, 320),
        examples={"train": [None] * count},
        sequences={"train": sequences},
        labels={"train": np.zeros(count)},
        member_ids={"train": [str(i) for i in range(count)]},
        bayes_optimal_auc=None,
        groups={"train": groups},
    )


def test_calibration_feeds_are_member_requests_within_the_profiles(tiny_multi_item_repository, tmp_path):
    bundle_dir = bundle_dir_for(tiny_multi_item_repository, "scorer")
    groups = multi_item_groups(bundle_dir, [1, 6, 3, 12])
    recipe = _recipe(tmp_path, max_items_per_request=4)
    recipe.tensorrt.calibration_examples = 16  # the first 16 examples: members 1-3 and 6 of the fourth's
    feeds = calibration_feeds(recipe, _build_data(bundle_dir / TOKENIZER_FILE, groups))
    profiles = recipe_profiles(recipe)
    assert sum(f["item_ids"].shape[1] for f in feeds) == 16
    assert [f["item_ids"].shape[1] for f in feeds] == [1, 4, 2, 3, 4, 2]
    for feed in feeds:
        assert list(feed) == ["prefix_ids", "prefix_mask", "item_ids", "item_mask"]
        assert all(a.dtype == np.int64 for a in feed.values())
        assert feed["prefix_ids"].shape[0] == 1 and feed["item_ids"].ndim == 3
        profile = profile_for_shapes(profiles, {n: a.shape for n, a in feed.items()})
        assert profile.min_length <= feed["item_ids"].shape[2] <= profile.bucket
    assert feeds[0]["item_ids"].shape[2] == 1  # one candidate: folded into the prefix, profile 0
    single = calibration_feeds(_recipe(tmp_path, "single"), _build_data(bundle_dir / TOKENIZER_FILE, groups))
    assert list(single[0]) == ["input_ids", "attention_mask"] and single[0]["input_ids"].shape[1] in (
        64,
        192,
        320,
    )


def test_request_profile_is_chosen_by_item_length(tmp_path):
    profiles = recipe_profiles(_recipe(tmp_path))

    def chosen(prefix: int, items: int, length: int) -> int:
        shapes = {"prefix_ids": (1, prefix), "prefix_mask": (1, prefix)}
        shapes |= {"item_ids": (1, items, length), "item_mask": (1, items, length)}
        return profile_for_shapes(profiles, shapes).bucket

    assert [chosen(110, 1, 1), chosen(319, 50, 80), chosen(5, 256, 81), chosen(200, 2, 128)] == [
        32,
        80,
        96,
        128,
    ]
    for prefix, items, length in ((320, 2, 32), (100, 257, 32), (100, 2, 129)):
        with pytest.raises(ValueError, match="fit no optimization profile"):
            chosen(prefix, items, length)
    with pytest.raises(ValueError, match="fit no optimization profile"):  # two members: not served
        profile_for_shapes(profiles, {"prefix_ids": (2, 10), "item_ids": (2, 3, 32)})


def _synthetic(seed: int = 0, members: int = 40, per_member: int = 12):
    rng = np.random.default_rng(seed)
    reference = rng.normal(size=members * per_member)
    labels = (reference + rng.normal(scale=0.8, size=reference.size) > 0).astype(float)
    ids = [f"m{i // per_member}" for i in range(reference.size)]
    return rng, reference, labels, ids


def test_multi_item_gate_passes_an_engine_that_keeps_the_ranking(tmp_path):
    recipe = load_recipe("gpu")
    rng, reference, labels, ids = _synthetic()
    candidate = reference + rng.normal(scale=1e-3, size=reference.size)
    report, measures = multi_item_parity(reference, candidate, labels, ids, recipe)
    assert report.passed, report.failures
    assert measures["spearman"] > 0.999 and measures["auc_gap"] < 0.002
    assert report.groups == 40
    require_parity(report, "the int8 multi_item engine")


def test_multi_item_gate_names_every_failed_measure(tmp_path):
    recipe = load_recipe("gpu")
    rng, reference, labels, ids = _synthetic(1)
    candidate = reference + rng.normal(scale=0.5, size=reference.size)
    report, measures = multi_item_parity(reference, candidate, labels, ids, recipe)
    assert measures["auc_gap"] > 0.002 and measures["spearman"] < 0.99
    text = "; ".join(report.failures)
    for expected in ("spearman", "pairwise_agreement", "multi-item spearman", "multi-item test AUC gap"):
        assert expected in text
    with pytest.raises(
        BuildError, match=r"multi_item engine.*multi-item test AUC gap.*nothing was published"
    ):
        require_parity(report, "the int8 multi_item engine")
    candidate[3] = np.nan
    report, measures = multi_item_parity(reference, candidate, labels, ids, recipe)
    assert "1 candidate scores are not finite" in report.failures and np.isnan(measures["spearman"])


def test_multi_item_gate_off_on_tiny_recipes(tmp_path):
    recipe = _recipe(tmp_path)  # tiny-gpu: multi_item_spearman 0, auc gap null; looser engine parity
    _, reference, labels, ids = _synthetic(2)
    report, measures = multi_item_parity(reference, -reference, labels, ids, recipe)
    assert not any(f.startswith("multi-item") for f in report.failures) and measures["spearman"] < -0.99


def test_held_groups_stop_before_the_limit():
    groups = [list(range(n)) for n in (5, 4, 6, 2)]
    assert [len(g) for g in held_groups(groups, 10)] == [5, 4]
    assert [len(g) for g in held_groups(groups, 3)] == [5]  # at least one member
    assert len(held_groups(groups, 100)) == 4


def test_engine_scores_member_requests_as_the_onnx_graph_does(tiny_multi_item_repository):
    """``multi_item_scores`` (what runs the engine) places every request's scores where the ONNX
    reference does: a run function backed by the FP32 multi-item graph gives the reference's scores."""
    from slimserve.buildstage.int8_stage import onnx_multi_item_margin
    from slimserve.evaluation.throughput import scorer_session
    from slimserve.export.tensorrt.runtime import multi_item_scores

    bundle_dir = bundle_dir_for(tiny_multi_item_repository, "scorer")
    bundle = load_bundle(bundle_dir)
    onnx = bundle_dir.parent / "model.onnx"
    groups = multi_item_groups(bundle_dir, [1, 9, 2])  # folded, split into 3 requests of <= 4, two
    session, _ = scorer_session(onnx)
    sent = []

    def run(feed):
        sent.append(feed["item_ids"].shape)
        return session.run(None, feed)[0]

    scores = multi_item_scores(run, groups, 12, bundle.item_length_buckets, bundle.max_items_per_request)
    reference = onnx_multi_item_margin(onnx, groups, 12, bundle)
    np.testing.assert_allclose(scores, reference, atol=1e-6)
    assert [shape[:2] for shape in sent] == [(1, 1), (1, 4), (1, 4), (1, 1), (1, 2)]


class _RecordingTriton:
    """Stands in for tritonclient's aio client behind the service's ``TritonScorerClient``: records the
    InferInputs the service builds and answers ``score`` [1, N] as the engine's config declares."""

    def __init__(self, config):
        self.config, self.sent = config, []

    async def get_model_config(self, *args, **kwargs):
        return SimpleNamespace(config=self.config)

    async def infer(self, model_name, inputs, **kwargs):
        self.sent.append({t.name(): (t.datatype(), tuple(t.shape())) for t in inputs})
        items = self.sent[-1]["item_ids"][1][1]
        return SimpleNamespace(
            as_numpy=lambda name: np.zeros((1, items), np.float32) if name == "score" else None
        )


def _publish_fake_plans(tmp_path: Path, tokenizer_file: Path, **publish) -> Recipe:
    recipe = _recipe(tmp_path, **publish)
    engines = tmp_path / "engines"
    engines.mkdir()
    for name in ("model_sm90.plan", "model_sm80.plan"):
        (engines / name).write_bytes(b"a plan file written by the test, not an engine: " + name.encode())
    data = SimpleNamespace(tokenizer=PromptTokenizer(tokenizer_file, 320))
    publish_tensorrt(recipe, data, engines, tokenizer_file, "# card\n", "tiny (student)")
    return recipe


def test_multi_item_engine_is_published_as_the_scorer(tmp_path, tokenizer_file):
    recipe = _publish_fake_plans(tmp_path, tokenizer_file)
    model = tmp_path / "repo" / "scorer"
    assert sorted(p.name for p in (model / "1").iterdir()) == [
        "MODEL_CARD.md",
        "bundle",
        "model_sm80.plan",
        "model_sm90.plan",
    ]
    assert not (model / "warmup").exists()  # zero-data warmups: no files
    assert (model / "1" / "model_sm90.plan").read_bytes().endswith(b"model_sm90.plan")
    config = parse_config_pbtxt((model / "config.pbtxt").read_text())
    assert config.platform == "tensorrt_plan" and config.max_batch_size == 0
    assert dict(config.cc_model_filenames) == {"8.0": "model_sm80.plan", "9.0": "model_sm90.plan"}
    assert [list(g.profile) for g in config.instance_group] == [[str(i) for i in range(6)]]
    bundle = load_bundle(model / "1" / "bundle")
    assert bundle.multi_item and bundle.max_batch_size == 1
    assert bundle.item_length_buckets == (32, 48, 64, 80, 96, 128) and bundle.max_items_per_request == 256
    assert config.parameters["slimserve_bundle_hash"].string_value == bundle.content_hash
    assert len(recipe_profiles(recipe)) == 6


def test_scoring_service_sends_what_the_engine_config_declares(
    tmp_path, tokenizer_file, tiny_multi_item_repository
):
    from slimserve.examples import EXAMPLE_MEMBER, example_candidates
    from slimserve.serving.scoring.config import ScoringServiceConfig
    from slimserve.serving.scoring.core import ScoringCore

    recipe = _publish_fake_plans(tmp_path, tokenizer_file, max_items_per_request=4)
    config = parse_config_pbtxt((tmp_path / "repo" / "scorer" / "config.pbtxt").read_text())
    core = ScoringCore.from_config(ScoringServiceConfig(model_repository=tmp_path / "repo"))
    triton = _RecordingTriton(config)
    core.client._grpc = lambda: triton
    profiles = recipe_profiles(recipe)

    async def send(count: int):
        for request in core.prepare(EXAMPLE_MEMBER, example_candidates(count, seed=count)):
            result = await core.client.infer_multi_item(*request.arrays())
            assert result.scores.shape == (len(request.indices),)

    for count in (1, 3, 10):
        asyncio.run(send(count))
    assert [sent["item_ids"][1][:2] for sent in triton.sent] == [(1, 1), (1, 3), (1, 4), (1, 4), (1, 2)]
    for sent in triton.sent:
        assert request_problems(config, sent) == []
        profile_for_shapes(profiles, {name: shape for name, (_, shape) in sent.items()})
    # the CPU multi-item model batches members (max_batch_size > 0, dims without the batch axis): the
    # same requests fit it; unbatched tensors fit neither
    cpu = parse_config_pbtxt((tiny_multi_item_repository / "scorer" / "config.pbtxt").read_text())
    assert cpu.max_batch_size > 0 and all(request_problems(cpu, sent) == [] for sent in triton.sent)
    unbatched = {name: (datatype, shape[1:]) for name, (datatype, shape) in triton.sent[0].items()}
    prefix = list(unbatched["prefix_ids"][1])
    expected = f"input 'prefix_ids': shape {prefix} does not fit dims [-1, -1] (no batch axis)"
    assert expected in request_problems(config, unbatched)
    wrong = {**triton.sent[0], "item_mask": ("FP32", triton.sent[0]["item_mask"][1])}
    del wrong["prefix_mask"]
    assert request_problems(config, wrong) == [
        "input 'prefix_mask' is not sent",
        "input 'item_mask' is sent as FP32, declared TYPE_INT64",
    ]
