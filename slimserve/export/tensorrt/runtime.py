"""Run a TensorRT scorer engine from Python (parity gate and GPU checks): named inputs in, scores out.

Uses the TensorRT 10 name-based API (``set_input_shape``, ``set_tensor_address``, ``execute_async_v3``),
the same on 11.x, with torch CUDA tensors as device buffers. Each call runs in the profile whose ranges
hold its input shapes: single-sequence batches by their length, multi-item requests by their item length.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from ...bundle import TensorNames
from ...errors import BuildError
from ...models.batching import padded_batches
from ...scoring_tokens import multi_item_requests
from .engine import import_tensorrt
from .profiles import Profile, profile_for_shapes


class EngineScorer:
    """A deserialized engine and one execution context."""

    def __init__(self, plan_path: Path, profiles: Sequence[Profile], tensors: TensorNames | None = None):
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

    def run(self, feed: Mapping[str, np.ndarray]) -> np.ndarray:
        """The ``score`` output of one execution on ``feed`` (input name -> int64 array)."""
        torch = self._torch
        shapes = {name: tuple(array.shape) for name, array in feed.items()}
        profile = profile_for_shapes(self.profiles, shapes)
        with torch.cuda.stream(self.stream):
            inputs = {
                name: torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64)).cuda()
                for name, array in feed.items()
            }
            self.context.set_optimization_profile_async(profile.index, self.stream.cuda_stream)
            for name, tensor in inputs.items():
                self.context.set_input_shape(name, tuple(tensor.shape))
                self.context.set_tensor_address(name, tensor.data_ptr())
            score = self.tensors.score
            out = torch.empty(tuple(self.context.get_tensor_shape(score)), dtype=torch.float32, device="cuda")
            self.context.set_tensor_address(score, out.data_ptr())
            if not self.context.execute_async_v3(self.stream.cuda_stream):
                raise BuildError(f"TensorRT execution failed for input shapes {shapes}")
        self.stream.synchronize()
        return out.cpu().numpy()

    def score_batch(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """Scores [batch] of one padded single-sequence batch."""
        names = self.tensors
        out = self.run({names.input_ids: input_ids, names.attention_mask: attention_mask})
        return out.reshape(input_ids.shape[0])

    def score(self, sequences: Sequence[Sequence[int]], buckets, batch_size: int | None = None) -> np.ndarray:
        """Scores of token sequences, padded to buckets and batched (default: the profiles' max batch)."""
        batch_size = min(batch_size or self.profiles[0].max_batch, self.profiles[0].max_batch)
        out = np.zeros(len(sequences), dtype=np.float64)
        for chunk, ids, mask in padded_batches([list(s) for s in sequences], buckets, batch_size):
            out[chunk] = self.score_batch(ids, mask)
        return out


def multi_item_scores(
    run: Callable[[dict[str, np.ndarray]], np.ndarray],
    groups: Sequence,
    count: int,
    item_buckets: Sequence[int],
    max_items: int,
) -> np.ndarray:
    """Scores of ``count`` examples given as member ``groups`` (``prefix``, ``items``, ``indices``), each
    member's candidates sent as the scoring service sends them (one member per request) to ``run``
    (``EngineScorer.run``: feed -> ``score`` [1, N]). Examples of no group stay NaN."""
    out = np.full(count, np.nan, dtype=np.float64)
    for group in groups:
        indices = np.asarray(group.indices)
        for request in multi_item_requests(group, item_buckets, max_items):
            out[indices[list(request.indices)]] = np.asarray(run(request.feed())).reshape(-1)
    return out
