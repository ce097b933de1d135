"""slimserve.models.gguf_weights: the packaged teacher read straight from its GGUF file."""

from __future__ import annotations

import pytest
import torch

from slimserve.models.gguf_weights import GGUFFormatError, hf_name, load_llama, read_header
from slimserve.models.teacher import default_teacher_gguf


def test_the_packaged_teacher_loads_as_transformers_loads_it_to_the_bit():
    from transformers import AutoModelForCausalLM

    path = default_teacher_gguf()
    fast = load_llama(path)
    reference = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype="float32")
    ours, theirs = fast.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    assert [name for name in theirs if not torch.equal(ours[name], theirs[name])] == []
    assert fast.lm_head.weight.data_ptr() == fast.model.embed_tokens.weight.data_ptr()  # tied, as packaged
    provenance = {"_name_or_path", "_model_name_or_path", "quantization_config"}
    config = {k: v for k, v in fast.config.to_dict().items() if k not in provenance}
    assert config == {k: v for k, v in reference.config.to_dict().items() if k not in provenance}
    assert fast.generation_config.to_dict() == reference.generation_config.to_dict()
    ids = torch.tensor([[1, 504, 3458, 314, 253]])
    with torch.no_grad():
        assert torch.equal(fast(ids).logits, reference.eval()(ids).logits)


def test_the_header_lists_every_tensor_and_skips_the_vocabulary():
    metadata, tensors, start = read_header(default_teacher_gguf())
    assert metadata["general.architecture"] == "llama" and metadata["llama.block_count"] == 30
    assert not any(key.startswith("tokenizer.ggml.tokens") for key in metadata)  # an array: skipped
    assert len(tensors) == 272 and start % 32 == 0
    names = {hf_name(name) for name, *_ in tensors}
    assert "model.layers.29.mlp.down_proj.weight" in names and "model.embed_tokens.weight" in names


def test_what_is_not_a_llama_gguf_file_is_refused(tmp_path):
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"ONNX" + bytes(64))
    with pytest.raises(GGUFFormatError, match="not a GGUF file"):
        read_header(not_gguf)
    with pytest.raises(GGUFFormatError, match="not part of a Llama model"):
        hf_name("blk.0.ffn_gate_exps.weight")
