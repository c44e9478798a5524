"""Row primitives shared by the distance-based rules.

* :func:`row_sq_distances` — ``‖x_i - z‖²`` for every row (float64);
* :func:`row_dots` — ``<x_i, v>`` for every row (float64);
* :func:`weighted_sum` — ``W @ X``, where a zero weight leaves a row out;
* :func:`gram` — the Gram matrix of the rows in a given order, optionally centred.

Per-row quantities are independent across rows, so a row holding ±inf or NaN only spoils
its own entry. Sums *across* rows are different: a matrix product computes ``0 * inf =
NaN``, so a left-out non-finite row would poison every output. :func:`weighted_sum`
therefore runs one matrix product over ``X`` (the fast path) and, only if that produced a
non-finite entry, recomputes reading just the rows with non-zero weight.

Differences ``x_i - z`` are formed in column slabs held in a reused buffer, never as an
``[n, d]`` temporary. On CPU the slabs are spread over worker threads running
single-threaded numpy operations (:mod:`._parallel`); elsewhere a torch loop does the same.

A row is *non-finite* for these rules when its squared distance (or squared norm)
evaluates to ±inf or NaN in the compute dtype: it contains ±inf or NaN, or it is so large
that its square overflows (norm above about 1.8e19 in float32). Such rows are infinitely
far from everything.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from sharefl.robust._parallel import over_blocks
from sharefl.robust.base import compute_dtype

#: bytes of the ``[rows, width]`` slab of the elementwise passes (stays in L2 cache)
SLAB_BYTES = 1 << 20
#: bytes of a Gram slab: matrix products want a long inner dimension
GRAM_SLAB_BYTES = 32 << 20


def _width(rows: int, itemsize: int, slab_bytes: int) -> int:
    return max(256, slab_bytes // (max(rows, 1) * itemsize))


def slabs(
    X: Tensor,
    rows: Tensor | None = None,
    *,
    center: Tensor | None = None,
    slab_bytes: int = SLAB_BYTES,
) -> Iterator[tuple[int, int, Tensor]]:
    """Yield ``(start, stop, S)`` with ``S = X[rows, start:stop] - center[start:stop]`` in
    the compute dtype, contiguous (torch, any device). ``S`` lives in a buffer reused by
    the next step: use it before advancing; ``X`` is never touched."""
    n, d = X.shape
    work = compute_dtype(X.dtype)
    k = n if rows is None else rows.numel()
    width = _width(k, torch.finfo(work).bits // 8, slab_bytes)
    buffer = torch.empty(k, min(width, d), dtype=work, device=X.device)
    for start in range(0, d, width):
        stop = min(d, start + width)
        S = buffer if stop - start == buffer.shape[1] else buffer[:, : stop - start].contiguous()
        source = X[:, start:stop]
        if rows is None:
            S.copy_(source)
        elif source.dtype == work:
            torch.index_select(source, 0, rows, out=S)  # into the buffer: no fresh pages
        else:
            S.copy_(source.index_select(0, rows))
        if center is not None:
            S.sub_(center[start:stop].to(work))
        yield start, stop, S


def _numpy_view(X: Tensor) -> np.ndarray | None:
    """``X`` as a numpy array if the threaded numpy kernels can read it directly."""
    if X.device.type == "cpu" and X.dtype in (torch.float32, torch.float64):
        return X.numpy()
    return None


def row_sq_distances(X: Tensor, z: Tensor | None = None) -> Tensor:
    """Squared distances ``‖x_i - z‖²`` of every row to ``z`` (``z = 0`` if ``None``).

    Float64, shape ``[n]``; a NaN result is reported as +inf (infinitely far).
    """
    n, d = X.shape
    A = _numpy_view(X)
    if A is None:
        out = torch.zeros(n, dtype=torch.float64, device=X.device)
        for _, _, S in slabs(X, center=z):
            out += (S * S).sum(1).to(torch.float64)
    else:
        c = None if z is None else z.detach().to("cpu", X.dtype).numpy()
        width = _width(n, A.itemsize, SLAB_BYTES)

        def work(starts: Sequence[int]) -> np.ndarray:
            acc = np.zeros(n)
            buffer = np.empty((n, width), dtype=A.dtype)
            for start in starts:
                stop = min(d, start + width)
                S = buffer[:, : stop - start]
                if c is None:
                    np.copyto(S, A[:, start:stop])
                else:
                    np.subtract(A[:, start:stop], c[start:stop], out=S)
                np.multiply(S, S, out=S)
                acc += S.sum(axis=1)  # pairwise summation along the row
            return acc

        out = torch.from_numpy(sum(over_blocks(d, width, work), np.zeros(n)))
    return torch.nan_to_num(out, nan=float("inf"), posinf=float("inf"))


def row_dots(X: Tensor, v: Tensor) -> Tensor:
    """Inner products ``<x_i, v>`` of every row (float64, shape ``[n]``); one matrix-vector
    product. Non-finite rows give ±inf or NaN in their own entry only."""
    work = compute_dtype(X.dtype)
    if X.dtype == work:
        return (X @ v.to(work)).to(torch.float64)
    out = torch.zeros(X.shape[0], dtype=torch.float64, device=X.device)
    for start, stop, S in slabs(X):
        out += (S @ v[start:stop].to(work)).to(torch.float64)
    return out


def combine_rows(
    X: Tensor,
    weights: Tensor,
    rows: Tensor,
    *,
    out: Tensor | None = None,
    out_rows: Tensor | None = None,
) -> Tensor:
    """``weights @ X[rows]``, reading only the listed rows, gathered slab by slab.

    ``weights`` has shape ``[k]`` (result ``[d]``) or ``[m, k]`` (result ``[m, d]``), with
    ``k = len(rows)``; the result is in the compute dtype. With ``out`` and ``out_rows``,
    result row ``i`` is written to ``out[out_rows[i]]`` instead (and ``out`` returned).
    The arithmetic follows the order of ``rows`` only, so listing rows in canonical order
    makes the result independent of the input order, bit for bit.
    """
    d = X.shape[1]
    work = compute_dtype(X.dtype)
    W = weights.to(device=X.device, dtype=work).reshape(-1, rows.numel())
    result = torch.empty(W.shape[0], d, dtype=work, device=X.device) if out is None else out
    for start, stop, S in slabs(X, rows, slab_bytes=GRAM_SLAB_BYTES):
        block = W @ S
        if out_rows is None:
            result[:, start:stop] = block
        else:
            result[:, start:stop].index_copy_(0, out_rows, block.to(result.dtype))
    if out is not None:
        return out
    return result[0] if weights.dim() == 1 else result


def weighted_sum(X: Tensor, weights: Tensor) -> Tensor:
    """``weights @ X`` (``weights`` of shape ``[n]`` or ``[m, n]``) in the compute dtype,
    where a zero weight leaves the row out even if it holds ±inf or NaN.

    One matrix product over ``X``; if an output entry is not finite (a left-out row's
    ``0 * inf``, or a used row's genuine ±inf/NaN), the affected outputs are recomputed from
    their used rows only.
    """
    work = compute_dtype(X.dtype)
    W = weights.to(device=X.device, dtype=work).reshape(-1, X.shape[0])
    if X.dtype == work:
        out = W @ X
    else:
        out = torch.empty(W.shape[0], X.shape[1], dtype=work, device=X.device)
        for start, stop, S in slabs(X, slab_bytes=GRAM_SLAB_BYTES):
            out[:, start:stop] = W @ S
    bad = ~torch.isfinite(out).all(dim=1)
    for m in torch.nonzero(bad).flatten().tolist():
        rows = torch.nonzero(W[m]).flatten()
        out[m] = combine_rows(X, W[m, rows], rows) if rows.numel() else 0.0
    return out[0] if weights.dim() == 1 else out


def gram(X: Tensor, order: Tensor, center: Tensor | None = None) -> Tensor:
    """Float64 Gram matrix ``G[a, b] = <x_{order[a]} - c, x_{order[b]} - c>``.

    Slabs are multiplied in the compute dtype (float32 for float32 input, as BLAS does
    fastest) and accumulated in float64. Rows are gathered in ``order`` slab by slab, so
    the result is bitwise the same for any permutation of the input rows; it is exactly
    symmetric.
    """
    n = X.shape[0]
    G = torch.zeros(n, n, dtype=torch.float64, device=X.device)
    for _, _, S in slabs(X, order, center=center, slab_bytes=GRAM_SLAB_BYTES):
        G += (S @ S.T).to(torch.float64)
    # BLAS may round G[a, b] and G[b, a] differently; make the distances symmetric
    return 0.5 * (G + G.T)
