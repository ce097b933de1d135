"""Structured pruning of Llama-architecture causal LMs: whole layers, query heads per KV group, MLP neurons.

``prune_model`` returns a new standard model (uniform sizes, explicit ``head_dim``) so every exporter
and engine builder accepts it. Steps, each on calibration statistics of the current model:

1. layers: drop those whose skipping changes the final hidden states least (``layer_skip_importance``);
2. heads: per layer keep ``heads_per_kv_group`` query heads in every KV group, chosen to reconstruct
   ``o_proj``'s output; ``o_proj`` re-fitted in closed form (``osscar.select_blocks``);
3. MLP neurons: keep ``mlp_keep`` neurons per layer, chosen to reconstruct ``down_proj``'s output;
   ``down_proj`` re-fitted (``osscar.select_columns``).

``method="magnitude"`` is the baseline at the same sizes: neurons/heads with the largest weight norms
(L2 norm of all weights attached to the neuron, or of the head's ``q_proj`` rows and ``o_proj``
columns), original weights kept. ``method="magnitude+refit"`` is the fair baseline: the same magnitude
choice, then ``down_proj`` (``o_proj``) re-fitted in closed form exactly as OSSCAR re-fits its own
choice, so the two differ only in which units they keep. Layers are chosen by measured importance in
every method.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Literal

import torch
from torch import nn

from . import osscar
from .calibration import as_batches, first_tokens, input_grams, layer_skip_importance
from .surgery import (
    decoder_layers,
    drop_layers,
    head_dim_of,
    layer_prefixes,
    magnitude_heads,
    magnitude_neurons,
    rebuild,
)

log = logging.getLogger(__name__)

Method = Literal["osscar", "magnitude", "magnitude+refit"]
METHODS = ("osscar", "magnitude", "magnitude+refit")


@dataclass
class PruneConfig:
    """Target sizes (``None`` keeps that dimension) and search settings."""

    mlp_keep: int | None = None  # MLP neurons kept per layer (intermediate_size after pruning)
    heads_per_kv_group: int | None = None  # query heads kept per KV head
    layers_keep: int | None = None  # decoder layers kept
    method: Method = "osscar"
    ridge: float = 1e-4  # relative to mean(diag G)
    swap_iterations: int = 32  # bound on local-search swaps per layer
    swap_tolerance: float = 1e-4  # stop swapping when the best swap gains less (relative to the error)
    layer_calibration_tokens: int = 2048  # real tokens used to score layers (L/2 forward passes)

    def __post_init__(self):
        for name in ("mlp_keep", "heads_per_kv_group", "layers_keep"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.ridge < 0:
            raise ValueError(f"ridge must be >= 0, got {self.ridge}")
        if self.swap_tolerance < 0:
            raise ValueError(f"swap_tolerance must be >= 0, got {self.swap_tolerance}")
        if self.swap_iterations < 0:
            raise ValueError(f"swap_iterations must be >= 0, got {self.swap_iterations}")
        if self.layer_calibration_tokens < 1:
            raise ValueError(f"layer_calibration_tokens must be >= 1, got {self.layer_calibration_tokens}")


@dataclass
class ParameterCount:
    embedding: int  # input embeddings (+ LM head when untied)
    non_embedding: int


@dataclass
class LayerResult:
    """One layer's selection; errors are relative to the layer's output energy on calibration data."""

    layer: int  # index in the pruned model
    kept: list[int]  # neurons, or query heads (original numbering within the layer)
    error: float  # the chosen method's error
    magnitude_error: float  # magnitude selection, original weights (the baseline)
    magnitude_refit_error: float  # magnitude selection, re-fitted weights
    greedy_error: float | None  # osscar before swaps
    swaps: int
    seconds: float


@dataclass
class PruneReport:
    method: str
    layers_kept: list[int] = field(default_factory=list)  # original layer indices
    layer_importance: list[float] = field(default_factory=list)  # per original layer
    heads: list[LayerResult] = field(default_factory=list)
    mlp: list[LayerResult] = field(default_factory=list)
    parameters_before: ParameterCount | None = None
    parameters_after: ParameterCount | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def parameter_count(model: nn.Module) -> ParameterCount:
    """Parameters split into embeddings (input, and output when untied) and the rest."""
    embedding_ids = {id(model.get_input_embeddings().weight)}
    head = model.get_output_embeddings()
    if head is not None:
        embedding_ids.add(id(head.weight))
    embedding = non_embedding = 0
    for parameter in model.parameters():  # tied parameters are listed once
        if id(parameter) in embedding_ids:
            embedding += parameter.numel()
        else:
            non_embedding += parameter.numel()
    return ParameterCount(embedding, non_embedding)


def _check_sizes(model: nn.Module, config: PruneConfig) -> None:
    cfg = model.config
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    for name, value, limit, what in (
        ("mlp_keep", config.mlp_keep, cfg.intermediate_size, "intermediate_size"),
        ("heads_per_kv_group", config.heads_per_kv_group, group, "query heads per KV head"),
        ("layers_keep", config.layers_keep, cfg.num_hidden_layers, "num_hidden_layers"),
    ):
        if value is not None and value > limit:
            raise ValueError(f"{name}={value} exceeds the model's {what}={limit}")
    for layer in decoder_layers(model):
        if not all(hasattr(layer, a) for a in ("self_attn", "mlp")) or not hasattr(layer.mlp, "gate_proj"):
            raise ValueError("prune_model supports Llama-architecture models (gate/up/down MLP, q/k/v/o)")


def _select(
    G: torch.Tensor, W: torch.Tensor, config: PruneConfig, magnitude: list[int], search, columns
) -> tuple[list[int], torch.Tensor, LayerResult]:
    """Run the osscar search (or take the magnitude choice); returns kept units, new weight, result."""
    start = time.perf_counter()
    energy = osscar.total_energy(G, W)
    total = max(energy, 1e-300)
    mag_cols = columns(magnitude)
    mag_error = osscar.subset_error(G, W, mag_cols, W.double()[:, mag_cols], energy) / total
    mag_refit = osscar.reconstruction_error(G, W, mag_cols, config.ridge, energy) / total
    if config.method == "magnitude":
        kept, weight, error, greedy, swaps = magnitude, W[:, mag_cols], mag_error, None, 0
    elif config.method == "magnitude+refit":  # the same re-fit as osscar's, on the magnitude choice
        weight = osscar.refit(G, W, mag_cols, config.ridge)
        kept, error, greedy, swaps = magnitude, mag_refit, None, 0
    else:
        chosen = search(G, W)
        kept, weight, error = chosen.kept, chosen.weight, chosen.error / total
        greedy, swaps = chosen.greedy_error / total, chosen.swaps
    result = LayerResult(-1, kept, error, mag_error, mag_refit, greedy, swaps, time.perf_counter() - start)
    return kept, weight.to(W.dtype), result


def prune_heads(
    model: nn.Module, batches, config: PruneConfig, progress=None
) -> tuple[nn.Module, list[LayerResult]]:
    """Keep ``config.heads_per_kv_group`` query heads per KV head in every layer; re-fit ``o_proj``."""
    cfg = model.config
    head_dim, group, keep = (
        head_dim_of(cfg),
        cfg.num_attention_heads // cfg.num_key_value_heads,
        config.heads_per_kv_group,
    )
    layers = decoder_layers(model)
    grams = input_grams(model, batches, {str(i): layer.self_attn.o_proj for i, layer in enumerate(layers)})
    state, results, prefixes = model.state_dict(), [], layer_prefixes(model)

    def columns(heads):
        return torch.cat([torch.arange(h * head_dim, (h + 1) * head_dim) for h in heads])

    for index, layer in enumerate(layers):
        attn, prefix = layer.self_attn, prefixes[index] + "self_attn."
        W = attn.o_proj.weight.detach()
        kept, weight, result = _select(
            grams[str(index)],
            W,
            config,
            magnitude_heads(attn, group, keep, head_dim),
            lambda G, W: osscar.select_blocks(
                G, W, head_dim, group, keep, config.ridge, config.swap_iterations
            ),
            columns,
        )
        rows = columns(kept)
        state[prefix + "q_proj.weight"] = attn.q_proj.weight.detach()[rows]
        if attn.q_proj.bias is not None:
            state[prefix + "q_proj.bias"] = attn.q_proj.bias.detach()[rows]
        state[prefix + "o_proj.weight"] = weight
        result.layer = index
        results.append(result)
        log.info(
            "heads layer %d: kept %s, relative error %.4g (magnitude %.4g, %d swaps)",
            index, kept, result.error, result.magnitude_error, result.swaps,
        )  # fmt: skip
        if progress is not None:
            progress()
    new = rebuild(model, state, num_attention_heads=cfg.num_key_value_heads * keep)
    return new, results


def prune_mlp(
    model: nn.Module, batches, config: PruneConfig, progress=None
) -> tuple[nn.Module, list[LayerResult]]:
    """Keep ``config.mlp_keep`` neurons in every layer's MLP; re-fit ``down_proj``."""
    layers = decoder_layers(model)
    grams = input_grams(model, batches, {str(i): layer.mlp.down_proj for i, layer in enumerate(layers)})
    state, results, k, prefixes = model.state_dict(), [], config.mlp_keep, layer_prefixes(model)
    for index, layer in enumerate(layers):
        mlp, prefix = layer.mlp, prefixes[index] + "mlp."
        kept, weight, result = _select(
            grams.pop(str(index)),
            mlp.down_proj.weight.detach(),
            config,
            magnitude_neurons(mlp, k),
            lambda G, W: osscar.select_columns(
                G, W, k, config.ridge, config.swap_iterations, config.swap_tolerance
            ),
            lambda units: torch.as_tensor(units, dtype=torch.long),
        )
        rows = torch.as_tensor(kept, dtype=torch.long)
        for name in ("gate_proj", "up_proj"):
            linear = getattr(mlp, name)
            state[prefix + name + ".weight"] = linear.weight.detach()[rows]
            if linear.bias is not None:
                state[prefix + name + ".bias"] = linear.bias.detach()[rows]
        state[prefix + "down_proj.weight"] = weight
        result.layer = index
        results.append(result)
        log.info(
            "mlp layer %d/%d: relative error %.4g (greedy %.4g, magnitude %.4g, magnitude+refit %.4g), "
            "%d swaps, %.1fs",
            index + 1, len(layers), result.error, result.greedy_error or result.error,
            result.magnitude_error, result.magnitude_refit_error, result.swaps, result.seconds,
        )  # fmt: skip
        if progress is not None:
            progress()
    return rebuild(model, state, intermediate_size=k), results


