"""Client-level DP inside SHARE's clusters: the noise is split over the members of a
cluster, and every client's privacy is accounted from the sums the server really saw.

Noise split. Each honest client clips its update to l2 norm C and adds its share
N(0, σ²C²/(s − t) I) before masking, where

- s = ``min_survivors``: the fewest members whose inputs a cluster sum may still contain
  when it is released. Secure aggregation releases a cluster only if at least the Shamir
  threshold of its members survive (``threshold_floor(m)`` = 2 for m = 3), so s is that
  threshold, not m: a cluster that loses members down to s still carries N(0, σ²C² I);
  a full cluster of m carries m/(s − t)·σ²C², more than the target (the price of
  tolerating drop-outs);
- t = ``colluders``: members assumed to add no noise or to tell the server theirs
  (Byzantine members, clients colluding with the server); 0 by default here, the
  protocol's colluder bound in a simulation (``privacy.colluders`` omitted: ⌈m/3⌉ − 1
  in signed mode, :attr:`sharefl.simulator.config.RunConfig.noise_colluders`).

So every released sum of at least s members, of whom at most t are colluders, carries at
least the full noise N(0, σ²C² I) (:meth:`ClusterNoiseSplit.released_variance`).

Accounting (:class:`ClusterPrivacyLedger`). One round releases the sums Y = A(x + z) of
the rows of a 0/1 matrix A (one row per released cluster sum of every reclustering,
survivors only) over the honest clients (the inputs of colluders are known to the server
and subtracted). The honest noise z is N(0, s_c² I) per client with s_c the share std.
Changing client a's update by at most C moves Y by A e_a·C, and the privacy loss of this
Gaussian mechanism is that of a one-dimensional Gaussian with

    μ_a = C √(P_aa) / s_c,     P = Aᵀ(AAᵀ)⁺A the projection onto A's row space,

i.e. an effective noise multiplier σ_a = s_c / (C √P_aa). One cluster of k survivors gives
P_aa = 1/k, σ_a = σ√(k/(s − t)) ≥ σ; a client whose update the server can solve for
(reclusterings that leak) has P_aa = 1 and only σ/√(s − t). Rounds compose as Gaussian
mechanisms: μ² adds up, so each client's ε after T rounds is that of one Gaussian
mechanism with σ = (Σ_t 1/σ_{a,t}²)^(−1/2) (exact under full participation, which is
what SHARE runs: no subsampling amplification is claimed). With t > 0 the ledger counts
only honest noise: up to t members of each released sum, known Byzantine ones included,
may add none, so each client is charged its cell's sum with the members they leave
(:func:`colluder_noise_multipliers`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .accountant import PrivacyAccountant
from .client_level import clip_update_
from .distributed_accounting import cell_noise_adders
from .errors import PrivacyConfigError
from .noise import add_gaussian_noise_
from .vocabulary import Backend, Conversion


@dataclass(frozen=True)
class ClusterNoiseSplit:
    """How one cluster's noise N(0, σ²C² I) is split over its members.

    Attributes:
        clip_norm: C, the l2 bound on one client's update.
        noise_multiplier: σ of every released cluster sum.
        min_survivors: s ≥ 1, the fewest members a released sum may contain (the Shamir
            threshold of the cluster).
        colluders: t < s, members per cluster that add no noise (or reveal it).
    """

    clip_norm: float
    noise_multiplier: float
    min_survivors: int
    colluders: int = 0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise PrivacyConfigError(f"clip_norm must be > 0, got {self.clip_norm!r}")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0):
            raise PrivacyConfigError(f"noise_multiplier must be >= 0, got {self.noise_multiplier}")
        if self.min_survivors < 1:
            raise PrivacyConfigError(f"min_survivors must be >= 1, got {self.min_survivors}")
        if not 0 <= self.colluders < self.min_survivors:
            raise PrivacyConfigError(
                f"colluders must be in [0, min_survivors) = [0, {self.min_survivors}), got "
                f"{self.colluders}: a released sum needs one honest share"
            )

    @property
    def share_std(self) -> float:
        """Std of every coordinate of one member's share: σC/√(s − t)."""
        contributing = self.min_survivors - self.colluders
        return self.noise_multiplier * self.clip_norm / math.sqrt(contributing)

    def released_variance(self, honest_members: int) -> float:
        """Per-coordinate noise variance of a released sum with ``honest_members`` honest
        (noise-adding) members: k·σ²C²/(s − t); ≥ σ²C² whenever k ≥ s − t."""
        if honest_members < 0:
            raise PrivacyConfigError(f"honest_members must be >= 0, got {honest_members}")
        return honest_members * self.share_std**2

    def privatize_(
        self,
        update: torch.Tensor,
        generator: torch.Generator,
        *,
        scratch: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One member's share, in place: clip ``update`` to C, add N(0, share_std² I)."""
        clip_update_(update, self.clip_norm)
        return add_gaussian_noise_(update, self.share_std, generator, scratch=scratch)


def effective_noise_multipliers(
    released: Sequence[Sequence[int]], honest: Sequence[int], share_std: float, clip_norm: float
) -> dict[int, float]:
    """σ_a = share_std / (C √P_aa) of every honest client for one round (module docstring).

    Args:
        released: the member ids of every released cluster sum (all reclusterings,
            survivors only).
        honest: the clients that added noise; other ids in ``released`` are known to the
            server and left out.
        share_std, clip_norm: the share's std s_c and the clip C.

    Returns:
        client id → σ_a; ``math.inf`` for an honest client in no released sum.
    """
    ids = sorted(set(honest))
    column = {c: j for j, c in enumerate(ids)}
    rows = [[column[c] for c in members if c in column] for members in released]
    rows = [r for r in rows if r]
    if not rows or share_std == 0:
        return {c: (math.inf if not rows else 0.0) for c in ids}
    A = np.zeros((len(rows), len(ids)))
    for i, r in enumerate(rows):
        A[i, r] = 1.0
    projection_diag = (np.linalg.pinv(A) @ A).diagonal().clip(0.0, 1.0)
    out = {}
    for c, j in column.items():
        p = float(projection_diag[j])
        out[c] = math.inf if p < 1e-12 else share_std / (clip_norm * math.sqrt(p))
    return out


def colluder_noise_multipliers(
    released: Sequence[Sequence[int]],
    honest: Sequence[int],
    share_std: float,
    clip_norm: float,
    colluders: int,
) -> dict[int, float]:
    """σ_a = share_std·√k / C of every honest client for one round, k the noise-adding
    members of its cell when up to ``colluders`` members of each released sum add none
    (:func:`~sharefl.privacy.distributed_accounting.cell_noise_adders`).

    The server sees a post-processing of the cell sums, and a cell of k honest adders
    (the colluders' inputs and noise are known and subtracted) is one Gaussian mechanism
    with noise std share_std·√k and sensitivity C. With one clustering the cells are the
    clusters' survivors and this is exact (the projection of
    :func:`effective_noise_multipliers` with the colluders removed); with overlapping
    reclusterings it is pessimistic. Arguments as in :func:`effective_noise_multipliers`;
    ``math.inf`` for an honest client in no released sum."""
    out = {c: math.inf for c in set(honest)}
    for cell, adders in cell_noise_adders(released, honest, colluders):
        for c in cell:
            out[c] = share_std * math.sqrt(adders) / clip_norm
    return dict(sorted(out.items()))


@dataclass
class ClusterPrivacyLedger:
    """Per-client ε of client-level DP split over clusters (module docstring).

    Attributes:
        split: the noise split the clients use.
        accountant, conversion: the backend of :class:`PrivacyAccountant`.
        precision: Σ_t 1/σ_{a,t}² of every client so far.
    """

    split: ClusterNoiseSplit
    accountant: Backend = "rdp"
    conversion: Conversion = "improved"
    precision: dict[int, float] = field(default_factory=dict)
    rounds: int = 0

    def record_round(self, released: Sequence[Sequence[int]], honest: Sequence[int]) -> None:
        """Account one round's released sums (members: survivors only) for ``honest``.

        With t = ``split.colluders`` > 0, up to t members of each released sum may add no
        noise although the caller counts them as honest, so only the honest noise is
        counted: σ_a of client a's cell with the members t colluders leave
        (:func:`colluder_noise_multipliers`); with t = 0 the projection bound
        (:func:`effective_noise_multipliers`)."""
        if self.split.colluders:
            sigmas = colluder_noise_multipliers(
                released, honest, self.split.share_std, self.split.clip_norm, self.split.colluders
            )
        else:
            sigmas = effective_noise_multipliers(
                released, honest, self.split.share_std, self.split.clip_norm
            )
        for c, s in sigmas.items():
            gain = 0.0 if math.isinf(s) else (math.inf if s == 0 else 1.0 / s**2)
            self.precision[c] = self.precision.get(c, 0.0) + gain
        self.rounds += 1

    def noise_multiplier(self, client: int) -> float:
        """The single-Gaussian σ equivalent to client ``client``'s rounds so far."""
        p = self.precision.get(client, 0.0)
        return math.inf if p == 0 else (0.0 if math.isinf(p) else 1.0 / math.sqrt(p))

    def epsilons(self, delta: float) -> dict[int, float]:
        """ε(δ) of every client accounted so far (``math.inf`` without noise)."""
        out: dict[int, float] = {}
        cache: dict[float, float] = {}
        for c in sorted(self.precision):
            sigma = self.noise_multiplier(c)
            if math.isinf(sigma):
                out[c] = 0.0
                continue
            if sigma == 0:
                out[c] = math.inf
                continue
            key = round(sigma, 9)
            if key not in cache:
                acc = PrivacyAccountant(self.accountant, conversion=self.conversion)
                acc.step(sigma, 1.0, 1)
                cache[key] = acc.get_epsilon(delta)
            out[c] = cache[key]
        return out

    def summary(self, delta: float) -> dict[str, float | int | None]:
        """JSON-ready: worst, median and best ε over the clients, and the rounds."""
        eps = list(self.epsilons(delta).values())
        if not eps:
            return {"rounds": self.rounds, "epsilon_max": None}
        return {
            "rounds": self.rounds,
            "delta": delta,
            "epsilon_max": max(eps),
            "epsilon_median": float(np.median(eps)),
            "epsilon_min": min(eps),
        }
