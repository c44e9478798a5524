"""A canonical order of the rows of a matrix, so that selection rules ignore input order.

Rules that pick rows (Krum, MultiKrum, MDA, NNM's neighbourhoods) must break ties, and the
rounding of the sums they compare depends on the order of the terms. Computing everything
with the rows in *canonical order* (ascending lexicographic order of their values under
the IEEE-754 total order, which also ranks NaN payloads; -0.0 counts as +0.0) makes their
choice independent of the order in which the rows were given, bit for bit, and breaks ties
between equal scores by that order. Rows with equal values are interchangeable.

Cost: the first column that tells rows apart is usually column 0, so the order is an
``argsort`` of ``n`` numbers; columns are read further only for rows that tie.
"""

from __future__ import annotations

import torch
from torch import Tensor

_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

#: columns compared per step while looking for the first column where tied rows differ
_FIRST_BLOCK = 8
_MAX_BLOCK = 1 << 16


def sortable_bits(values: Tensor) -> Tensor:
    """Integers whose signed order is the IEEE-754 total order of the floats ``values``,
    with -0.0 taken as +0.0 (``x + t`` turns -0.0 into +0.0, and a translated input must
    sort like the original).

    Negative floats have the sign bit set, so as signed integers they already sort below
    the positive ones but in reverse; flipping their other bits fixes that.
    """
    values = values + 0.0  # -0.0 + 0.0 is +0.0
    bits = values.view(_INT_OF_WIDTH[values.element_size()]).to(torch.int64)
    width = 8 * values.element_size()
    magnitude_mask = (1 << (width - 1)) - 1
    sign = bits < 0
    return torch.where(sign, bits ^ magnitude_mask, bits)


def _first_difference(X: Tensor, rows: Tensor, start: int) -> int | None:
    """The first column ``>= start`` where the given rows are not all bitwise equal."""
    d = X.shape[1]
    width = _FIRST_BLOCK
    col = start
    while col < d:
        stop = min(d, col + width)
        block = sortable_bits(X[:, col:stop].index_select(0, rows))
        differs = (block != block[:1]).any(dim=0)
        hit = torch.nonzero(differs)
        if hit.numel():
            return col + int(hit[0, 0])
        col = stop
        width = min(2 * width, _MAX_BLOCK)
    return None


def canonical_order(X: Tensor) -> Tensor:
    """The permutation (int64, on ``X``'s device) that sorts the rows of ``X``.

    Rows are compared lexicographically by :func:`sortable_bits`; rows with equal keys
    keep their relative input order (they hold the same values).
    """
    n, d = X.shape
    all_rows = torch.arange(n, device=X.device)
    if n <= 1 or d == 0:
        return all_rows
    out: list[Tensor] = []
    # Depth-first over groups of rows that agree on every column before `col`.
    stack: list[tuple[Tensor, int]] = [(all_rows, 0)]
    while stack:
        rows, col = stack.pop()
        if rows.numel() == 1:
            out.append(rows)
            continue
        c = _first_difference(X, rows, col)
        if c is None:
            out.append(rows)
            continue
        keys = sortable_bits(X[:, c].index_select(0, rows))
        _, inverse = torch.unique(keys, sorted=True, return_inverse=True)
        groups = int(inverse.max()) + 1
        if groups == rows.numel():  # all distinct on this column: done with this group
            out.append(rows[torch.argsort(inverse)])
            continue
        # push in reverse so the smallest key group is processed (and emitted) first
        for g in range(groups - 1, -1, -1):
            stack.append((rows[inverse == g], c + 1))
    return torch.cat(out)
