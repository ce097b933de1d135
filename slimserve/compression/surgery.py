"""Model surgery for pruning: rebuild a standard model from sliced weights, drop layers, magnitude scores.

Every change produces a fresh model of the input's class from a deep-copied config (sizes changed,
``head_dim`` explicit, quantization provenance removed) and a complete state dict loaded strictly, so
``save_pretrained`` / ``from_pretrained`` see a plain standard checkpoint.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    return model.get_decoder().layers


def layer_prefixes(model: nn.Module) -> list[str]:
    """State-dict key prefix of each decoder layer (``model.layers.3.`` for LlamaForCausalLM)."""
    names = {id(module): name for name, module in model.named_modules()}
    return [names[id(layer)] + "." for layer in decoder_layers(model)]


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rebuild(model: nn.Module, state: dict[str, torch.Tensor], **changes) -> nn.Module:
    """A fresh model of the same class with ``changes`` applied to its config, loaded from ``state``."""
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):  # e.g. GGUF provenance: the new weights are plain
        del config.quantization_config
    config.head_dim = head_dim_of(model.config)
    for key, value in changes.items():
        setattr(config, key, value)
    dtype = next(model.parameters()).dtype
    new = type(model)(config).to(dtype)
    new.load_state_dict(state, strict=True)
    new.generation_config = copy.deepcopy(model.generation_config)
    return new.eval()


def drop_layers(model: nn.Module, keep: list[int]) -> nn.Module:
    """Keep decoder layers ``keep`` (ascending); the new model numbers them 0..len-1."""
    renamed = {old: new for new, old in enumerate(keep)}
    state = {}
    for key, tensor in model.state_dict().items():
        parts = key.split(".")
        if "layers" in parts and parts[parts.index("layers") + 1].isdigit():
            at = parts.index("layers") + 1
            if int(parts[at]) not in renamed:
                continue
            parts[at] = str(renamed[int(parts[at])])
        state[".".join(parts)] = tensor
    changes = {"num_hidden_layers": len(keep)}
    if isinstance(getattr(model.config, "layer_types", None), list):
        changes["layer_types"] = [model.config.layer_types[i] for i in keep]
    return rebuild(model, state, **changes)


def magnitude_neurons(mlp: nn.Module, k: int) -> list[int]:
    """Baseline: the ``k`` neurons with the largest L2 norm of their gate row, up row and down column."""
    score = mlp.gate_proj.weight.pow(2).sum(1) + mlp.up_proj.weight.pow(2).sum(1)
    score = score + mlp.down_proj.weight.pow(2).sum(0)
    return sorted(torch.topk(score, k).indices.tolist())


def magnitude_heads(attn: nn.Module, group: int, keep: int, head_dim: int) -> list[int]:
    """Baseline: per KV group the ``keep`` query heads with the largest norm of q rows and o columns."""
    q = attn.q_proj.weight.reshape(-1, head_dim, attn.q_proj.weight.shape[1]).pow(2).sum((1, 2))
    o = attn.o_proj.weight.reshape(attn.o_proj.weight.shape[0], -1, head_dim).pow(2).sum((0, 2))
    score = (q + o).reshape(-1, group)
    top = torch.topk(score, keep, dim=1).indices + torch.arange(score.shape[0])[:, None] * group
    return sorted(top.flatten().tolist())
