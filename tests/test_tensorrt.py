"""GPU target, the parts that run without a GPU: profiles, precision choice, the tensorrt_plan config,
the parity gate, SmoothQuant, the Model Optimizer Q/DQ graph (on CPU) and the recipe."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from slimserve.buildstage.recipe import load_recipe
from slimserve.errors import BuildError
from slimserve.export.tensorrt.device import (
    cc_key,
    cc_of_plan,
    choose_precision,
    parse_compute_cap,
    plan_filename,
)
from slimserve.export.tensorrt.engine import EngineBuildConfig, trtexec_script
from slimserve.export.tensorrt.parity import engine_parity, pairwise_agreement, require_parity, topk_overlap
from slimserve.export.tensorrt.profiles import bucket_profiles, profile_for, trtexec_shape_flags
from slimserve.export.tensorrt.settings import ParityThresholds
from slimserve.export.tensorrt.triton_spec import (
    check_plan_config,
    tensorrt_scorer_spec,
    warmup_mask_name,
    write_warmup_files,
)
from slimserve.export.triton_config import parse_config_pbtxt, render_config_pbtxt, to_model_config
from slimserve.settings import ConfigError

# -- profiles ---------------------------------------------------------------------------------------


def test_one_profile_per_bucket_covering_every_length():
    profiles = bucket_profiles((320, 96, 192, 96), max_batch_size=64, opt_batch_size=32)
    assert [p.bucket for p in profiles] == [96, 192, 320]
    assert [p.min_length for p in profiles] == [1, 97, 193]
    assert profiles[1].shapes() == {
        "input_ids": ((1, 97), (32, 192), (64, 192)),
        "attention_mask": ((1, 97), (32, 192), (64, 192)),
    }
    # every length 1..320 at every batch lands in exactly one profile, the one of its bucket
    for length in range(1, 321):
        holders = [p.index for p in profiles if p.holds(7, length)]
        assert len(holders) == 1
        assert profiles[holders[0]].bucket == min(b for b in (96, 192, 320) if length <= b)
    assert profile_for(profiles, 64, 96).index == 0 and profile_for(profiles, 1, 97).index == 1


def test_profiles_reject_what_no_engine_can_serve():
    profiles = bucket_profiles((64, 128), max_batch_size=8)
    assert profiles[0].opt_shape == (8, 64)  # opt batch defaults to the max
    with pytest.raises(ValueError, match=r"\[9, 10\] fits no optimization profile"):
        profile_for(profiles, 9, 10)
    with pytest.raises(ValueError, match=r"length 1\.\.128"):
        profile_for(profiles, 1, 129)
    with pytest.raises(ValueError, match="opt_batch_size 16"):
        bucket_profiles((64,), max_batch_size=8, opt_batch_size=16)
    with pytest.raises(ValueError, match="positive"):
        bucket_profiles((0, 64), max_batch_size=8)
    with pytest.raises(ValueError, match="max_batch_size"):
        bucket_profiles((64,), max_batch_size=0)


def test_trtexec_script_rebuilds_the_same_profiles_strongly_typed(tmp_path):
    profiles = bucket_profiles((64, 128), max_batch_size=8, opt_batch_size=4)
    flags = trtexec_shape_flags(profiles)
    assert flags[:3] == [
        "--minShapes=input_ids:1x1,attention_mask:1x1",
        "--optShapes=input_ids:4x64,attention_mask:4x64",
        "--maxShapes=input_ids:8x64,attention_mask:8x64",
    ]
    assert flags[3] == "--minShapes=input_ids:1x65,attention_mask:1x65"
    script = trtexec_script(
        tmp_path / "q.onnx",
        tmp_path / "model_sm90.plan",
        profiles,
        EngineBuildConfig(timing_cache=tmp_path / "c"),
    )
    assert "--stronglyTyped" in script and f"--timingCacheFile={tmp_path / 'c'}" in script
    # precision is in the graph: none of the flags TensorRT 11 removed
    assert not any(flag in script for flag in ("--fp16", "--int8", "--fp8", "--best"))


# -- device ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "cc", "expected"),
    [
        ("auto", (8, 0), "int8"),
        ("auto", (8, 6), "int8"),
        ("auto", (8, 9), "fp8"),
        ("auto", (9, 0), "fp8"),
        ("int8", (9, 0), "int8"),
        ("fp8", (8, 9), "fp8"),
        ("int8", (7, 5), "int8"),
    ],
)
def test_precision_follows_the_gpu(requested, cc, expected):
    assert choose_precision(requested, cc) == expected


def test_unsupported_precision_names_the_field():
    with pytest.raises(BuildError, match=r"tensorrt.precision: fp8 needs compute capability 8.9.*8.0"):
        choose_precision("fp8", (8, 0))
    with pytest.raises(BuildError, match=r"below 7\.5"):
        choose_precision("auto", (7, 0))


def test_engine_file_names_per_compute_capability():
    assert plan_filename((9, 0)) == "model_sm90.plan" and cc_key((9, 0)) == "9.0"
    assert cc_of_plan("model_sm89.plan") == (8, 9) and cc_of_plan(plan_filename((10, 0))) == (10, 0)
    assert cc_of_plan(plan_filename((12, 1))) == (12, 1)
    assert parse_compute_cap(" 8.6\n") == (8, 6)
    with pytest.raises(ValueError):
        cc_of_plan("model.plan")


# -- tensorrt_plan config ---------------------------------------------------------------------------


def plan_spec(profiles, **overrides):
    arguments = {
        "name": "scorer",
        "profiles": profiles,
        "cc_model_filenames": {"8.0": "model_sm80.plan", "9.0": "model_sm90.plan"},
        "max_queue_delay_us": 200,
        "max_queue_size": 1024,
        "default_timeout_us": 30_000_000,
        "instance_count": 2,
    }
    return tensorrt_scorer_spec(**{**arguments, **overrides})


def test_plan_config_validates_through_model_config_and_matches_the_profiles():
    profiles = bucket_profiles((96, 192, 320), max_batch_size=64, opt_batch_size=32)
    text = render_config_pbtxt(plan_spec(profiles))
    cfg = parse_config_pbtxt(text)
    assert cfg.platform == "tensorrt_plan" and not cfg.backend and cfg.max_batch_size == 64
    assert dict(cfg.cc_model_filenames) == {"8.0": "model_sm80.plan", "9.0": "model_sm90.plan"}
    assert not cfg.default_model_filename
    (group,) = cfg.instance_group
    assert group.kind == group.KIND_GPU and group.count == 2 and list(group.profile) == ["0", "1", "2"]
    assert [i.name for i in cfg.input] == ["input_ids", "attention_mask"] and [
        o.name for o in cfg.output
    ] == ["score"]
    warmed = {(w.batch_size, w.inputs["attention_mask"].dims[0]) for w in cfg.model_warmup}
    assert warmed == {(b, length) for b in (1, 64) for length in (96, 192, 320)}
    for warmup in cfg.model_warmup:
        length = warmup.inputs["input_ids"].dims[0]
        assert warmup.inputs["input_ids"].zero_data
        assert warmup.inputs["attention_mask"].input_data_file == warmup_mask_name(length)
    check_plan_config(cfg, profiles, ["model_sm80.plan", "model_sm90.plan"])
    small = parse_config_pbtxt(render_config_pbtxt(plan_spec(profiles, warmup_max_batch=False)))
    assert {w.batch_size for w in small.model_warmup} == {1}


def test_plan_config_check_lists_every_disagreement():
    profiles = bucket_profiles((96, 192), max_batch_size=64)
    cfg = to_model_config(plan_spec(profiles))
    cfg.default_model_filename = "model.plan"
    cfg.instance_group[0].profile.append("7")
    cfg.model_warmup[0].inputs["input_ids"].dims[0] = 400
    with pytest.raises(ValueError) as info:
        check_plan_config(cfg, bucket_profiles((96, 192), max_batch_size=32), ["model_sm90.plan"])
    message = str(info.value)
    for expected in (
        "max_batch_size 64 != profiles' max batch 32",
        "default_model_filename is set",
        "['model_sm80.plan']",
        "profiles ['7']",
        "shapes attention_mask 1x96, input_ids 1x400 fit no optimization profile",
    ):
        assert expected in message
    with pytest.raises(ValueError, match="cc_model_filenames is empty"):
        plan_spec(profiles, cc_model_filenames={})


def test_warmup_files_are_one_sample_of_ones_beside_the_versions(tmp_path):
    profiles = bucket_profiles((8, 16), max_batch_size=4)
    written = write_warmup_files(tmp_path / "scorer", profiles)
    assert [p.relative_to(tmp_path).as_posix() for p in written] == [
        "scorer/warmup/attention_mask_ones_8",
        "scorer/warmup/attention_mask_ones_16",
    ]
    data = np.frombuffer(written[1].read_bytes(), dtype="<i8")
    assert data.shape == (16,) and (data == 1).all()
    assert write_warmup_files(tmp_path / "scorer", profiles) == written  # idempotent
    assert sorted(p.name for p in (tmp_path / "scorer" / "warmup").iterdir()) == [
        "attention_mask_ones_16",
        "attention_mask_ones_8",
    ]


# -- parity gate ------------------------------------------------------------------------------------


def test_parity_gate_passes_small_noise_and_reports_every_measure():
    rng = np.random.default_rng(0)
    reference = rng.normal(size=400)
    report = engine_parity(reference, reference + rng.normal(scale=0.01, size=400), ParityThresholds())
    assert report.passed, report.failures
    assert report.pearson > 0.999 and report.spearman > 0.999 and report.pairwise_agreement > 0.99
    assert 0 < report.max_abs_diff < 0.1 and report.as_dict()["passed"] is True


def test_parity_gate_fails_on_ranking_damage_that_allclose_would_miss():
    rng = np.random.default_rng(1)
    reference = np.sort(rng.normal(scale=0.01, size=64))  # scores close together
    candidate = reference[::-1].copy()  # every difference below 0.05, every order reversed
    assert np.allclose(reference, candidate, atol=0.05)
    report = engine_parity(reference, candidate, ParityThresholds())
    assert not report.passed
    assert {f.split()[0] for f in report.failures} == {
        "pearson",
        "spearman",
        "pairwise_agreement",
        "topk_overlap",
    }
    with pytest.raises(BuildError, match=r"parity gate failed for the int8 engine.*pairwise_agreement"):
        require_parity(report, "the int8 engine")


def test_ranking_agreement_is_measured_within_each_member():
    # two members; the candidate shifts member b's scores below member a's but keeps each member's order
    reference = np.array([1.0, 2.0, 3.0, 1.5, 2.5, 3.5])
    candidate = np.array([1.0, 2.0, 3.0, -3.5, -2.5, -1.5])
    groups = ["a", "a", "a", "b", "b", "b"]
    assert pairwise_agreement(reference, candidate, groups) == 1.0
    assert pairwise_agreement(reference, candidate, None) < 1.0
    assert topk_overlap(reference, candidate, groups, k=2) == 1.0
    swapped = candidate.copy()
    swapped[[0, 2]] = swapped[[2, 0]]  # member a: best and worst exchanged, 3 of 3 pairs wrong
    assert pairwise_agreement(reference, swapped, groups) == pytest.approx(3 / 6)
    assert topk_overlap(reference, swapped, groups, k=1) == 0.5


def test_parity_gate_rejects_non_finite_scores_and_enforces_an_optional_bound():
    reference = np.linspace(-1, 1, 10)
    broken = reference.copy()
    broken[3] = np.nan
    report = engine_parity(reference, broken, ParityThresholds())
    assert not report.passed and "not finite" in report.failures[0]
    bounded = engine_parity(reference, reference + 0.2, ParityThresholds(max_abs_diff=0.1))
    assert bounded.failures == ["max_abs_diff 0.2 > 0.1"]
    with pytest.raises(ValueError, match="same length"):
        engine_parity(reference, reference[:5], ParityThresholds())


# -- recipe ------------------------------------------------------------------------------------------


def test_gpu_recipe_targets_tensorrt_and_cpu_stays_default():
    gpu = load_recipe("gpu")
    assert gpu.target == "tensorrt" and gpu.tensorrt.opt_batch_size == 32
    assert gpu.publish.scoring_mode == "multi_item"  # the member prefix once per call, as on the CPU
    assert gpu.tensorrt.parity.min_pairwise_agreement > 0 and gpu.tensorrt.parity_prompts >= 16
    profiles = bucket_profiles(
        gpu.publish.length_buckets, gpu.publish.max_batch_size, gpu.tensorrt.opt_batch_size
    )
    assert len(profiles) == len(gpu.publish.length_buckets)
    assert load_recipe("cpu").target == "cpu" and load_recipe("tiny").target == "cpu"


def test_recipe_rejects_bad_tensorrt_settings_naming_the_field():
    with pytest.raises(
        ConfigError, match=r"tensorrt.*opt_batch_size 128 must be within \[1, max_batch_size 64\]"
    ):
        load_recipe("gpu", overrides={"tensorrt": {"opt_batch_size": 128}})
    with pytest.raises(ConfigError, match="warmup_maxbatch"):
        load_recipe("gpu", overrides={"tensorrt": {"warmup_maxbatch": True}})
    with pytest.raises(ConfigError, match="precision"):
        load_recipe("gpu", overrides={"tensorrt": {"precision": "fp4"}})
    with pytest.raises(ConfigError, match="min_spearman"):
        load_recipe("gpu", overrides={"tensorrt": {"parity": {"min_spearman": 1.5}}})


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed here")
def test_tensorrt_build_fails_first_and_clearly_without_tensorrt(tmp_path):
    from slimserve.buildstage.runner import run_build

    recipe = load_recipe("gpu", overrides={"work_dir": str(tmp_path / "work")})
    with pytest.raises(BuildError, match=r"needs TensorRT.*nvcr.io/nvidia/tensorrt:24.10-py3"):
        run_build(recipe)
    assert not (tmp_path / "work").exists()  # nothing trained, nothing written


def test_engines_of_one_student_share_a_directory_across_gpu_types(tmp_path):
    from slimserve.buildstage.context import stage_config
    from slimserve.buildstage.tensorrt_stage import engines_dir

    recipe = load_recipe("gpu", overrides={"work_dir": str(tmp_path)})

    def key(changed):
        return engines_dir(changed, stage_config(changed, "tensorrt"))

    base = key(recipe)
    assert base.parent == tmp_path / "engines"
    publish_only = recipe.model_copy(
        update={
            "tensorrt": recipe.tensorrt.model_copy(update={"instance_count": 4, "warmup_max_batch": False})
        }
    )
    assert key(publish_only) == base  # serving settings do not rebuild engines
    for changed in (
        recipe.model_copy(update={"tensorrt": recipe.tensorrt.model_copy(update={"smoothquant_alpha": 0.8})}),
        recipe.model_copy(
            update={"publish": recipe.publish.model_copy(update={"length_buckets": (128, 512)})}
        ),
        recipe.model_copy(update={"prune": recipe.prune.model_copy(update={"mlp_keep": 512})}),
    ):
        assert key(changed) != base
