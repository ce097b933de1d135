"""Structured pruning: the reconstruction objective, the OSSCAR-style search, and the pruned model."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from slimserve.compression import osscar
from slimserve.compression.calibration import MultiItemCalibration, input_grams, layer_skip_importance
from slimserve.compression.prune import PruneConfig, prune_model

VOCAB = 256


def _tiny_model(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        initializer_range=0.1,  # larger than default so activations are far from linear
    )
    return LlamaForCausalLM(config).eval()


def _batches(count: int = 4, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        ids = torch.randint(3, VOCAB, (4, 40), generator=generator)
        mask = torch.ones_like(ids)
        for row, length in enumerate((40, 33, 25, 18)):
            mask[row, length:] = 0
            ids[row, length:] = 0
        batches.append((ids, mask))
    return batches


@pytest.fixture(scope="module")
def tiny():
    return _tiny_model()


@pytest.fixture(scope="module")
def mlp_gram(tiny):
    """Gram matrix of layer 1's down_proj input and its weight."""
    layer = tiny.model.layers[1]
    with torch.no_grad():
        grams = input_grams(tiny, _batches(), {"down": layer.mlp.down_proj})
    return grams["down"], layer.mlp.down_proj.weight.detach().double()


@pytest.fixture(scope="module")
def pruned(tiny):
    config = PruneConfig(mlp_keep=48, heads_per_kv_group=1, layers_keep=3)
    return prune_model(tiny, _batches(), config)


def _correlated(tokens=400, d=40, d_out=12, seed=0):
    generator = torch.Generator().manual_seed(seed)
    mix = torch.randn(d, d, generator=generator, dtype=torch.float64) * 0.4
    A = torch.randn(tokens, d, generator=generator, dtype=torch.float64) @ mix
    A = A + torch.randn(tokens, d, generator=generator, dtype=torch.float64)
    W = torch.randn(d_out, d, generator=generator, dtype=torch.float64)
    return A, W


@pytest.mark.parametrize("ridge", [0.0, 1e-2])
def test_error_from_gram_equals_direct_reconstruction_error(ridge):
    A, W = _correlated()
    G, S = A.T @ A, [0, 3, 5, 8, 13, 21, 34]
    refit = osscar.refit(G, W, S, ridge)
    direct = float(((A @ W.T - A[:, S] @ refit.T) ** 2).sum())
    assert osscar.reconstruction_error(G, W, S, ridge) == pytest.approx(direct, rel=1e-9)
    if ridge == 0.0:  # the least-squares optimum: lstsq agrees
        lstsq = torch.linalg.lstsq(A[:, S], A @ W.T).solution.T
        assert torch.allclose(refit, lstsq, atol=1e-8)
        explained = float(((G[:, S] @ refit.T) * W.T).sum())
        assert osscar.total_energy(G, W) - explained == pytest.approx(direct, rel=1e-9)


def test_greedy_is_exact_backward_elimination():
    A, W = _correlated(d=16)
    G = A.T @ A
    lam, C = osscar.ridge_value(G, 1e-3), G @ W.T
    brute = list(range(16))
    while len(brute) > 6:  # drop the column whose removal costs least, by direct evaluation
        brute.remove(
            min(brute, key=lambda c: osscar.reconstruction_error(G, W, [b for b in brute if b != c], 1e-3))
        )
    assert osscar.greedy_backward(G, C, 6, lam) == sorted(brute)


def test_local_search_beats_random_greedy_and_magnitude(mlp_gram):
    G, W = mlp_gram
    k = 40
    selection = osscar.select_columns(G, W, k, ridge=1e-4, swap_iterations=50)
    assert len(selection.kept) == k and selection.weight.shape == (W.shape[0], k)
    assert selection.error <= selection.greedy_error * (1 + 1e-9)
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        random = torch.randperm(G.shape[0], generator=generator)[:k]
        assert selection.error < osscar.reconstruction_error(G, W, random, 1e-4)
    magnitude = torch.topk(W.norm(dim=0), k).indices
    assert selection.error < osscar.reconstruction_error(G, W, magnitude, 1e-4)
    assert selection.error < osscar.subset_error(G, W, magnitude, W[:, magnitude])


