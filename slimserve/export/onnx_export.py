"""torch2onnx for the scoring graph: fixed tensor names, dynamic batch and sequence axes."""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path

import torch

from ..bundle import TensorNames
from ..errors import BuildError
from ..models.scorer_graph import ScorerGraph

log = logging.getLogger(__name__)

# Weights above this go to an external data file (protobuf's 2 GiB limit, with margin).
EXTERNAL_DATA_BYTES = 1_800_000_000
DEFAULT_OPSET = 18
DEFAULT_TENSORS = TensorNames()
# Rules of the exporter's onnxscript optimizer that are left out. SlicesSplit (two Slices of one tensor
# -> one Split, the same values) has a matcher that walks the whole graph for every Slice, quadratic in
# the graph: on SmolLM2's 30-layer scorer it took 82 s of the optimizer's 91 s (2 busy cores) and never
# fired, the graph written without it was byte-identical.
SKIPPED_REWRITE_RULES = ("SlicesSplit",)


class ExportError(BuildError):
    """The ONNX export or its parity check failed."""


def _parameter_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


@contextlib.contextmanager
def _quiet_exporter_logs():
    """The exporter logs hundreds of INFO lines (graph passes) and torchvision notices: keep errors only."""
    loggers = [logging.getLogger(name) for name in ("onnx_ir", "onnxscript", "torch.onnx")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


@contextlib.contextmanager
def without_skipped_rewrite_rules():
    """While inside, the exporter's optimizer runs onnxscript's default rewrite rules less
    ``SKIPPED_REWRITE_RULES`` (read by ``onnxscript.optimizer.optimize_ir`` at each call); a no-op where
    onnxscript keeps no such rule list."""
    from onnxscript import rewriter

    rules = getattr(rewriter, "_DEFAULT_REWRITE_RULES", None)
    if rules is None:
        yield
        return
    rewriter._DEFAULT_REWRITE_RULES = tuple(
        rule for rule in rules if getattr(rule, "name", None) not in SKIPPED_REWRITE_RULES
    )
    try:
        yield
    finally:
        rewriter._DEFAULT_REWRITE_RULES = rules


def export_scorer_onnx(
    graph: ScorerGraph,
    path: Path,
    sample_input_ids: torch.Tensor,
    sample_attention_mask: torch.Tensor,
    tensors: TensorNames = DEFAULT_TENSORS,
    opset: int = DEFAULT_OPSET,
) -> list[Path]:
    """Export ``graph`` to ``path``; returns the files written (the graph, plus external data if any)."""
    batch = torch.export.Dim("batch", min=1, max=4096)
    sequence = torch.export.Dim("sequence", min=2, max=8192)
    return _export(
        graph,
        path,
        (sample_input_ids, sample_attention_mask),
        input_names=[tensors.input_ids, tensors.attention_mask],
        output_name=tensors.score,
        dynamic_shapes=({0: batch, 1: sequence}, {0: batch, 1: sequence}),
        opset=opset,
    )


def export_multi_item_onnx(
    scorer: torch.nn.Module,
    path: Path,
    sample: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    tensors: TensorNames = DEFAULT_TENSORS,
    opset: int = DEFAULT_OPSET,
) -> list[Path]:
    """Export a ``MultiItemScorer``: (prefix_ids, prefix_mask [B, P], item_ids, item_mask [B, N, L])
    -> score [B, N], every axis dynamic. The sample must have B, P, N and L each >= 2."""
    members = torch.export.Dim("members", min=1, max=1024)
    prefix = torch.export.Dim("prefix", min=2, max=8192)
    items = torch.export.Dim("items", min=1, max=8192)
    item_length = torch.export.Dim("item_length", min=2, max=8192)
    prefix_axes = {0: members, 1: prefix}
    item_axes = {0: members, 1: items, 2: item_length}
    return _export(
        scorer,
        path,
        sample,
        input_names=[tensors.prefix_ids, tensors.prefix_mask, tensors.item_ids, tensors.item_mask],
        output_name=tensors.score,
        dynamic_shapes=(prefix_axes, prefix_axes, item_axes, item_axes),
        opset=opset,
    )


def _export(module, path, sample, *, input_names, output_name, dynamic_shapes, opset) -> list[Path]:
    path = Path(path)
    external = _parameter_bytes(module) > EXTERNAL_DATA_BYTES
    log.info(
        "exporting ONNX (torch.onnx dynamo, opset %d): about a minute for a 135M model on 2 cores", opset
    )
    with warnings.catch_warnings(), torch.no_grad(), _quiet_exporter_logs(), without_skipped_rewrite_rules():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(
                module.eval(),
                tuple(sample),
                str(path),
                input_names=list(input_names),
                output_names=[output_name],
                dynamic_shapes=dynamic_shapes,
                dynamo=True,
                opset_version=opset,
                external_data=external,
                verbose=False,
            )
        except Exception as exc:  # the exporter raises many types; one error for the caller
            raise ExportError(f"torch.onnx.export failed: {exc}") from exc
    files = [path]
    data = path.with_name(path.name + ".data")
    if data.exists():
        files.append(data)
    log.info("exported %s (%s)", path, ", ".join(f.name for f in files))
    return files
