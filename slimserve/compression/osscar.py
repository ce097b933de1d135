"""Subset selection for structured pruning: the layer-wise reconstruction objective and its local search.

A linear map ``Y = A W^T`` (``A``: [tokens, d] inputs, ``W``: [d_out, d]) loses input columns; the kept
set ``S`` is chosen and the weights of ``S`` re-fitted so that ``Y`` is best reconstructed. Everything
is computed from the Gram matrix ``G = A^T A`` (d x d, float64), never from the activations:

* re-fit (ridge least squares): ``W_S'^T = (G_SS + lam I)^{-1} G_S: W^T`` with
  ``lam = ridge * mean(diag G)``;
* error: ``err(S) = tr(W G W^T) - tr(C_S^T (G_SS + lam I)^{-1} C_S)`` with ``C = G W^T``; for
  ``lam = 0`` this is exactly ``||A W^T - A_S W_S'^T||_F^2``. The search maximises the second term,
  the *explained energy*; ``reconstruction_error`` reports the exact error of the re-fitted weights.

Columns (MLP neurons) are chosen as in OSSCAR (Meng et al., ICML 2024, arXiv 2403.12983): a greedy
start refined by a combinatorial local search.

1. **Greedy backward elimination** (OBS-style). With ``H = (G_SS + lam I)^{-1}`` and the re-fitted
   weights ``M = H C_S``, dropping column ``i`` lowers the explained energy by exactly
   ``||M_i||^2 / H_ii``; drop the cheapest and update ``H <- H - h_i h_i^T / H_ii``, ``M`` likewise.
   The rank-one updates of ``H`` are deferred and applied every ``FLUSH_EVERY`` steps as one matrix
   product, then ``H`` is compacted, so each step costs O(|S| (d_out + FLUSH_EVERY)).
   Total: O(d^2 d_out + d^3) flops and float64 memory O(d^2).
2. **Swap local search.** For every kept ``i`` and dropped ``j`` the explained energy after the swap is
   ``E - ||M_i||^2/H_ii + ||r_j + a M_i||^2 / (s_j + a q_ji)`` with ``q_j = H G_Sj``,
   ``a = q_ji / H_ii``, residual ``r_j = C_j - G_jS M`` and Schur complement
   ``s_j = G_jj + lam - G_jS q_j`` (rank-one identities, no refactorisation per pair). All
   |S| x |U| pairs come from three matrix products, O(|U| |S| (|S| + d_out)) per iteration; the
   best improving swap is applied until none lowers the error by more than ``tol`` (relative) or
   ``iterations`` ran.
   The objective therefore never increases over the greedy start.

For SmolLM2-135M (d = 1536, d_out = 576, keep 512) one layer takes about 1.5 s for the greedy pass plus
~0.1-0.2 s per swap iteration (single-threaded; see ``_single_thread``).

Blocks (attention heads: ``head_dim`` contiguous columns of ``o_proj``'s input, grouped by KV head) use
the same objective evaluated directly by Cholesky (there are few blocks): greedy backward removal
within groups that still hold more than the quota, then swaps inside a group.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

FLUSH_EVERY = 64


@dataclass
class Selection:
    """A chosen subset of input columns with its re-fitted weights and its errors (squared, absolute)."""

    kept: list[int]  # kept columns (or blocks, for ``select_blocks``), ascending
    weight: torch.Tensor  # re-fitted W_S' [d_out, len(columns)], float64
    error: float  # exact reconstruction error of ``weight`` on the calibration Gram
    greedy_error: float  # the same for the greedy start (before swaps)
    total: float  # tr(W G W^T): the error of dropping everything
    swaps: int


def ridge_value(G: torch.Tensor, ridge: float) -> float:
    """The absolute ridge ``ridge * mean(diag G)`` (scale-free: ``ridge`` is relative)."""
    scale = float(torch.diagonal(G).mean())
    return ridge * scale if scale > 0 else ridge


def _index(S: Sequence[int] | torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(S, dtype=torch.long).reshape(-1)


def refit(
    G: torch.Tensor, W: torch.Tensor, S: Sequence[int] | torch.Tensor, ridge: float = 0.0
) -> torch.Tensor:
    """Closed-form least-squares weights ``W_S'`` [d_out, |S|] for the kept columns ``S``."""
    G, W, S = G.double(), W.double(), _index(S)
    gss = G[S][:, S] + ridge_value(G, ridge) * torch.eye(len(S), dtype=G.dtype)
    rhs = G[S] @ W.T
    chol, info = torch.linalg.cholesky_ex(gss)
    if int(info) == 0:
        return torch.cholesky_solve(rhs, chol).T
    return (torch.linalg.pinv(gss, hermitian=True) @ rhs).T  # singular Gram (dead columns, no ridge)