def test_swaps_improve_a_poor_start(mlp_gram):
    G, W = mlp_gram
    lam, C = osscar.ridge_value(G, 1e-4), G @ W.T
    start = list(range(0, 128, 4))
    kept, swaps = osscar.swap_search(G, C, start, lam, iterations=20)
    assert swaps > 0 and len(kept) == len(start)
    assert osscar.reconstruction_error(G, W, kept, 1e-4) < osscar.reconstruction_error(G, W, start, 1e-4)


def test_closed_form_refit_beats_original_weights(mlp_gram):
    G, W = mlp_gram
    S = osscar.select_columns(G, W, 32, swap_iterations=0).kept
    assert osscar.reconstruction_error(G, W, S) < osscar.subset_error(G, W, S, W[:, S])


def test_pruned_model_is_a_standard_config_with_uniform_sizes(tiny, pruned):
    model, report = pruned
    config = model.config
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (config.num_hidden_layers, config.intermediate_size) == (3, 48)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (2, 2, 16)
    for index, layer in enumerate(model.model.layers):
        assert layer.self_attn.layer_idx == index
        assert layer.mlp.gate_proj.weight.shape == (48, 64)
        assert layer.mlp.down_proj.weight.shape == (64, 48)
        assert layer.self_attn.q_proj.weight.shape == (32, 64)
        assert layer.self_attn.o_proj.weight.shape == (64, 32)
    assert len(report.layers_kept) == 3 and len(report.layer_importance) == 4
    assert report.parameters_after.embedding == report.parameters_before.embedding
    assert report.parameters_after.non_embedding < report.parameters_before.non_embedding
    for result in report.mlp + report.heads:
        assert result.error <= result.magnitude_refit_error * (1 + 1e-9)
        assert result.error < result.magnitude_error
    assert tiny.config.num_hidden_layers == 4  # the input model is untouched


def test_pruned_model_round_trips_through_save_pretrained(pruned, tmp_path, caplog):
    from transformers import AutoModelForCausalLM

    model, _ = pruned
    model.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        loaded, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    assert not [r for r in caplog.records if "weight" in r.getMessage().lower()]
    ids, mask = _batches(1, seed=7)[0]
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
        actual = loaded.eval()(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(expected, actual)


def test_dropped_layers_generate_with_cache(pruned):
    model, _ = pruned
    prompt = torch.tensor([[5, 17, 42, 9, 100]])
    with torch.no_grad():
        generated = model.generate(prompt, max_new_tokens=4, do_sample=False, use_cache=True)
        full = model(generated[:, :-1], use_cache=False).logits
    # greedy decoding with the KV cache agrees with one uncached forward pass
    assert torch.equal(full[0, prompt.shape[1] - 1 :].argmax(-1), generated[0, prompt.shape[1] :])


def test_pruned_model_exports_the_scorer_to_onnx(pruned, tmp_path):
    import onnxruntime

    from slimserve.export.onnx_export import export_scorer_onnx
    from slimserve.models.scorer_graph import ScorerGraph

    model, _ = pruned
    graph = ScorerGraph(model, 11, 12).eval()
    ids, mask = _batches(1, seed=3)[0]
    path = tmp_path / "scorer.onnx"
    export_scorer_onnx(graph, path, ids, mask)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (onnx_score,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        torch_score = graph(ids, mask).numpy()
    np.testing.assert_allclose(onnx_score, torch_score, atol=1e-4)


def test_magnitude_baseline_prunes_to_the_same_sizes(tiny):
    model, report = prune_model(
        tiny, _batches(2), PruneConfig(mlp_keep=48, heads_per_kv_group=1, method="magnitude")
    )
    assert (model.config.intermediate_size, model.config.num_attention_heads) == (48, 2)
    assert all(r.error == r.magnitude_error and r.greedy_error is None for r in report.mlp + report.heads)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mlp_keep": 0}, "mlp_keep"),
        ({"heads_per_kv_group": -1}, "heads_per_kv_group"),
        ({"layers_keep": 0}, "layers_keep"),
        ({"method": "random"}, "method"),
        ({"ridge": -1.0}, "ridge"),
        ({"swap_iterations": -2}, "swap_iterations"),
    ],
)
def test_bad_config_values_raise_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        PruneConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mlp_keep": 129}, "mlp_keep"),
        ({"heads_per_kv_group": 3}, "heads_per_kv_group"),
        ({"layers_keep": 5}, "layers_keep"),
    ],
)
def test_keeping_more_than_exists_raises_naming_the_field(tiny, kwargs, field):
    with pytest.raises(ValueError, match=field):
        prune_model(tiny, _batches(1), PruneConfig(**kwargs))


