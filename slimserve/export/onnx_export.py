"""torch2onnx for the scoring graph: fixed tensor names, dynamic batch and sequence axes.

Two exporters give the same graph to within the parity gate: ``torchscript`` (the default; it traces
the module once) and ``dynamo`` (``torch.export``). On a 2-core AMD EPYC (AVX2) the multi-item graph of
SmolLM2-135M took 17.5 s with the first and 180 s with the second, almost all of it ``torch.export``'s
symbolic-shape tracing, for the same ONNX Runtime speed and parity within 4e-5 (docs/multi-item.md,
"The exporter"). The TorchScript exporter is deprecated upstream but kept in the pinned torch 2.13.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ..bundle import TensorNames
from ..errors import BuildError
from ..models.scorer_graph import ScorerGraph
from ..onnx_files import onnx_model_files
from ..quiet_logs import quiet_loggers
from .exporters import DEFAULT_EXPORTER, EXPORTERS, OnnxExporter

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


@dataclass(frozen=True)
class Axis:
    """A dynamic axis: its name (shared by inputs that must agree) and its bounds (``dynamo`` checks them)."""

    name: str
    min: int
    max: int


def _parameter_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _quiet_exporter_logs():
    """The exporter logs hundreds of INFO lines (graph passes) and torchvision notices: keep errors only."""
    return quiet_loggers(("onnx_ir", "onnxscript", "torch.onnx"), logging.ERROR)


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
    exporter: OnnxExporter = DEFAULT_EXPORTER,
) -> list[Path]:
    """Export ``graph`` to ``path``; returns the files written (the graph, plus external data if any)."""
    batch, sequence = Axis("batch", 1, 4096), Axis("sequence", 2, 8192)
    return _export(
        graph,
        path,
        (sample_input_ids, sample_attention_mask),
        inputs={tensors.input_ids: (batch, sequence), tensors.attention_mask: (batch, sequence)},
        output=(tensors.score, (batch,)),
        opset=opset,
        exporter=exporter,
    )


def export_multi_item_onnx(
    scorer: torch.nn.Module,
    path: Path,
    sample: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    tensors: TensorNames = DEFAULT_TENSORS,
    opset: int = DEFAULT_OPSET,
    exporter: OnnxExporter = DEFAULT_EXPORTER,
) -> list[Path]:
    """Export a ``MultiItemScorer``: (prefix_ids, prefix_mask [B, P], item_ids, item_mask [B, N, L])
    -> score [B, N], every axis dynamic. The sample must have B, P, N and L each >= 2."""
    members, prefix = Axis("members", 1, 1024), Axis("prefix", 2, 8192)
    items, item_length = Axis("items", 1, 8192), Axis("item_length", 2, 8192)
    return _export(
        scorer,
        path,
        sample,
        inputs={
            tensors.prefix_ids: (members, prefix),
            tensors.prefix_mask: (members, prefix),
            tensors.item_ids: (members, items, item_length),
            tensors.item_mask: (members, items, item_length),
        },
        output=(tensors.score, (members, items)),
        opset=opset,
        exporter=exporter,
    )


def _dynamo_shapes(inputs: dict[str, tuple[Axis, ...]]) -> tuple[dict, ...]:
    """``torch.export`` dynamic shapes: one ``Dim`` per axis name, shared where inputs share it."""
    dims: dict[str, object] = {}
    for axes in inputs.values():
        for axis in axes:
            dims.setdefault(axis.name, torch.export.Dim(axis.name, min=axis.min, max=axis.max))
    return tuple({i: dims[axis.name] for i, axis in enumerate(axes)} for axes in inputs.values())


def _export(module, path, sample, *, inputs, output, opset, exporter) -> list[Path]:
    """``inputs``: name -> its axes, in the module's argument order; ``output``: (name, leading axes)."""
    if exporter not in EXPORTERS:
        raise ExportError(f"onnx exporter must be one of {', '.join(EXPORTERS)}, got {exporter!r}")
    path = Path(path)
    output_name, output_axes = output
    if exporter == "dynamo":
        options = {
            "dynamo": True,
            "dynamic_shapes": _dynamo_shapes(inputs),
            "external_data": _parameter_bytes(module) > EXTERNAL_DATA_BYTES,
        }
        rules = without_skipped_rewrite_rules()
    else:  # TorchScript writes external data (a file per tensor) by itself past protobuf's limit
        axes = {**inputs, output_name: output_axes}
        options = {
            "dynamo": False,
            "dynamic_axes": {name: {i: a.name for i, a in enumerate(dims)} for name, dims in axes.items()},
        }
        rules = contextlib.nullcontext()
    log.info("exporting ONNX (torch.onnx %s exporter, opset %d)", exporter, opset)
    with warnings.catch_warnings(), torch.no_grad(), _quiet_exporter_logs(), rules:
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(
                module.eval(),
                tuple(sample),
                str(path),
                input_names=list(inputs),
                output_names=[output_name],
                opset_version=opset,
                verbose=False,
                **options,
            )
        except Exception as exc:  # the exporter raises many types; one error for the caller
            raise ExportError(f"torch.onnx.export ({exporter}) failed: {exc}") from exc
    files = onnx_model_files(path)
    log.info("exported %s (%s)", path, ", ".join(f.name for f in files))
    return files
