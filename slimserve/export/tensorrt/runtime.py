"""Run a TensorRT scorer engine from Python (parity gate and GPU checks): bucket batches in, scores out.

Uses the TensorRT 10 name-based API (``set_input_shape``, ``set_tensor_address``, ``execute_async_v3``),
the same on 11.x, with torch CUDA tensors as device buffers. Each batch runs in the profile of its length.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ...bundle import TensorNames
from ...errors import BuildError
from ...models.batching import padded_batches
from .engine import import_tensorrt
from .profiles import BucketProfile, profile_for


class EngineScorer:
    """A deserialized engine and one execution context."""

    def __init__(
        self, plan_path: Path, profiles: Sequence[BucketProfile], tensors: TensorNames | None = None
    ):
        import torch

        if not torch.cuda.is_available():
            raise BuildError("running a TensorRT engine needs a CUDA device (torch sees none)")
        trt = import_tensorrt()
        self._torch = torch
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(Path(plan_path).read_bytes())
        if self.engine is None:
            raise BuildError(
                f"TensorRT could not load {plan_path} (built by another TensorRT version or GPU?)"
            )
        if self.engine.num_optimization_profiles != len(profiles):
            raise BuildError(
                f"{plan_path} has {self.engine.num_optimization_profiles} profiles, expected {len(profiles)}"
            )
        self.context = self.engine.create_execution_context()
        self.profiles = tuple(profiles)
        self.tensors = tensors or TensorNames()
        self.stream = torch.cuda.Stream()

    def score_batch(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """Scores [batch] of one padded batch."""
        torch = self._torch
        batch, length = input_ids.shape
        profile = profile_for(self.profiles, batch, length)
        names = self.tensors
        with torch.cuda.stream(self.stream):
            ids = torch.from_numpy(np.ascontiguousarray(input_ids, dtype=np.int64)).cuda()
            mask = torch.from_numpy(np.ascontiguousarray(attention_mask, dtype=np.int64)).cuda()
            self.context.set_optimization_profile_async(profile.index, self.stream.cuda_stream)
            for name, tensor in ((names.input_ids, ids), (names.attention_mask, mask)):
                self.context.set_input_shape(name, tuple(tensor.shape))
                self.context.set_tensor_address(name, tensor.data_ptr())
            out = torch.empty(
                tuple(self.context.get_tensor_shape(names.score)), dtype=torch.float32, device="cuda"
            )
            self.context.set_tensor_address(names.score, out.data_ptr())
            if not self.context.execute_async_v3(self.stream.cuda_stream):
                raise BuildError(f"TensorRT execution failed for shape [{batch}, {length}]")
        self.stream.synchronize()
        return out.cpu().numpy().reshape(batch)

    def score(self, sequences: Sequence[Sequence[int]], buckets, batch_size: int | None = None) -> np.ndarray:
        """Scores of token sequences, padded to buckets and batched (default: the profiles' max batch)."""
        batch_size = min(batch_size or self.profiles[0].max_batch, self.profiles[0].max_batch)
        out = np.zeros(len(sequences), dtype=np.float64)
        for chunk, ids, mask in padded_batches([list(s) for s in sequences], buckets, batch_size):
            out[chunk] = self.score_batch(ids, mask)
        return out
