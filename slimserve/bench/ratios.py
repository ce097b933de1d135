"""The ratios a comparison is judged by, with the issue's targets (measured figures are reported either way)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .compare import CompareResult
from .inprocess import ORT_FLOOR, PYTORCH


@dataclass(frozen=True)
class Ratio:
    """``numerator / denominator`` with an optional target (``at_least`` or at most ``target``)."""

    name: str
    value: float
    numerator: str
    denominator: str
    target: float | None = None
    at_least: bool = True

    @property
    def met(self) -> bool | None:
        if self.target is None or self.value != self.value:  # no target, or NaN
            return None
        return self.value >= self.target if self.at_least else self.value <= self.target

    def target_text(self) -> str:
        if self.target is None:
            return "-"
        return f"{'>=' if self.at_least else '<='} {self.target:g}"

    def as_dict(self) -> dict:
        return asdict(self) | {"met": self.met, "target_text": self.target_text()}

    @classmethod
    def of_items(cls, name: str, numerator: float, denominator: float, target: float | None = None) -> Ratio:
        """A ratio of two throughputs in items/s (at least ``target`` when given)."""
        return cls(
            name,
            _div(numerator, denominator),
            f"{numerator:.1f} items/s",
            f"{denominator:.1f} items/s",
            target,
        )


def _div(a: float, b: float) -> float:
    return a / b if b else float("nan")


def compute_ratios(result: CompareResult) -> list[Ratio]:
    """Engine ratios per variant, then the four targets of issue 5 on the published (last) variant."""
    ratios: list[Ratio] = []
    main = result.settings.get("main_batching")
    variants = result.variants
    published = variants[-1]
    for variant in variants:
        floor, torch = result.engine(variant, ORT_FLOOR), result.engine(variant, PYTORCH)
        if floor and torch:
            ratios.append(
                Ratio.of_items(
                    f"{variant}: ONNX Runtime / PyTorch in process",
                    floor.items_per_s,
                    torch.items_per_s,
                )
            )
        run = result.run(variant, main)
        best = run.best() if run else None
        floor_items = result.floor_items_per_s(variant)
        if floor_items and best:
            ratios.append(
                Ratio.of_items(
                    f"{variant}: slimserve best concurrency ({best.load:g}) / ONNX Runtime floor",
                    best.items_per_s,
                    floor_items,
                    0.8 if variant == published else None,
                )
            )
    ratios += _batching_ratios(result, published)
    ratios += _variant_ratios(result, variants, main)
    for run in result.served:
        point = run.open_point()
        if point and point.ok:
            ratios.append(
                Ratio(
                    f"{run.variant} ({run.batching}): p99 / p50 at {point.load:.1f} req/s open loop "
                    "(half saturation)",
                    _div(point.latency.p99_ms, point.latency.p50_ms),
                    f"p99 {point.latency.p99_ms:.1f} ms",
                    f"p50 {point.latency.p50_ms:.1f} ms",
                    3.0 if run.variant == published and run.batching == main else None,
                    at_least=False,
                )
            )
    return ratios


def _batching_ratios(result: CompareResult, variant: str) -> list[Ratio]:
    off = result.run(variant, "off")
    concurrency = max(result.settings.get("concurrencies") or [16])
    base = off.at_concurrency(concurrency) if off else None
    if base is None:
        return []
    ratios = []
    for run in result.served:
        point = run.at_concurrency(concurrency)
        if run.variant != variant or run.batching == "off" or point is None:
            continue
        ratios.append(
            Ratio.of_items(
                f"{variant}: {run.batching} / off (max batch 1) at concurrency {concurrency}",
                point.items_per_s,
                base.items_per_s,
                2.5,
            )
        )
    return ratios


def _variant_ratios(result: CompareResult, variants: list[str], main: str | None) -> list[Ratio]:
    if len(variants) < 2:
        return []
    baseline = result.run(variants[0], main)
    base = baseline.best() if baseline else None
    if base is None:
        return []
    ratios = []
    for variant in variants[1:]:
        run = result.run(variant, main)
        best = run.best() if run else None
        if best is None:
            continue
        ratios.append(
            Ratio.of_items(
                f"{variant} / {variants[0]}: slimserve end to end, best concurrency",
                best.items_per_s,
                base.items_per_s,
                8.0 if variant == variants[-1] else None,
            )
        )
    return ratios


def format_ratios(ratios: list[Ratio]) -> str:
    """Markdown table of ratios with target and verdict."""
    lines = ["| ratio | value | numerator | denominator | target | met |", "|---|---:|---|---|---|---|"]
    for r in ratios:
        met = {True: "yes", False: "**no**", None: "-"}[r.met]
        lines.append(
            f"| {r.name} | {r.value:.2f}x | {r.numerator} | {r.denominator} | {r.target_text()} | {met} |"
        )
    return "\n".join(lines)
