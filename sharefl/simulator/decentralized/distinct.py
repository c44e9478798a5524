"""The four aggregation rules of the decentralized loop computed on the *distinct* messages.

What honest receiver n aggregates is, slot by slot, one of few vectors: its own x̃_n, the
x̃_m its honest neighbours broadcast (the same vector for every receiver: one noise draw
per sender) and the Byzantine messages to n (one per receiver for sign-flipping and
isolating, one per (b, n) for Gaussian). The straight path
(:meth:`~.loop.DecentralizedLoop.received` and the ``batched_*`` rules of
:mod:`sharefl.robust.decentralized`) copies them into an ``[R, N, d]`` tensor (8 MB for
MNIST) and reads it 6–12 times per iteration. Here they stay in one matrix
V ``[J, d]`` (J = R + R·u rows: x̃ first, then every receiver's u Byzantine messages) and
each receiver's slots are rows of V (:class:`SlotLayout`):

* ``mean`` (DSGD), ``scc`` and ``ios`` are linear in the messages once their data-dependent
  coefficients are known, and those coefficients depend on the messages only through
  inner products: so the Gram matrix G = V Vᵀ ``[J, J]`` gives every distance
  (‖V_i − p‖² = G_ii − 2 V_i·p + ‖p‖², the expansion the batched rules also use), the
  rule picks its coefficients A ``[R, J]`` on G, and the result is one product A V. IOS's q
  rounds of "drop the neighbour farthest from the weighted mean" run on G alone
  (``[R, J]`` work per round instead of two ``[R, N+1, d]`` passes).
* ``trimmed_mean`` is coordinate-wise: the neighbours' values are sorted per coordinate by
  a sorting network (Batcher's odd–even merge sort: elementwise min/max on ``[R, d]``
  slices, no ``[R, N, d]`` sort) and summed exactly as the batched rule sums them.

**Equality with the straight path.** ``trimmed_mean`` returns the batched rule's numbers bit
for bit (a sorting network yields the same sorted values; the kept values are summed by the
same call on the same ``[R, N, d]`` layout). ``mean``, ``scc`` and ``ios`` compute the same
formulas with the inner products and sums in another order (a Gram matrix and one matrix
product instead of per-slot reductions), so they differ from the batched rules by float64
rounding (relative 1e-15–1e-13 per iteration); IOS removes the same neighbours (exact ties,
two Byzantine agents sending one message, are ties here too: they are one row of V). The
tests check both against the batched rules; ``docs/results/decentralized.md`` states what a
run changes (the first four decimals of its accuracies do not).

Raises :class:`~sharefl.robust.base.AggregationError` (as the batched rules do) when a
result is not finite or q is too large for a receiver.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from sharefl.robust.base import AggregationError


def batcher_network(n: int) -> tuple[tuple[int, int], ...]:
    """The comparators (i, j), i < j, of Batcher's odd–even merge sort of ``n`` values:
    applying ``(v_i, v_j) ← (min, max)`` in order sorts any input (0-1 principle; checked
    exhaustively by the tests for small n)."""
    pairs: list[tuple[int, int]] = []
    p = 1
    while p < n:
        k = p
        while k >= 1:
            for j in range(k % p, n - k, 2 * k):
                for i in range(min(k, n - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        pairs.append((i + j, i + j + k))
            k //= 2
        p *= 2
    return tuple(pairs)


@dataclass(frozen=True)
class SlotLayout:
    """Where the slots of every honest receiver come from in V.

    Slots follow the batched rules: slot m of receiver r is graph node m (``[R, N]``
    tensors; IOS prepends slot 0 = the receiver itself).

    Attributes:
        index: ``[R, N]`` long, the row of V that node m's message to r is (non-neighbours:
            row r, never used).
        mask: ``[R, N]`` bool, the neighbours.
        weights: ``[R, N]`` w'_rm on neighbours, 0 elsewhere (the loop's ``weights``).
        q: ``[R]`` long, |B_r|.
        rows: J, the number of rows of V.
        neighbours: ``[R, K]`` long, each receiver's neighbour slots first-to-last, padded
            (K = the largest degree); ``padding``: ``[R, K]`` bool, the padded places.
        ios_index, ios_members, ios_weight: ``[R, N+1]``, IOS's slots (slot 0: the receiver
            itself, row r of V), which are members at the start, and their weights
            (own: max(0, 1 − Σ_m w'_rm), as the batched rule).
        rounds: IOS's removal rounds, max_r q_r.

    Raises:
        AggregationError: (``build``) q_r larger than r's number of neighbours.
    """

    index: Tensor
    mask: Tensor
    weights: Tensor
    q: Tensor
    rows: int
    neighbours: Tensor
    padding: Tensor
    ios_index: Tensor
    ios_members: Tensor
    ios_weight: Tensor
    rounds: int

    @classmethod
    def build(
        cls,
        mask: Tensor,
        weights: Tensor,
        q: Tensor,
        honest_slots: Tensor,
        byzantine_slots: Tensor,
        per_receiver: int,
    ) -> SlotLayout:
        """From the loop's receiver matrices: honest node ``honest_slots[i]`` is row i of V;
        Byzantine node ``byzantine_slots[j]`` sends r row R + r·u + (j if u > 1 else 0),
        u = ``per_receiver`` (0 without Byzantine agents)."""
        R, N = mask.shape
        device = mask.device
        if bool((q > mask.sum(dim=1)).any()):
            raise AggregationError("IOS removes q of the received models: lower q")
        index = torch.arange(R, device=device)[:, None].repeat(1, N)
        index[:, honest_slots] = torch.arange(R, device=device)[None, :]
        for j, slot in enumerate(byzantine_slots.tolist()):
            row = R + torch.arange(R, device=device) * per_receiver
            index[:, slot] = row + (j if per_receiver > 1 else 0)
        degree = mask.sum(dim=1)
        width = max(int(degree.max()), 1)
        order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices[:, :width]
        padding = torch.arange(width, device=device)[None, :] >= degree[:, None]
        own = torch.arange(R, device=device)[:, None]
        w = weights.to(torch.float64)
        own_weight = (1.0 - w.sum(dim=1, keepdim=True)).clamp_min(0.0)
        return cls(
            index,
            mask,
            weights,
            q,
            R + R * per_receiver,
            order,
            padding,
            torch.cat([own, index], dim=1),
            torch.cat([torch.ones(R, 1, dtype=torch.bool, device=device), mask], dim=1),
            torch.cat([own_weight, w], dim=1),
            int(q.max()) if q.numel() else 0,
        )


def _finite(out: Tensor) -> Tensor:
    """``out``, or :class:`AggregationError` when it is not finite: a non-finite message
    reaches the result, and a sum of finite float64 values overflows only beyond 1e308."""
    if not math.isfinite(float(out.sum())):
        raise AggregationError("the batched rules need finite messages")
    return out


def _coefficients(layout_index: Tensor, values: Tensor, rows: int) -> Tensor:
    """``[R, J]``: Σ over the slots s of ``values[r, s]`` into column ``index[r, s]``."""
    out = torch.zeros(values.shape[0], rows, dtype=values.dtype, device=values.device)
    return out.scatter_add_(1, layout_index, values)


def weighted_mean(layout: SlotLayout, V: Tensor) -> Tensor:
    """DSGD's mixing (1 − Σ_m w_rm) x̃_r + Σ_m w_rm msg_rm as A V (see the module)."""
    w = layout.weights.to(V.dtype)
    A = _coefficients(layout.index, w, layout.rows)
    R = w.shape[0]
    A[torch.arange(R), torch.arange(R)] += 1.0 - w.sum(dim=1)
    return _finite(A @ V)


def self_centered_clipping(layout: SlotLayout, V: Tensor, tau: float, G: Tensor) -> Tensor:
    """SCC: x̃_r + Σ_m w_rm clip(msg_rm − x̃_r, τ), the distances from the Gram matrix G."""
    R = layout.index.shape[0]
    own = torch.arange(R, device=V.device)
    diag = G.diagonal()
    sq = (diag[None, :] - 2 * G[own] + diag[own][:, None]).clamp_min(0.0)  # [R, J]
    norms = torch.gather(sq, 1, layout.index).sqrt()
    factor = (tau / norms.clamp_min(1e-300)).clamp_max(1.0)
    pull = layout.weights.to(V.dtype) * factor
    A = _coefficients(layout.index, pull, layout.rows)
    A[own, own] += 1.0 - pull.sum(dim=1)
    return _finite(A @ V)


def ios(layout: SlotLayout, V: Tensor, G: Tensor) -> Tensor:
    """IOS: q_r times, drop the neighbour farthest from the weighted mean of what is left
    (ties to the lower slot), all on the Gram matrix G; return that weighted mean as A V."""
    R = layout.mask.shape[0]
    index, weight = layout.ios_index, layout.ios_weight.to(V.dtype)
    members = layout.ios_members.clone()
    rows = torch.arange(R, device=V.device)
    diag = G.diagonal()[index]  # ‖V_i‖² per slot
    for t in range(layout.rounds):
        mw = torch.where(members, weight, 0.0)
        c = _coefficients(index, mw, layout.rows) / mw.sum(dim=1, keepdim=True)  # [R, J]
        cross = c @ G  # [R, J]: V_j · mean_r
        quad = (c * cross).sum(dim=1, keepdim=True)  # ‖mean_r‖²
        dist = (diag - 2 * torch.gather(cross, 1, index) + quad).clamp_min(0.0)
        candidates = members.clone()
        candidates[:, 0] = False
        drop = torch.argmax(torch.where(candidates, dist, -1.0), dim=1)
        active = t < layout.q
        members[rows[active], drop[active]] = False
    mw = torch.where(members, weight, 0.0)
    A = _coefficients(index, mw, layout.rows)
    return _finite((A @ V) / mw.sum(dim=1, keepdim=True))


def trimmed_mean(layout: SlotLayout, V: Tensor) -> Tensor:
    """Per coordinate, drop the q_r largest and q_r smallest neighbour values and average
    the rest with x̃_r: bit for bit :func:`~sharefl.robust.decentralized.batched_trimmed_mean`
    (see the module docstring).

    The batched rule sorts ``where(mask, received, inf)`` over the N slots and sums
    ``where(keep, sorted, 0)`` over them; here the sorted slots come from the sorting
    network (padding: an ``inf`` row appended to V) and the summed ``[R, N, d]`` tensor is
    built equal to that ``where`` (the kept block of every row, +0.0 elsewhere), so the same
    reduction sums the same numbers."""
    R, N = layout.mask.shape
    J, d = V.shape
    k = layout.mask.sum(dim=1)
    width = layout.neighbours.shape[1]
    rows = torch.gather(layout.index, 1, layout.neighbours)  # [R, K] rows of V
    rows = torch.where(layout.padding, J, rows)  # padded places: the inf row
    padded = torch.cat([V, V.new_full((1, d), torch.inf)])
    values = [padded.index_select(0, rows[:, i]) for i in range(width)]
    for i, j in batcher_network(width):
        low = torch.minimum(values[i], values[j])
        values[j] = torch.maximum(values[i], values[j])
        values[i] = low
    zeros = V.new_zeros(R, d)
    kept = torch.stack(values + [zeros] * (N - width), dim=1)  # [R, N, d]
    for r, (lo, hi) in enumerate(zip(layout.q.tolist(), (k - layout.q).tolist(), strict=True)):
        kept[r, :lo] = 0.0  # the q_r smallest
        kept[r, hi:] = 0.0  # the q_r largest and the padding (inf)
    kept_sum = kept.sum(dim=1)
    count = (k - 2 * layout.q + 1).to(V.dtype)[:, None]
    return _finite((kept_sum + V[:R]) / count)


def aggregator(rule: str, layout: SlotLayout, scc_tau: float) -> Callable[[Tensor], Tensor]:
    """``V [J, d] -> [R, d]``: every honest receiver's new model under ``rule``.

    Raises:
        AggregationError: trimmed mean with a receiver of fewer than 2 q_r neighbours.
        ValueError: an unknown rule.
    """
    if rule == "trimmed_mean" and bool((layout.mask.sum(dim=1) < 2 * layout.q).any()):
        raise AggregationError("every receiver needs at least 2q neighbours: lower q")
    if rule == "mean":
        return lambda V: weighted_mean(layout, V)
    if rule == "trimmed_mean":
        return lambda V: trimmed_mean(layout, V)
    if rule == "scc":
        return lambda V: self_centered_clipping(layout, V, scc_tau, V @ V.t())
    if rule == "ios":
        return lambda V: ios(layout, V, V @ V.t())
    raise ValueError(f"unknown rule {rule!r}")
