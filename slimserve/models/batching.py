"""Single-sequence batches as the scoring service sends them: grouped by length bucket, cut into
chunks, each chunk right-padded to its bucket.

The one batching function that the service (``serving.scoring.core``), the export parity gate, INT8
calibration, the in-process speed measurements and the benchmarks all call. Needs only numpy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from ..tokenization import group_by_bucket, pad_batch


def bucket_batches(
    sequences: Sequence[Sequence[int]], buckets: Sequence[int], batch_size: int | None = None
) -> list[tuple[int, list[int]]]:
    """(bucket, indices) of every batch: buckets ascending, input order within a bucket, at most
    ``batch_size`` indices per batch (None: one batch per bucket)."""
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    batches = []
    for bucket, indices in sorted(group_by_bucket(sequences, buckets).items()):
        size = batch_size or len(indices)
        batches += [(bucket, indices[start : start + size]) for start in range(0, len(indices), size)]
    return batches


def padded_batches(
    sequences: Sequence[Sequence[int]], buckets: Sequence[int], batch_size: int, pad_token_id: int = 0
) -> Iterator[tuple[list[int], np.ndarray, np.ndarray]]:
    """Yield (indices, input_ids, attention_mask) per batch of ``bucket_batches``, padded to its bucket."""
    for bucket, indices in bucket_batches(sequences, buckets, batch_size):
        ids, mask = pad_batch([sequences[i] for i in indices], bucket, pad_token_id)
        yield indices, ids, mask
