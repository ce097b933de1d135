"""``slimserve bench faults``: what the scoring service survives, measured on a live stack on loopback.

A real Triton (explicit model control, as ``slimserve up`` runs it) serves a scratch copy of the
repository's scorer; each case starts its own ``slimserve serve`` child process against it: fuzz
(``fuzz``), open-loop overload (``overload``), Triton killed and restarted or frozen and resumed
(``triton_faults``), SIGTERM under load (``drain``), a version published while serving (``publish``),
and an optional soak (``soak``). Each case returns a ``CaseResult``; ``report.format_faults_table``
prints them. docs/faults.md lists the targets.
"""

from .config import CASE_ORDER, FaultsConfig
from .report import CaseResult, Figure, format_faults_table
from .runner import run_faults

__all__ = ["CASE_ORDER", "CaseResult", "FaultsConfig", "Figure", "format_faults_table", "run_faults"]
