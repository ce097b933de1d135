"""A Llama GGUF file's weights as a Hugging Face state dict, read in about 2 s.

transformers loads a GGUF file by parsing it twice with ``gguf.GGUFReader`` (which reads every one of
the tokenizer's 49,152 token strings and merges into NumPy views) and rebuilding a tensor-name map per
tensor: 13-16 s for the packaged SmolLM2-135M on 2 cores, of which the de-quantization is 2 s. This
reader walks the header once, skips the metadata it does not need, and de-quantizes each tensor with
``gguf.quants.dequantize`` and the same reverse permutation of the query and key rows, so the weights
are those transformers loads, to the bit (``tests/test_gguf_weights.py``).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
# GGUF metadata value type -> struct format of a scalar
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

# llama.cpp tensor name (after "blk.N.") -> Hugging Face Llama parameter (after "model.layers.N.")
LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands."""


def _read(stream: BinaryIO, fmt: str):
    size = struct.calcsize("<" + fmt)
    return struct.unpack("<" + fmt, stream.read(size))[0]


def _string(stream: BinaryIO) -> str:
    return stream.read(_read(stream, "Q")).decode("utf-8", errors="replace")


def _value(stream: BinaryIO, kind: int):
    """A scalar or string metadata value."""
    if kind == STRING:
        return _string(stream)
    if kind not in SCALARS:
        raise GGUFFormatError(f"unknown metadata value type {kind}")
    return _read(stream, SCALARS[kind])


def _skip_array(stream: BinaryIO) -> None:
    """Move past an array value (the vocabulary's strings are walked, not read)."""
    item, count = _read(stream, "I"), _read(stream, "Q")
    if item in SCALARS:
        stream.seek(struct.calcsize("<" + SCALARS[item]) * count, 1)
    elif item == STRING:
        for _ in range(count):
            stream.seek(_read(stream, "Q"), 1)
    elif item == ARRAY:
        for _ in range(count):
            _skip_array(stream)
    else:
        raise GGUFFormatError(f"unknown metadata value type {item}")


def read_header(path: Path) -> tuple[dict, list[tuple[str, tuple[int, ...], int, int]], int]:
    """(metadata but the arrays (the tokenizer's vocabulary), tensors as (name, NumPy shape, GGML type,
    offset), data start)."""
    with open(path, "rb") as stream:
        if stream.read(4) != MAGIC:
            raise GGUFFormatError(f"{path}: not a GGUF file")
        version, tensor_count, kv_count = _read(stream, "I"), _read(stream, "Q"), _read(stream, "Q")
        if version < 2:
            raise GGUFFormatError(f"{path}: GGUF version {version} (2 or later is read)")
        metadata = {}
        for _ in range(kv_count):
            key, kind = _string(stream), _read(stream, "I")
            if kind == ARRAY:
                _skip_array(stream)
            else:
                metadata[key] = _value(stream, kind)
        tensors = []
        for _ in range(tensor_count):
            name, dims = _string(stream), _read(stream, "I")
            shape = tuple(reversed([_read(stream, "Q") for _ in range(dims)]))
            tensors.append((name, shape, _read(stream, "I"), _read(stream, "Q")))
        alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-stream.tell() // alignment) * alignment
    return metadata, tensors, start


def _reverse_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's interleaving of each head's rotary halves in the query or key rows."""
    dim = weights.shape[0] // heads // 2
    return weights.reshape(heads, dim, 2, *weights.shape[1:]).swapaxes(2, 1).reshape(weights.shape)


def hf_name(gguf_name: str) -> str:
    """The Hugging Face Llama parameter name of a llama.cpp tensor name."""
    stem, _, kind = gguf_name.rpartition(".")
    if stem.startswith("blk."):
        _, layer, part = stem.split(".", 2)
        if part in LAYER_NAMES:
            return f"model.layers.{layer}.{LAYER_NAMES[part]}.{kind}"
    elif stem in TOP_NAMES:
        return f"{TOP_NAMES[stem]}.{kind}"
    raise GGUFFormatError(f"tensor {gguf_name!r} is not part of a Llama model")


# the Llama config fields transformers takes from a GGUF file's metadata: GGUF key -> LlamaConfig field
CONFIG_KEYS = {
    "llama.context_length": "max_position_embeddings",
    "llama.block_count": "num_hidden_layers",
    "llama.feed_forward_length": "intermediate_size",
    "llama.embedding_length": "hidden_size",
    "llama.rope.dimension_count": "head_dim",
    "llama.attention.head_count": "num_attention_heads",
    "llama.attention.head_count_kv": "num_key_value_heads",
    "llama.attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "llama.vocab_size": "vocab_size",
    "tokenizer.ggml.bos_token_id": "bos_token_id",
    "tokenizer.ggml.eos_token_id": "eos_token_id",
    "tokenizer.ggml.unknown_token_id": "unk_token_id",
    "tokenizer.ggml.padding_token_id": "pad_token_id",
}


def load_llama(path: Path):
    """A float32 ``LlamaForCausalLM`` in eval mode with the weights and config of a Llama GGUF file."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.initialization import no_init_weights

    metadata, tensors, start = read_header(path)
    if metadata.get("general.architecture") != "llama":
        raise GGUFFormatError(f"{path}: architecture {metadata.get('general.architecture')!r}, not llama")
    fields = {field: metadata[key] for key, field in CONFIG_KEYS.items() if key in metadata}
    theta = metadata.get("llama.rope.freq_base")
    if theta is not None:
        fields["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
    tied = all(name != "output.weight" for name, *_ in tensors)
    config = LlamaConfig(**fields, tie_word_embeddings=tied, dtype="float32")
    with no_init_weights(), torch.device("cpu"):
        model = LlamaForCausalLM(config)
    state = _state_dict(path, tensors, start, config.num_attention_heads, config.num_key_value_heads)
    if tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    return model.eval()


def _state_dict(path: Path, tensors: list, start: int, heads: int, kv_heads: int) -> dict:
    """The float32 state dict (Hugging Face names) of the ``tensors`` ``read_header`` listed in a Llama
    GGUF file with ``heads`` query heads and ``kv_heads`` key-value heads."""
    import torch
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    raw = np.memmap(path, dtype=np.uint8, mode="r")
    state = {}
    for name, shape, kind, offset in tensors:
        qtype = GGMLQuantizationType(kind)
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        rows = (*shape[:-1], shape[-1] // block * block_bytes)  # each row of shape[-1] values as bytes
        data = raw[start + offset : start + offset + int(np.prod(rows))].reshape(rows)
        if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            data = data.view(np.float32 if qtype == GGMLQuantizationType.F32 else np.float16)
        weights = dequantize(data, qtype)
        if ".attn_q." in name:
            weights = _reverse_permute(weights, heads)
        elif ".attn_k." in name:
            weights = _reverse_permute(weights, kv_heads)
        state[hf_name(name)] = torch.from_numpy(np.array(weights, dtype=np.float32))
    return state