def test_calibration_without_real_tokens_is_rejected(tiny):
    ids = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(ValueError, match="calibration_batches"):
        prune_model(tiny, [(ids, torch.zeros_like(ids))], PruneConfig(mlp_keep=8))


def _members(counts=(3, 1, 2), seed: int = 2):
    """Multi-item calibration batch: members with prefixes of different lengths and ``counts`` items
    each (items of different lengths), and each member's single sequences prefix + item."""
    generator = torch.Generator().manual_seed(seed)
    prefixes = [
        torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in (21, 14, 9)[: len(counts)]
    ]
    items = [
        [torch.randint(3, VOCAB, (int(n),), generator=generator).tolist() for n in (7, 4, 11)[:count]]
        for count in counts
    ]
    from slimserve.tokenization import pad_multi_item

    batch = MultiItemCalibration(*(torch.from_numpy(a) for a in pad_multi_item(prefixes, items)))
    return batch, prefixes, items


def _single(sequences):
    from slimserve.compression.batches import pad_right

    return [pad_right(sequences)]


def test_multi_item_grams_count_each_prefix_once(tiny):
    """Prefix activations do not depend on the item, so the multi-item Gram is the single-sequence Gram
    of every prefix + item, less the prefix's share counted N - 1 extra times."""
    batch, prefixes, items = _members()
    layer = tiny.model.layers[2]
    modules = {"down": layer.mlp.down_proj, "o": layer.self_attn.o_proj}
    with torch.no_grad():
        multi = input_grams(tiny, [batch], modules)
        full = input_grams(
            tiny, _single([p + i for p, group in zip(prefixes, items, strict=True) for i in group]), modules
        )
        prefix_only = input_grams(
            tiny, _single([p for p, group in zip(prefixes, items, strict=True) for _ in group[1:]]), modules
        )
    for name in modules:  # float32 activations: differences of float32 rounding only
        expected = full[name] - prefix_only[name]
        scale = float(expected.abs().max())
        torch.testing.assert_close(multi[name], expected, rtol=0, atol=1e-5 * scale)


def test_multi_item_layer_importance_equals_single_sequence_with_one_item_each(tiny):
    batch, prefixes, items = _members(counts=(1, 1, 1))
    sequences = [p + group[0] for p, group in zip(prefixes, items, strict=True)]
    with torch.no_grad():
        multi = layer_skip_importance(tiny, [batch])
        single = layer_skip_importance(tiny, _single(sequences))
    np.testing.assert_allclose(multi, single, rtol=1e-5)


def test_prune_model_calibrates_on_multi_item_batches(tiny):
    batches = [_members(seed=s)[0] for s in range(3)]
    model, report = prune_model(tiny, batches, PruneConfig(mlp_keep=48, heads_per_kv_group=1, layers_keep=3))
    assert (model.config.num_hidden_layers, model.config.intermediate_size) == (3, 48)
    assert all(0 <= r.error <= r.magnitude_refit_error + 1e-9 for r in report.mlp)


def test_magnitude_with_refit_keeps_the_magnitude_choice_and_refits_like_osscar(tiny):
    sizes = {"mlp_keep": 48, "heads_per_kv_group": 1}
    _, plain = prune_model(tiny, _batches(2), PruneConfig(method="magnitude", **sizes))
    model, report = prune_model(tiny, _batches(2), PruneConfig(method="magnitude+refit", **sizes))
    _, searched = prune_model(tiny, _batches(2), PruneConfig(method="osscar", **sizes))
    assert (model.config.intermediate_size, model.config.num_attention_heads) == (48, 2)
    assert report.method == "magnitude+refit"
    for refit, magnitude in zip(report.heads + report.mlp, plain.heads + plain.mlp, strict=True):
        assert refit.kept == magnitude.kept and refit.greedy_error is None and refit.swaps == 0
        assert refit.error == refit.magnitude_refit_error
    # The first layer's heads see the same inputs in all three (later units follow each method's weights).
    assert report.heads[0].error <= plain.heads[0].error
    assert searched.heads[0].error <= report.heads[0].error * (1 + 1e-9)