def prune_model(
    model: nn.Module, calibration_batches: Iterable, config: PruneConfig
) -> tuple[nn.Module, PruneReport]:
    """Prune ``model`` (left unchanged) to ``config``'s sizes; returns a new model and a report.
    A progress bar (with an ETA) counts the layer selection, then each layer's heads and MLP."""
    from .trainer import progress_bar

    _check_sizes(model, config)
    batches = as_batches(calibration_batches)
    report = PruneReport(method=config.method, parameters_before=parameter_count(model))
    current = model.eval()
    layers = config.layers_keep or model.config.num_hidden_layers
    steps = (config.layers_keep is not None) + layers * (
        (config.heads_per_kv_group is not None) + (config.mlp_keep is not None)
    )
    only_layers = config.heads_per_kv_group is None and config.mlp_keep is None
    desc = "layer selection (skip importance)" if only_layers else f"prune ({config.method})"
    with torch.no_grad(), progress_bar(steps, desc, unit="step") as bar:
        if config.layers_keep is not None:
            start = time.perf_counter()
            subset = first_tokens(batches, config.layer_calibration_tokens)
            importance = layer_skip_importance(current, subset)
            keep = sorted(sorted(range(len(importance)), key=importance.__getitem__)[-config.layers_keep :])
            for index, value in enumerate(importance):
                log.info("layer %d: importance %.4g%s", index, value, "" if index in keep else " (dropped)")
            report.layer_importance, report.layers_kept = importance, keep
            current = drop_layers(current, keep)
            report.seconds["layers"] = time.perf_counter() - start
            bar.update()
        if config.heads_per_kv_group is not None:
            start = time.perf_counter()
            current, report.heads = prune_heads(current, batches, config, bar.update)
            report.seconds["heads"] = time.perf_counter() - start
        if config.mlp_keep is not None:
            start = time.perf_counter()
            current, report.mlp = prune_mlp(current, batches, config, bar.update)
            report.seconds["mlp"] = time.perf_counter() - start
    if current is model:
        current = rebuild(model, model.state_dict())
    report.parameters_after = parameter_count(current)
    return current, report
