"""The torch.onnx exporters a scoring graph can be written with (settings name them; no torch here)."""

from __future__ import annotations

from typing import Literal, get_args

OnnxExporter = Literal["torchscript", "dynamo"]
EXPORTERS: tuple[str, ...] = get_args(OnnxExporter)
DEFAULT_EXPORTER: OnnxExporter = "torchscript"
EXPORTER_HELP = (
    "torch.onnx exporter of the scoring graphs: torchscript (tracing; about 10x faster here) or dynamo "
    "(torch.export); the same graph within the parity gate (docs/multi-item.md, The exporter)"
)
