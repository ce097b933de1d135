"""The result of a fault case (named figures, each against its target) and the one table that prints them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Figure:
    """One measured figure; ``met`` says whether it meets ``target`` (None: nothing to meet)."""

    name: str
    value: float | int | str
    target: str = ""
    met: bool | None = None
    unit: str = ""

    def shown(self) -> str:
        value = self.value
        if isinstance(value, float):
            if math.isnan(value):
                return "-"
            text = f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
        else:
            text = str(value)
        return f"{text} {self.unit}".strip()

    def as_dict(self) -> dict:
        value = None if isinstance(self.value, float) and math.isnan(self.value) else self.value
        return {"name": self.name, "value": value, "unit": self.unit, "target": self.target, "met": self.met}


def below(name: str, value: float | None, limit: float, unit: str = "s", strict: bool = True) -> Figure:
    """A figure whose target is ``value < limit`` (``<=`` without ``strict``); None counts as not met."""
    shown = float("nan") if value is None else float(value)
    met = value is not None and (value < limit if strict else value <= limit)
    return Figure(name, shown, f"{'<' if strict else '<='} {limit:g} {unit}".strip(), met, unit)


def zero(name: str, count: int) -> Figure:
    """A count whose target is 0."""
    return Figure(name, count, "0", count == 0)


def info(name: str, value: float | int | str, unit: str = "") -> Figure:
    """A figure with no target (context for the others)."""
    return Figure(name, value, unit=unit)


@dataclass
class CaseResult:
    """What one fault case measured: its figures and remarks (e.g. what it could not check)."""

    case: str
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def met(self) -> bool:
        """Every figure with a target meets it."""
        return all(f.met is not False for f in self.figures)

    def figure(self, name: str) -> Figure:
        for figure in self.figures:
            if figure.name == name:
                return figure
        raise KeyError(f"{self.case}: no figure {name!r} (have {[f.name for f in self.figures]})")

    def value(self, name: str):
        return self.figure(name).value

    def as_dict(self) -> dict:
        return {
            "case": self.case,
            "met": self.met,
            "seconds": self.seconds,
            "figures": [f.as_dict() for f in self.figures],
            "notes": list(self.notes),
        }


def format_faults_table(results: list[CaseResult]) -> str:
    """Markdown table: case, figure, value, target, met (yes/NO/blank), then each case's notes."""
    lines = ["| case | figure | value | target | met |", "|---|---|---:|---|---|"]
    for result in results:
        for index, figure in enumerate(result.figures):
            case = f"{result.case} ({result.seconds:.0f} s)" if index == 0 else ""
            met = {True: "yes", False: "**NO**", None: ""}[figure.met]
            lines.append(f"| {case} | {figure.name} | {figure.shown()} | {figure.target} | {met} |")
    notes = [f"- {r.case}: {note}" for r in results for note in r.notes]
    return "\n".join(lines + (["", *notes] if notes else []))