def total_energy(G: torch.Tensor, W: torch.Tensor) -> float:
    """``tr(W G W^T) = ||A W^T||^2``: the output energy, the denominator of relative errors."""
    W = W.double()
    return float(((W @ G.double()) * W).sum())


def subset_error(
    G: torch.Tensor,
    W: torch.Tensor,
    S: Sequence[int] | torch.Tensor,
    W_S: torch.Tensor,
    total: float | None = None,
) -> float:
    """``||A W^T - A_S W_S^T||^2`` from ``G`` alone, for any replacement weights ``W_S`` [d_out, |S|].

    ``total`` (``total_energy(G, W)``, the costly term) may be passed when already known.
    """
    G, W, W_S, S = G.double(), W.double(), W_S.double(), _index(S)
    cross = ((G[S] @ W.T) * W_S.T).sum()
    own = ((W_S @ G[S][:, S]) * W_S).sum()
    total = total_energy(G, W) if total is None else total
    return float(total - 2 * cross + own)


def reconstruction_error(
    G: torch.Tensor,
    W: torch.Tensor,
    S: Sequence[int] | torch.Tensor,
    ridge: float = 0.0,
    total: float | None = None,
) -> float:
    """The error of keeping columns ``S`` with closed-form re-fitted weights (exact for any ridge)."""
    return subset_error(G, W, S, refit(G, W, S, ridge), total)


def _explained(G: torch.Tensor, C: torch.Tensor, S: torch.Tensor, lam: float) -> float:
    gss = G[S][:, S] + lam * torch.eye(len(S), dtype=G.dtype)
    chol, info = torch.linalg.cholesky_ex(gss)
    if int(info) != 0:
        return float((C[S] * (torch.linalg.pinv(gss, hermitian=True) @ C[S])).sum())
    return float((C[S] * torch.cholesky_solve(C[S], chol)).sum())


def _inverse(matrix: torch.Tensor) -> torch.Tensor:
    chol, info = torch.linalg.cholesky_ex(matrix)
    if int(info) != 0:
        raise ValueError("the calibration Gram matrix is singular: use a positive ridge")
    return torch.cholesky_inverse(chol)


