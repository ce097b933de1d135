"""One TensorRT optimization profile per sequence-length bucket.

The services right-pad every prompt to a bucket, so the engine sees a handful of sequence lengths. Profile
``i`` covers lengths ``(bucket[i-1], bucket[i]]`` (the first starts at 1) and batch sizes ``1..max_batch``,
and is optimized for ``(opt_batch, bucket[i])``: TensorRT tunes kernels for the padded shape that really
arrives, while any length up to the largest bucket still has a profile (perf_analyzer, unpadded clients).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ...bundle import TensorNames

Shape = tuple[int, int]


@dataclass(frozen=True)
class BucketProfile:
    """Min/opt/max ``[batch, sequence]`` shapes of every input for one length bucket."""

    index: int
    bucket: int
    min_length: int
    max_batch: int
    opt_batch: int
    inputs: tuple[str, ...]

    @property
    def min_shape(self) -> Shape:
        return (1, self.min_length)

    @property
    def opt_shape(self) -> Shape:
        return (self.opt_batch, self.bucket)

    @property
    def max_shape(self) -> Shape:
        return (self.max_batch, self.bucket)

    def shapes(self) -> dict[str, tuple[Shape, Shape, Shape]]:
        """Input name -> (min, opt, max), as ``IOptimizationProfile.set_shape`` takes them."""
        return {name: (self.min_shape, self.opt_shape, self.max_shape) for name in self.inputs}

    def holds(self, batch: int, length: int) -> bool:
        return 1 <= batch <= self.max_batch and self.min_length <= length <= self.bucket

    def as_dict(self) -> dict:
        return {
            "index": self.index,
            "bucket": self.bucket,
            "min": list(self.min_shape),
            "opt": list(self.opt_shape),
            "max": list(self.max_shape),
        }


def bucket_profiles(
    buckets: Sequence[int],
    max_batch_size: int,
    opt_batch_size: int | None = None,
    inputs: Sequence[str] | None = None,
) -> tuple[BucketProfile, ...]:
    """Profiles for ``buckets`` (any order, duplicates removed); ``opt_batch_size`` None = ``max_batch_size``."""
    if not buckets or any(int(b) < 1 for b in buckets):
        raise ValueError(f"length_buckets must be positive sequence lengths, got {list(buckets)}")
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    opt = max_batch_size if opt_batch_size is None else opt_batch_size
    if not 1 <= opt <= max_batch_size:
        raise ValueError(f"opt_batch_size {opt} must be within [1, max_batch_size {max_batch_size}]")
    names = tuple(inputs) if inputs is not None else (TensorNames().input_ids, TensorNames().attention_mask)
    ordered = sorted({int(b) for b in buckets})
    lows = [1] + [b + 1 for b in ordered[:-1]]
    return tuple(
        BucketProfile(index, bucket, low, max_batch_size, opt, names)
        for index, (bucket, low) in enumerate(zip(ordered, lows, strict=True))
    )


def profile_for(profiles: Sequence[BucketProfile], batch: int, length: int) -> BucketProfile:
    """The profile a ``[batch, length]`` request runs in (the one whose length range holds it)."""
    for profile in profiles:
        if profile.holds(batch, length):
            return profile
    largest = max(p.bucket for p in profiles)
    raise ValueError(
        f"shape [{batch}, {length}] fits no optimization profile (batch 1..{profiles[0].max_batch}, "
        f"length 1..{largest})"
    )


def _dims(shape: Shape) -> str:
    return "x".join(str(d) for d in shape)


def trtexec_shape_flags(profiles: Sequence[BucketProfile]) -> list[str]:
    """The same profiles as ``trtexec`` flags (one ``--minShapes/--optShapes/--maxShapes`` group each)."""
    flags = []
    for profile in profiles:
        for flag, attr in (
            ("--minShapes", "min_shape"),
            ("--optShapes", "opt_shape"),
            ("--maxShapes", "max_shape"),
        ):
            shape = _dims(getattr(profile, attr))
            flags.append(f"{flag}=" + ",".join(f"{name}:{shape}" for name in profile.inputs))
    return flags
