"""Output-vocabulary shortlist of a decoder graph: the LM head scores a fixed token list plus the prompt's.

A small generator spends much of each decode step in its LM head: 576 x 49,152 for SmolLM2, about half
the cpu recipe's student. ``trim_lm_head`` rewrites the graph so the head scores only

- a fixed **shortlist** of token ids (the tokenizer's most frequent: the lowest ids of a BPE vocabulary,
  which are its earliest merges; plus the end ids and any the caller adds), and
- the ids the caller feeds in the new input ``extra_token_ids`` per step: the serving engine feeds the
  running prompts' own tokens, so a skill or name the model should copy from its prompt stays writable.

The output ``logits`` [batch, 1, len(shortlist) + len(extra_token_ids)] are in that order; the engine
maps an index back to a token id (``slimserve.triton_models.generator.OnnxDecoder``), reading
``output_vocab.json`` beside the graph. The extra rows are gathered from the input embedding, so the
model must tie its embedding and LM head (SmolLM2 does). The quantized head (``MatMulNBits``) is sliced
row-wise; the embedding is left whole, so every token id still reads as input.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..triton_models.generator import EXTRA_TOKENS_INPUT, OUTPUT_VOCAB_FILE
from .onnx_export import ExportError

LOGITS = "logits"


def shortlist(vocab_size: int, lowest: int, extra: Iterable[int] = ()) -> list[int]:
    """Sorted unique token ids: ``0 .. lowest-1`` and ``extra`` (all inside ``[0, vocab_size)``)."""
    if not 1 <= lowest <= vocab_size:
        raise ExportError(f"output_vocab must be in [1, {vocab_size}] (the vocabulary), got {lowest}")
    ids = set(range(lowest)) | {int(i) for i in extra}
    outside = [i for i in ids if not 0 <= i < vocab_size]
    if outside:
        raise ExportError(f"output token id {outside[0]} is outside the vocabulary [0, {vocab_size})")
    return sorted(ids)


def _producer(graph, name: str):
    node = next((n for n in graph.node if name in n.output), None)
    if node is None:
        raise ExportError(f"the decoder graph has no node producing {name!r}")
    return node


def _embedding_table(graph) -> str:
    """The tensor the input ids are looked up in (the tied LM-head weight, as [vocab, hidden])."""
    node = next((n for n in graph.node if n.op_type == "Gather" and "input_ids" in n.input[1:]), None)
    if node is None:
        raise ExportError("the decoder graph has no embedding Gather over 'input_ids'")
    return node.input[0]


def _slice_rows(initializers: dict, name: str, rows: np.ndarray, vocab_size: int) -> None:
    """Keep ``rows`` of an initializer whose leading axis (or flat length) holds one block per token."""
    from onnx import numpy_helper

    tensor = initializers[name]
    array = numpy_helper.to_array(tensor)
    flat = array.ndim == 1
    per_token = array.reshape(vocab_size, -1)[rows]
    kept = per_token.reshape(-1) if flat else per_token.reshape(len(rows), *array.shape[1:])
    tensor.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(kept), name))


def _trim_head(graph, head, rows: np.ndarray, vocab_size: int) -> None:
    """Make the LM-head node score ``rows`` only (fp32 ``MatMul`` [hidden, vocab] or ``MatMulNBits``)."""
    from onnx import helper, numpy_helper

    initializers = {t.name: t for t in graph.initializer}
    if head.op_type == "MatMul":
        weight = numpy_helper.to_array(initializers[head.input[1]])
        trimmed = f"{head.input[1]}.shortlist"
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(weight[:, rows]), trimmed))
        head.input[1] = trimmed  # the embedding keeps reading the whole weight
    elif head.op_type == "MatMulNBits":
        for name in head.input[1:4]:  # quantized weight, scales, zero points: one block row per token
            if name in initializers:
                _slice_rows(initializers, name, rows, vocab_size)
        for attribute in head.attribute:
            if attribute.name == "N":
                attribute.CopyFrom(helper.make_attribute("N", len(rows)))
    else:
        raise ExportError(f"the LM head is a {head.op_type} node; only MatMul and MatMulNBits are trimmed")


def _add_extra_rows(graph, head, static_logits: str) -> None:
    """``logits`` = concat(static logits, hidden @ embedding[extra_token_ids]^T) over the last axis."""
    from onnx import TensorProto, helper

    graph.input.append(helper.make_tensor_value_info(EXTRA_TOKENS_INPUT, TensorProto.INT64, ["extra_tokens"]))
    prefix = "/lm_head/extra"
    graph.node.extend(
        [
            helper.make_node(
                "Gather", [_embedding_table(graph), EXTRA_TOKENS_INPUT], [f"{prefix}/rows"], axis=0
            ),
            helper.make_node("Transpose", [f"{prefix}/rows"], [f"{prefix}/columns"], perm=[1, 0]),
            helper.make_node("MatMul", [head.input[0], f"{prefix}/columns"], [f"{prefix}/logits"]),
            helper.make_node("Concat", [static_logits, f"{prefix}/logits"], [LOGITS], axis=-1),
        ]
    )


def trim_lm_head(onnx_path: Path, token_ids: list[int], vocab_size: int) -> None:
    """Rewrite the decoder graph at ``onnx_path`` (with its external data) to score ``token_ids`` plus
    the ``extra_token_ids`` input, and write ``output_vocab.json`` beside it."""
    import onnx

    onnx_path = Path(onnx_path)
    model = onnx.load(str(onnx_path))
    graph = model.graph
    head = _producer(graph, LOGITS)
    rows = np.asarray(token_ids, dtype=np.int64)
    _trim_head(graph, head, rows, vocab_size)
    head.output[0] = "/lm_head/shortlist/logits"
    _add_extra_rows(graph, head, head.output[0])
    logits = next(o for o in graph.output if o.name == LOGITS)
    logits.type.tensor_type.shape.dim[-1].ClearField("dim_value")
    logits.type.tensor_type.shape.dim[-1].dim_param = "output_vocab"
    data_file = f"{onnx_path.name}.data"
    with tempfile.TemporaryDirectory(dir=onnx_path.parent, prefix=".trim-") as tmp:
        onnx.save_model(
            model,
            str(Path(tmp) / onnx_path.name),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data_file,
        )
        for name in (onnx_path.name, data_file):
            shutil.move(str(Path(tmp) / name), str(onnx_path.parent / name))
    (onnx_path.parent / OUTPUT_VOCAB_FILE).write_text(
        json.dumps({"vocab_size": vocab_size, "token_ids": [int(i) for i in rows]}) + "\n"
    )
