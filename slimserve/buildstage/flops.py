"""The matrix work a build stage did in PyTorch: FLOPs of its linear layers, counted as they run.

Nearly all of a transformer's FLOPs at these sequence lengths are in its linear layers (the
projections, the MLP). ``LinearFlops`` adds them up for every ``nn.Linear`` call made in the thread
that opened it: ``2 * tokens * in * out`` for the forward, and, when autograd records the call, the
backward's products too (one more for the input's gradient, one more for the weight's). Attention's
own products, ONNX Runtime's work (the INT8 stage's evaluations) and calls traced by an exporter
(dynamo's fake tensors, TorchScript's tracing, where sizes are traced tensors) are not counted. With a stage's seconds this gives the rate it ran at, and against
this machine's matrix-multiply peak (``slimserve bench floor``) the shortest time its work could take.
"""

from __future__ import annotations

import threading

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor


def _is_traced(tensor: torch.Tensor) -> bool:
    """A call an exporter records, not work: dynamo's fake or meta tensors, or a TorchScript trace."""
    return isinstance(tensor, FakeTensor) or tensor.device.type == "meta" or torch.jit.is_tracing()


def format_flops(flops: float) -> str:
    """``12.3 TFLOP`` or, below one, ``45.6 GFLOP``."""
    return f"{flops / 1e12:.1f} TFLOP" if flops >= 1e12 else f"{flops / 1e9:.1f} GFLOP"


class LinearFlops:
    """A context manager: ``flops`` is the linear layers' FLOPs of this thread while it was open."""

    def __init__(self) -> None:
        self.flops = 0
        self._thread = threading.get_ident()
        self._handle = None

    def __enter__(self) -> LinearFlops:
        self._handle = nn.modules.module.register_module_forward_hook(self._count)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _count(self, module: nn.Module, args: tuple, _output) -> None:
        if not isinstance(module, nn.Linear) or threading.get_ident() != self._thread or not args:
            return
        x = args[0]
        if not isinstance(x, torch.Tensor) or _is_traced(x) or x.dim() == 0:
            return
        products = 1
        if torch.is_grad_enabled():
            products += int(x.requires_grad) + int(module.weight.requires_grad)
        self.flops += products * 2 * (x.numel() // x.shape[-1]) * module.in_features * module.out_features