@contextlib.contextmanager
def _single_thread():
    """The greedy loop is thousands of small memory-bound ops: OpenMP threads only add barrier waits, and
    on a shared, busy machine spinning threads made it 20x slower (measured on 2 cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def greedy_backward(G: torch.Tensor, C: torch.Tensor, k: int, lam: float) -> list[int]:
    """Greedy backward elimination down to ``k`` columns (exact OBS scores, deferred updates)."""
    with _single_thread():
        return _greedy_backward(G, C, k, lam)


def _greedy_backward(G: torch.Tensor, C: torch.Tensor, k: int, lam: float) -> list[int]:
    d = G.shape[0]
    alive = torch.arange(d)
    H = _inverse(G + lam * torch.eye(d, dtype=G.dtype))
    M = H @ C
    diag = H.diagonal().clone()
    remaining = d - k
    while remaining > 0:
        n, steps = len(alive), min(FLUSH_EVERY, remaining)
        updates = torch.zeros(n, steps, dtype=G.dtype)
        scales = torch.zeros(steps, dtype=G.dtype)
        keep = torch.ones(n, dtype=torch.bool)
        for t in range(steps):
            scores = torch.where(keep, (M * M).sum(1) / diag, torch.inf)
            j = int(torch.argmin(scores))
            h = H[:, j] - updates[:, :t] @ (scales[:t] * updates[j, :t])
            scale = 1.0 / float(h[j])
            M.addr_(h, M[j].clone(), alpha=-scale)
            diag.addcmul_(h, h, value=-scale)
            updates[:, t], scales[t] = h, scale
            keep[j] = False
        H = H - (updates * scales) @ updates.T
        index = keep.nonzero().squeeze(1)
        H, M, diag, alive = H[index][:, index], M[index], diag[index], alive[index]
        remaining -= steps
    return alive.tolist()


def swap_search(
    G: torch.Tensor,
    C: torch.Tensor,
    S: list[int],
    lam: float,
    iterations: int,
    tol: float = 1e-4,
    total: float | None = None,
) -> tuple[list[int], int]:
    """Best-improvement swaps (one kept column out, one dropped in); returns (kept, swaps made).

    Stops when the best swap lowers the error by at most ``tol`` times the current error (times the
    explained energy when ``total``, the output energy, is not given).
    """
    d = G.shape[0]
    kept = list(S)
    swaps = 0
    for _ in range(iterations):
        kept_set = set(kept)
        dropped = [c for c in range(d) if c not in kept_set]
        if not dropped:
            break
        s_idx, u_idx = _index(kept), _index(dropped)
        H = _inverse(G[s_idx][:, s_idx] + lam * torch.eye(len(kept), dtype=G.dtype))
        M = H @ C[s_idx]
        explained = float((C[s_idx] * M).sum())
        g_us = G[u_idx][:, s_idx]
        Q = g_us @ H
        R = C[u_idx] - g_us @ M
        schur = torch.diagonal(G)[u_idx] + lam - (Q * g_us).sum(1)
        h_diag = H.diagonal()
        m_norm = (M * M).sum(1)
        a = Q / h_diag
        gain = ((R * R).sum(1, keepdim=True) + 2 * a * (R @ M.T) + a * a * m_norm) / (schur[:, None] + a * Q)
        delta = gain - (m_norm / h_diag)[None, :]
        best = int(torch.argmax(delta))
        jj, ii = divmod(best, len(kept))
        scale = explained if total is None else total - explained
        if float(delta[jj, ii]) <= tol * max(scale, 1e-300):
            break
        kept[ii] = dropped[jj]
        swaps += 1
    return sorted(kept), swaps


def select_columns(
    G: torch.Tensor,
    W: torch.Tensor,
    k: int,
    ridge: float = 1e-4,
    swap_iterations: int = 32,
    swap_tol: float = 1e-4,
) -> Selection:
    """Keep ``k`` of the ``d`` input columns of ``W`` [d_out, d]: greedy backward, then swaps, then re-fit."""
    G, W = G.double(), W.double()
    if not 0 < k <= G.shape[0]:
        raise ValueError(f"k={k} must be in 1..{G.shape[0]}")
    lam = ridge_value(G, ridge)
    C = G @ W.T
    total = float((C * W.T).sum())
    with _single_thread():  # see _single_thread: the swap products are mid-sized, threads barely help
        greedy = _greedy_backward(G, C, k, lam)
        kept, swaps = swap_search(G, C, greedy, lam, swap_iterations, swap_tol, total)
    return Selection(
        kept=kept,
        weight=refit(G, W, kept, ridge),
        error=reconstruction_error(G, W, kept, ridge, total),
        greedy_error=reconstruction_error(G, W, greedy, ridge, total),
        total=total,
        swaps=swaps,
    )


def _block_columns(blocks: Sequence[int], block_size: int) -> torch.Tensor:
    return torch.cat([torch.arange(b * block_size, (b + 1) * block_size) for b in sorted(blocks)])


def select_blocks(
    G: torch.Tensor,
    W: torch.Tensor,
    block_size: int,
    group_size: int,
    keep_per_group: int,
    ridge: float = 1e-4,
    swap_iterations: int = 32,
) -> Selection:
    """Keep ``keep_per_group`` blocks in every group of ``group_size`` consecutive blocks (heads per KV head).

    ``kept`` holds block indices; ``weight`` is the re-fit over their columns (block order ascending).
    """
    G, W = G.double(), W.double()
    n_blocks = G.shape[0] // block_size
    if n_blocks * block_size != G.shape[0] or n_blocks % group_size:
        raise ValueError(f"{G.shape[0]} columns are not groups of {group_size} blocks of {block_size}")
    if not 0 < keep_per_group <= group_size:
        raise ValueError(f"keep_per_group={keep_per_group} must be in 1..{group_size}")
    lam = ridge_value(G, ridge)
    C = G @ W.T

    def explained(blocks: Sequence[int]) -> float:
        return _explained(G, C, _block_columns(blocks, block_size), lam)

    kept = list(range(n_blocks))
    while len(kept) > keep_per_group * (n_blocks // group_size):
        counts = {g: sum(1 for b in kept if b // group_size == g) for g in range(n_blocks // group_size)}
        candidates = [b for b in kept if counts[b // group_size] > keep_per_group]
        best = max(candidates, key=lambda b: explained([c for c in kept if c != b]))
        kept.remove(best)
    greedy = sorted(kept)
    current, swaps = explained(kept), 0
    for _ in range(swap_iterations):
        moves = [
            (i, j)
            for i in kept
            for j in range(n_blocks)
            if j not in kept and j // group_size == i // group_size
        ]
        scored = [(explained([j if b == i else b for b in kept]), i, j) for i, j in moves]
        if not scored:
            break
        value, i, j = max(scored)
        if value <= current * (1 + 1e-9):
            break
        kept, current, swaps = sorted(j if b == i else b for b in kept), value, swaps + 1
    columns = _block_columns(kept, block_size)
    return Selection(
        kept=sorted(kept),
        weight=refit(G, W, columns, ridge),
        error=reconstruction_error(G, W, columns, ridge),
        greedy_error=reconstruction_error(G, W, _block_columns(greedy, block_size), ridge),
        total=total_energy(G, W),
        swaps=swaps,
    )
