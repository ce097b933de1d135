"""One TensorRT optimization profile per sequence-length bucket (single-sequence graph) or per
item-length bucket (multi-item graph).

The services right-pad every prompt to a bucket, so the engine sees a handful of sequence lengths. Profile
``i`` covers lengths ``(bucket[i-1], bucket[i]]`` (the first starts at 1) and batch sizes ``1..max_batch``,
and is optimized for ``(opt_batch, bucket[i])``: TensorRT tunes kernels for the padded shape that really
arrives, while any length up to the largest bucket still has a profile (perf_analyzer, unpadded clients).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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

    @property
    def triton_max_batch(self) -> int:
        """The Triton ``max_batch_size`` of a model built with these profiles (batch is Triton's axis)."""
        return self.max_batch

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


@dataclass(frozen=True)
class MultiItemProfile:
    """Min/opt/max shapes of the multi-item graph's inputs for one item-length bucket: prefixes
    ``[members, P]`` up to ``prefix_max``, items ``[members, N, L]`` up to ``max_items`` of length in
    ``(previous bucket, bucket]``; tuned for one member, ``opt_prefix`` prefix tokens, ``opt_items`` items."""

    index: int
    bucket: int
    min_length: int
    prefix_max: int
    opt_prefix: int
    max_items: int
    opt_items: int
    max_members: int = 1

    def shapes(self) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
        """Input name -> (min, opt, max), as ``IOptimizationProfile.set_shape`` takes them."""
        names = TensorNames()
        prefix = ((1, 1), (1, self.opt_prefix), (self.max_members, self.prefix_max))
        items = (
            (1, 1, self.min_length),
            (1, self.opt_items, self.bucket),
            (self.max_members, self.max_items, self.bucket),
        )
        return {
            names.prefix_ids: prefix,
            names.prefix_mask: prefix,
            names.item_ids: items,
            names.item_mask: items,
        }

    @property
    def triton_max_batch(self) -> int:
        """0: the members axis is explicit, Triton does not batch (one member per request)."""
        return 0

    def holds(self, members: int, prefix: int, items: int, length: int) -> bool:
        return (
            1 <= members <= self.max_members
            and 1 <= prefix <= self.prefix_max
            and 1 <= items <= self.max_items
            and self.min_length <= length <= self.bucket
        )

    def as_dict(self) -> dict:
        return {
            "index": self.index,
            "bucket": self.bucket,
            **{k: [list(s) for s in v] for k, v in self.shapes().items()},
        }


def multi_item_profiles(
    item_buckets: Sequence[int],
    prefix_max: int,
    max_items: int,
    *,
    opt_prefix: int | None = None,
    opt_items: int | None = None,
    max_members: int = 1,
) -> tuple[MultiItemProfile, ...]:
    """One profile per item-length bucket (the service pads a call's items to one bucket). A
    one-candidate call is sent folded (``scoring_tokens.multi_item_requests``): ``prefix_max`` must hold
    ``prefix_max_tokens + item_max_tokens - 1`` tokens, its item is one token long."""
    if not item_buckets or any(int(b) < 1 for b in item_buckets):
        raise ValueError(f"item_length_buckets must be positive lengths, got {list(item_buckets)}")
    if prefix_max < 1 or max_items < 1 or max_members < 1:
        raise ValueError("prefix_max, max_items and max_members must be >= 1")
    opt_p = prefix_max // 2 if opt_prefix is None else opt_prefix
    opt_n = min(max_items, 64) if opt_items is None else opt_items
    if not (1 <= opt_p <= prefix_max and 1 <= opt_n <= max_items):
        raise ValueError(
            f"opt_prefix {opt_p} / opt_items {opt_n} outside [1, {prefix_max}] / [1, {max_items}]"
        )
    ordered = sorted({int(b) for b in item_buckets})
    lows = [1] + [b + 1 for b in ordered[:-1]]
    return tuple(
        MultiItemProfile(index, bucket, low, prefix_max, opt_p, max_items, opt_n, max_members)
        for index, (bucket, low) in enumerate(zip(ordered, lows, strict=True))
    )


def served_multi_item_profiles(
    item_buckets: Sequence[int], prefix_max_tokens: int, item_max_tokens: int, max_items: int
) -> tuple[MultiItemProfile, ...]:
    """The profiles of the requests a scoring service sends for a layout (a recipe's ``publish`` or a
    bundle): one member, up to ``max_items`` items, a prefix that holds a folded one-candidate call."""
    return multi_item_profiles(item_buckets, prefix_max_tokens + item_max_tokens - 1, max_items)


Profile = BucketProfile | MultiItemProfile


def _within(shape: Sequence[int], low: Sequence[int], high: Sequence[int]) -> bool:
    return len(shape) == len(low) and all(lo <= d <= hi for d, lo, hi in zip(shape, low, high, strict=True))


def profile_for_shapes(profiles: Sequence[Profile], shapes: Mapping[str, Sequence[int]]) -> Profile:
    """The profile whose min..max range holds every named input shape (rank included): the one a
    request runs in. ``ValueError`` naming the shapes and the ranges when none does."""
    for profile in profiles:
        ranges = profile.shapes()
        if all(
            name in ranges and _within(shape, ranges[name][0], ranges[name][2])
            for name, shape in shapes.items()
        ):
            return profile
    described = "; ".join(
        f"{p.index}: " + ", ".join(f"{n} {_dims(lo)}..{_dims(hi)}" for n, (lo, _, hi) in p.shapes().items())
        for p in profiles
    )
    asked = ", ".join(f"{name} {_dims(shape)}" for name, shape in sorted(shapes.items()))
    raise ValueError(f"shapes {asked} fit no optimization profile ({described})")


def profile_input_problems(network_inputs: Mapping[str, int], profiles: Sequence[Profile]) -> list[str]:
    """Disagreements between a network's inputs (name -> rank) and the profiles' shapes."""
    problems = []
    for profile in profiles:
        shapes = profile.shapes()
        for name in sorted(set(network_inputs) - set(shapes)):
            problems.append(f"profile {profile.index} has no shape for network input {name!r}")
        for name in sorted(set(shapes) - set(network_inputs)):
            problems.append(f"profile {profile.index} names {name!r}, not an input of the network")
        for name in sorted(set(shapes) & set(network_inputs)):
            rank = len(shapes[name][0])
            if rank != network_inputs[name]:
                problems.append(
                    f"profile {profile.index} gives {name!r} rank {rank}, the network {network_inputs[name]}"
                )
    return problems


def _dims(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape)


def trtexec_shape_flags(profiles: Sequence) -> list[str]:
    """The same profiles as ``trtexec`` flags (one ``--minShapes/--optShapes/--maxShapes`` group each)."""
    flags = []
    for profile in profiles:
        shapes = profile.shapes()
        for position, flag in enumerate(("--minShapes", "--optShapes", "--maxShapes")):
            flags.append(f"{flag}=" + ",".join(f"{name}:{_dims(s[position])}" for name, s in shapes.items()))
    return flags
