"""The TensorRT target's multi-item pieces that run without a GPU: optimization profiles over item-length
buckets and item counts, the ``tensorrt_plan`` config from the typed generator, checked against the
exported multi-item ONNX graph. Building and running engines needs TensorRT and a GPU
(``scripts/gpu-check.sh``)."""

from __future__ import annotations

import pytest

from slimserve.bundle import bundle_dir_for
from slimserve.export.tensorrt.profiles import multi_item_profiles, trtexec_shape_flags
from slimserve.export.tensorrt.triton_spec import tensorrt_multi_item_scorer_spec
from slimserve.export.triton_config import (
    check_against_onnx,
    check_config,
    parse_config_pbtxt,
    render_config_pbtxt,
)


def test_one_profile_per_item_bucket_covering_every_length():
    profiles = multi_item_profiles((128, 32, 64, 64), prefix_max=320, max_items=256)
    assert [(p.bucket, p.min_length) for p in profiles] == [(32, 1), (64, 33), (128, 65)]
    shapes = profiles[1].shapes()
    assert shapes["prefix_ids"] == ((1, 1), (1, 160), (1, 320))
    assert shapes["item_ids"] == ((1, 1, 33), (1, 64, 64), (1, 256, 64))
    assert shapes["item_mask"] == shapes["item_ids"] and shapes["prefix_mask"] == shapes["prefix_ids"]
    assert profiles[2].holds(1, 300, 200, 100) and not profiles[2].holds(1, 300, 257, 100)
    assert not profiles[1].holds(1, 10, 10, 65)


def test_profiles_reject_impossible_sizes():
    with pytest.raises(ValueError, match="item_length_buckets"):
        multi_item_profiles((), 320, 8)
    with pytest.raises(ValueError, match="opt_items"):
        multi_item_profiles((32,), 320, 8, opt_items=9)


def test_trtexec_flags_name_every_input_with_its_own_shape():
    (profile,) = multi_item_profiles((32,), prefix_max=64, max_items=8)
    flags = trtexec_shape_flags([profile])
    assert flags[0] == "--minShapes=prefix_ids:1x1,prefix_mask:1x1,item_ids:1x1x1,item_mask:1x1x1"
    assert flags[2] == "--maxShapes=prefix_ids:1x64,prefix_mask:1x64,item_ids:1x8x32,item_mask:1x8x32"


def test_config_is_valid_and_matches_the_multi_item_onnx_graph(tiny_multi_item_repository):
    profiles = multi_item_profiles((32, 64, 128), prefix_max=192, max_items=4)
    spec = tensorrt_multi_item_scorer_spec("scorer", profiles, {"9.0": "model_sm90.plan"})
    config = parse_config_pbtxt(render_config_pbtxt(spec))
    check_config(config)
    assert config.platform == "tensorrt_plan" and config.max_batch_size == 0
    assert [g.profile for g in config.instance_group] == [["0", "1", "2"]]
    assert len(config.model_warmup) == 3
    onnx = bundle_dir_for(tiny_multi_item_repository, "scorer").parent / "model.onnx"
    check_against_onnx(spec, onnx)
