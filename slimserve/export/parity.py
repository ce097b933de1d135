"""Check an exported scorer against PyTorch on real prompts: score difference and ranking agreement."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..models.batching import padded_batches


@dataclass(frozen=True)
class ParityReport:
    """How closely the ONNX graph reproduces PyTorch on the same padded batches."""

    prompts: int
    max_abs_diff: float
    tolerance: float
    ranking_identical: bool
    swapped_pairs: int

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= self.tolerance and self.ranking_identical

    def as_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def swapped_pairs(reference: np.ndarray, candidate: np.ndarray, tie_tolerance: float) -> int:
    """Pairs ordered differently by ``candidate`` than by ``reference`` (reference gaps <= tolerance are ties)."""
    ref_gap = reference[:, None] - reference[None, :]
    cand_gap = candidate[:, None] - candidate[None, :]
    disagree = (np.sign(ref_gap) != np.sign(cand_gap)) & (np.abs(ref_gap) > tie_tolerance)
    return int(np.triu(disagree, k=1).sum())


def compare_scores(reference: np.ndarray, candidate: np.ndarray, atol: float, rtol: float) -> ParityReport:
    """Parity verdict for two score vectors of the same prompts."""
    tolerance = atol + rtol * float(np.max(np.abs(reference), initial=0.0))
    diff = float(np.max(np.abs(reference - candidate), initial=0.0))
    swaps = swapped_pairs(reference, candidate, tolerance)
    return ParityReport(len(reference), diff, tolerance, swaps == 0, swaps)


def check_scorer_parity(
    graph, onnx_path, sequences: list[list[int]], buckets, atol: float = 1e-3, rtol: float = 1e-4
) -> ParityReport:
    """Score ``sequences`` with PyTorch and with ONNX Runtime (same padded batches) and compare."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    reference = single_sequence_scores(graph, sequences, buckets)
    candidate = np.zeros(len(sequences), dtype=np.float64)
    for chunk, ids, mask in padded_batches(sequences, buckets, batch_size=8):
        candidate[chunk] = session.run(None, dict(zip(names, (ids, mask), strict=True)))[0].ravel()
    return compare_scores(reference, candidate, atol, rtol)


def single_sequence_scores(graph, sequences: list[list[int]], buckets, batch_size: int = 8) -> np.ndarray:
    """PyTorch scores of the single-sequence graph on ``sequences`` padded to their buckets."""
    import torch

    out = np.zeros(len(sequences), dtype=np.float64)
    with torch.no_grad():
        for chunk, ids, mask in padded_batches(sequences, buckets, batch_size):
            out[chunk] = graph(torch.from_numpy(ids), torch.from_numpy(mask)).numpy().ravel()
    return out


def multi_item_onnx_scores(session, members: list, requests_of) -> list[np.ndarray]:
    """ONNX Runtime scores of a multi-item graph, one array per member (``members`` have ``prefix`` and
    ``items``), each member's candidates sent as ``requests_of(member)`` gives them (the service's
    requests)."""
    names = [i.name for i in session.get_inputs()]
    scores = []
    for member in members:
        out = np.zeros(len(member.items), dtype=np.float64)
        for request in requests_of(member):
            feed = request.feed()
            out[list(request.indices)] = session.run(None, {n: feed[n] for n in names})[0][0]
        scores.append(out)
    return scores


def check_multi_item_parity(
    graph, onnx_path, tokens: list, requests_of, buckets, atol: float = 1e-4, rtol: float = 0.0
) -> ParityReport:
    """The multi-item ONNX graph against the single-sequence PyTorch ``graph`` on the same tokens
    (``tokens``: one ``ScoringTokens`` per member; ``prefix + item`` is the single-sequence input)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    sequences = [member.prefix + item for member in tokens for item in member.items]
    reference = single_sequence_scores(graph, sequences, buckets)
    candidate = np.concatenate(multi_item_onnx_scores(session, tokens, requests_of))
    return compare_scores(reference, candidate, atol, rtol)
