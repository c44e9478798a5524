"""Rényi-DP accounting of integer sums released by secure aggregation with distributed
discrete noise: the distributed discrete Gaussian (DDG) and the Skellam mechanism.

Everything here lives in the integer (scaled) domain: a client's update is clipped to l2
norm c, rotated, scaled by 1/γ and randomly rounded to an integer vector (Kairouz, Liu,
Steinke 2021, Algorithm 1); every member of a released sum adds its noise share to it;
secure aggregation releases only the sum. Under add/remove adjacency of one client, the
sum moves by that client's integer vector, so the l1/l2 sensitivities of the release are
the norm bounds of one vector (:func:`rounded_sensitivity`).

Mechanisms (frozen dataclasses with ``rdp(orders)`` and ``name``):

- :class:`DiscreteGaussianSum` — a sum of n i.i.d. N_Z(0, σ²) shares per coordinate
  (n = 1: the single discrete Gaussian of Canonne, Kamath, Steinke 2020);
- :class:`SkellamSum` — Skellam noise Sk(μ, μ) = Poisson(μ) − Poisson(μ), closed under
  summation: shares Sk(μ_i, μ_i) sum to Sk(Σμ_i, Σμ_i) (Agarwal, Kairouz, Liu 2021).

:class:`DistributedDPLedger` composes them per client (RDP adds up order by order; full
participation, no subsampling amplification is claimed) and converts each client's curve
to (ε, δ) with the conversion of :mod:`sharefl.privacy.accountant` ("improved":
dp-accounting's ``compute_epsilon``, Canonne et al. 2020 Prop. 12 / Asoodeh et al. 2020;
"classic": Mironov 2017 Prop. 3).

Orders. :data:`DEFAULT_ORDERS` is dp-accounting's default grid (1.1, 1.2, …, 10.9,
11, …, 63, 128, 256, 512, 1024). The Skellam bound is proved for integer α only; at a
fractional α it is evaluated at ⌈α⌉, which is valid because D_α is nondecreasing in α
(van Erven and Harremoës 2014, Theorem 3).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from .accountant import check_delta, classic_rdp_epsilon
from .errors import AccountantStateError, PrivacyConfigError
from .vocabulary import Conversion

#: dp-accounting's ``DEFAULT_RDP_ORDERS`` (0.6.0), copied so that importing this module
#: does not import dp-accounting; a test checks that the two agree.
DEFAULT_ORDERS: tuple[float, ...] = (
    tuple(1 + x / 10.0 for x in range(1, 100)) + tuple(range(11, 64)) + (128, 256, 512, 1024)
)

#: Version tag of :meth:`DistributedDPLedger.state_dict`.
STATE_FORMAT = "sharefl.privacy.distributed_accounting/1"


def _check_orders(orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """``orders`` as a 1-D float64 array, or :class:`PrivacyConfigError` unless every
    order is finite and > 1."""
    arr = np.asarray(orders, dtype=np.float64).reshape(-1)
    if arr.size == 0 or not np.all(np.isfinite(arr)) or not np.all(arr > 1.0):
        raise PrivacyConfigError(
            "RDP orders must be a non-empty list of finite values > 1, got "
            f"{list(np.asarray(orders).reshape(-1)[:5])}..."
        )
    return arr


def _positive(value: float, name: str) -> float:
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise PrivacyConfigError(f"{name} must be finite and > 0, got {value!r}")
    return v


def _nonnegative(value: float, name: str) -> float:
    v = float(value)
    if not (math.isfinite(v) and v >= 0):
        raise PrivacyConfigError(f"{name} must be finite and >= 0, got {value!r}")
    return v


def _count(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise PrivacyConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


# --------------------------------------------------------------------------- sensitivity


class Sensitivity(NamedTuple):
    """l1 and l2 bounds of one client's integer vector (unpacks as ``l1, l2``)."""

    l1: float
    l2: float


def rounded_sensitivity(clip: float, gamma: float, dim: int, beta: float) -> Sensitivity:
    """(l1, l2) bounds on the integer vector of one client after clipping, rotation,
    scaling by 1/γ and conditional randomized rounding.

    Kairouz, Liu, Steinke 2021 (arXiv:2102.06387), Section 4.1 (Eqs. 18–19; Eq. 2 of
    Theorem 1 in the unscaled domain): a vector of l2 norm ≤ c/γ (the rotation is
    orthogonal, so it keeps the norm) rounded coordinate-wise at random to the integer grid
    has norm ≤ c/γ + √d always (each coordinate moves by < 1), and with the conditional
    rounding, which resamples until the norm is below the bound that holds with
    probability ≥ 1 − β,

        Δ2 = min( sqrt(c²/γ² + d/4 + sqrt(2 ln(1/β)) · (c/γ + √d/2)),  c/γ + √d ).

    β = 0 is plain randomized rounding (only the second bound). For an integer vector v,
    ‖v‖₁ ≤ Σ v_j² = ‖v‖₂² and ‖v‖₁ ≤ √d ‖v‖₂, hence Δ1 = min(Δ2², √d·Δ2).
    Under add/remove adjacency these are the sensitivities of the securely aggregated sum.

    Args:
        clip: c > 0, the l2 clip of the update (unscaled units).
        gamma: γ > 0, the rounding granularity (scale factor 1/γ).
        dim: d ≥ 1, the dimension after padding for the rotation.
        beta: β in [0, 1), the conditional rounding's failure probability.

    Returns:
        :class:`Sensitivity` (l1, l2) in the integer domain.

    Raises:
        PrivacyConfigError: a parameter out of range.
    """
    c = _positive(clip, "clip")
    g = _positive(gamma, "gamma")
    d = _count(dim, "dim")
    b = float(beta)
    if not 0.0 <= b < 1.0:
        raise PrivacyConfigError(
            f"beta must be in [0, 1) (0 = plain randomized rounding), got {beta!r}"
        )
    scaled = c / g
    sqrt_d = math.sqrt(d)
    l2 = scaled + sqrt_d
    if b > 0.0:
        conditional = (
            scaled**2 + d / 4.0 + math.sqrt(2.0 * math.log(1.0 / b)) * (scaled + sqrt_d / 2.0)
        )
        l2 = min(l2, math.sqrt(conditional))
    return Sensitivity(min(l2 * l2, sqrt_d * l2), l2)


# ---------------------------------------------------------------------------- mechanisms


@runtime_checkable
class RdpMechanism(Protocol):
    """One released sum: ``rdp(orders)`` is its RDP ε at each order (array of the orders'
    shape, float64, ≥ 0), for one client whose add/removal it covers."""

    @property
    def name(self) -> str: ...

    def rdp(self, orders: Sequence[float] | np.ndarray) -> np.ndarray: ...


def ddg_tau(sigma_squared: float, members: int) -> float:
    """τ = 10 Σ_{k=1}^{n−1} exp(−2π²σ² k/(k+1)) of Kairouz, Liu, Steinke 2021, Theorem 1
    (Eq. 3, with σ in the integer domain): the price of a sum of n discrete Gaussians not
    being a discrete Gaussian. 0 for n = 1; the terms decrease in k and are all
    ≤ exp(−π²σ²), so τ is exactly 0.0 (underflow) once σ² ≥ 76."""
    s2 = _positive(sigma_squared, "sigma_squared")
    n = _count(members, "members")
    if n == 1:
        return 0.0
    k = np.arange(1, n, dtype=np.float64)
    return float(10.0 * np.sum(np.exp(-2.0 * math.pi**2 * s2 * k / (k + 1.0))))


@dataclass(frozen=True)
class DiscreteGaussianSum:
    """The sum of ``members`` = n i.i.d. discrete Gaussians N_Z(0, σ²) per coordinate,
    added to an integer vector query with sensitivities ``l1`` = Δ1, ``l2`` = Δ2 over
    ``dim`` = d coordinates (all in the integer domain).

    Privacy (Kairouz, Liu, Steinke 2021, arXiv:2102.06387: Theorem 1, Eq. 4, and its
    per-order form, Proposition 14 / Eq. 17 of the arXiv version). With A = Δ2²/(nσ²),
    a = Δ1/(√n σ) and τ = :func:`ddg_tau`, for every α > 1

        D_α ≤ (α/2) · min{ A + 2τd,  A + 2aτ + τ²d,  (√A + τ√d)² },

    i.e. ρ-zCDP (½ε²-concentrated DP) with ρ = :attr:`rho`. The second and third terms are
    Proposition 14's (the sum over coordinates of (|Δ_j|/(√n σ) + τ)², and its
    Cauchy–Schwarz relaxation). The first is the zCDP form of Proposition 14's
    α/2·A + τd term (sup over α ≥ 1 of (α/2·A + τd)/α), i.e. Theorem 1's first branch read
    as √(A + 2τd). Some restatements of Theorem 1 give that branch as √(A + ½τd), which
    the per-order bound implies only for α ≥ 4; we keep the form implied by every reading
    we could check. The two differ by at most (3/4)·τ·d·α, and τ underflows to 0 for
    σ² ≥ 76, where the bound is exactly the continuous Gaussian's α Δ2²/(2nσ²).

    n = 1 is the discrete Gaussian itself: τ = 0 and D_α ≤ α Δ2²/(2σ²) (Canonne, Kamath,
    Steinke 2020, Theorem 4, per coordinate; the coordinates are independent, so the
    Rényi divergences add up to α Σ_j Δ_j²/(2σ²)), exactly the Gaussian's bound.

    Sums (n ≥ 2) require σ ≥ 1/2, a precondition enforced conservatively (the analysis
    of sums is stated for it; at σ = 1/2 already τ > 0.8 and the bound is of little use).

    Raises:
        PrivacyConfigError: σ² ≤ 0 (or < 1/4 with n ≥ 2), members or dim < 1, or a
            negative sensitivity.
    """

    sigma_squared_per_member: float
    members: int
    l1: float
    l2: float
    dim: int

    def __post_init__(self) -> None:
        s2 = _positive(self.sigma_squared_per_member, "sigma_squared_per_member")
        n = _count(self.members, "members")
        _count(self.dim, "dim")
        _nonnegative(self.l1, "l1")
        _nonnegative(self.l2, "l2")
        if n >= 2 and s2 < 0.25:
            raise PrivacyConfigError(
                f"the distributed discrete Gaussian analysis needs sigma >= 1/2 per member "
                f"(sigma_squared_per_member >= 0.25), got {s2}; scale the update finer "
                "(smaller gamma) or add more noise"
            )

    @property
    def name(self) -> str:
        return "discrete_gaussian" if self.members == 1 else "distributed_discrete_gaussian"

    @property
    def tau(self) -> float:
        """τ of Theorem 1 (0 for a single discrete Gaussian)."""
        return ddg_tau(self.sigma_squared_per_member, self.members)

    @property
    def rho(self) -> float:
        """ρ such that the release is ρ-zCDP: D_α ≤ ρα for all α > 1 (class docstring)."""
        if self.l1 == 0.0 or self.l2 == 0.0:
            return 0.0  # Δ = 0: the two output distributions are identical
        n, d = self.members, self.dim
        total = n * self.sigma_squared_per_member
        a2 = self.l2**2 / total
        a1 = self.l1 / math.sqrt(total)
        tau = self.tau
        if tau == 0.0:
            return 0.5 * a2
        return 0.5 * min(
            a2 + 2.0 * tau * d,
            a2 + 2.0 * a1 * tau + tau * tau * d,
            (math.sqrt(a2) + tau * math.sqrt(d)) ** 2,
        )

    def rdp(self, orders: Sequence[float] | np.ndarray) -> np.ndarray:
        """ρα at each order (float64 array)."""
        return self.rho * _check_orders(orders)


@dataclass(frozen=True)
class SkellamSum:
    """Skellam noise Sk(μ, μ) = Poisson(μ) − Poisson(μ) per coordinate (variance 2μ)
    added to an integer vector query with sensitivities ``l1`` = Δ1 and ``l2`` = Δ2.

    ``mu_total`` is the μ of the released sum: shares Sk(μ_i, μ_i) of the members sum to
    Sk(Σ μ_i, Σ μ_i) exactly (Poisson variables add), so a sum of n shares of μ/n carries
    the same noise as one central Sk(μ, μ) (:meth:`of_shares`).

    Privacy (Agarwal, Kairouz, Liu 2021, arXiv:2110.04995, Theorem 3.5, the
    multi-dimensional Skellam mechanism): for every integer α > 1,

        D_α ≤ α Δ2²/(4μ) + min( ((2α − 1)Δ2² + 6Δ1)/(16μ²),  3Δ1/(4μ) ).

    The first term is the Gaussian's α Δ2²/(2σ²) at the same variance σ² = 2μ; the second
    vanishes relative to it as μ → ∞. A fractional order α is charged the bound at ⌈α⌉
    (D_α is nondecreasing in α).

    Raises:
        PrivacyConfigError: μ ≤ 0 or a negative sensitivity.
    """

    mu_total: float
    l1: float
    l2: float

    def __post_init__(self) -> None:
        _positive(self.mu_total, "mu_total")
        _nonnegative(self.l1, "l1")
        _nonnegative(self.l2, "l2")

    @classmethod
    def of_shares(cls, mus: Iterable[float], l1: float, l2: float) -> SkellamSum:
        """The sum of shares Sk(μ_i, μ_i) (one per member that added noise)."""
        values = [_positive(m, "every member's mu") for m in mus]
        if not values:
            raise PrivacyConfigError("a Skellam sum needs at least one noise share")
        return cls(math.fsum(values), l1, l2)

    @property
    def name(self) -> str:
        return "skellam"

    @property
    def variance(self) -> float:
        """Per-coordinate noise variance 2μ."""
        return 2.0 * self.mu_total

    def rdp(self, orders: Sequence[float] | np.ndarray) -> np.ndarray:
        """Theorem 3.5's bound at ⌈α⌉ for each order α (float64 array)."""
        alpha = np.ceil(_check_orders(orders))
        mu, d1, d2 = self.mu_total, self.l1, self.l2
        if d1 == 0.0 or d2 == 0.0:
            return np.zeros_like(alpha)
        second = np.minimum(
            ((2.0 * alpha - 1.0) * d2**2 + 6.0 * d1) / (16.0 * mu**2), 3.0 * d1 / (4.0 * mu)
        )
        return alpha * d2**2 / (4.0 * mu) + second


# ------------------------------------------------------------------------------- ledger


def rdp_to_epsilon(
    orders: Sequence[float] | np.ndarray,
    rdp: Sequence[float] | np.ndarray,
    delta: float,
    conversion: Conversion = "improved",
) -> float:
    """ε(δ) of an RDP curve: min over the orders of the chosen conversion.

    ``"improved"`` is dp-accounting's ``compute_epsilon`` (the one
    :class:`~sharefl.privacy.accountant.PrivacyAccountant` uses through
    ``RdpAccountant.get_epsilon``); ``"classic"`` is
    :func:`~sharefl.privacy.accountant.classic_rdp_epsilon`.

    Raises:
        PrivacyConfigError: δ outside (0, 1), an unknown conversion, or mismatched lengths.
    """
    delta = check_delta(delta)
    order_arr = _check_orders(orders)
    curve = np.asarray(rdp, dtype=np.float64).reshape(-1)
    if curve.shape != order_arr.shape:
        raise PrivacyConfigError(
            f"{curve.size} RDP values for {order_arr.size} orders: give one per order"
        )
    if conversion == "classic":
        return classic_rdp_epsilon(order_arr.tolist(), curve.tolist(), delta)
    if conversion != "improved":
        raise PrivacyConfigError(f"conversion must be 'improved' or 'classic', got {conversion!r}")
    from dp_accounting.rdp import rdp_privacy_accountant

    eps, _ = rdp_privacy_accountant.compute_epsilon(list(order_arr), list(curve), delta)
    return float(eps)


@dataclass
class DistributedDPLedger:
    """Per-client ε of distributed discrete noise released through secure aggregation.

    Each :meth:`record` is one released sum that contains the client's update; a client in
    several released sums of a round (reclusterings) is recorded once per sum, since each
    is a separate release of the same data. :meth:`end_round` closes a round. A client's
    RDP curve is the order-wise sum of its releases' curves (RDP composition, Mironov
    2017, Prop. 1); full participation, no amplification by subsampling is claimed.

    Attributes:
        mechanism: the run's mechanism name reported by :meth:`summary` (e.g.
            ``"discrete_gaussian"``, ``"skellam"``); ``None``: the recorded mechanisms'
            names, sorted and joined by '+'.
        orders: the RDP orders (default :data:`DEFAULT_ORDERS`).
        conversion: RDP → (ε, δ), ``"improved"`` (default) or ``"classic"``.
        curves: client id → its composed RDP curve (one value per order).
        releases: client id → number of releases recorded for it.
        recorded: mechanism name → number of releases recorded with it.
        rounds: rounds closed by :meth:`end_round`.

    Raises:
        PrivacyConfigError: bad orders or conversion.
    """

    mechanism: str | None = None
    orders: tuple[float, ...] = DEFAULT_ORDERS
    conversion: Conversion = "improved"
    curves: dict[int, np.ndarray] = field(default_factory=dict)
    releases: dict[int, int] = field(default_factory=dict)
    recorded: dict[str, int] = field(default_factory=dict)
    rounds: int = 0

    def __post_init__(self) -> None:
        self.orders = tuple(float(a) for a in _check_orders(self.orders))
        if self.conversion not in ("improved", "classic"):
            raise PrivacyConfigError(
                f"conversion must be 'improved' or 'classic', got {self.conversion!r}"
            )
        self._order_array = np.asarray(self.orders, dtype=np.float64)
        self._curve_cache: dict[RdpMechanism, np.ndarray] = {}

    def _curve(self, mechanism: RdpMechanism) -> np.ndarray:
        try:
            cached = self._curve_cache.get(mechanism)
        except TypeError:  # unhashable mechanism: no caching
            cached = None
        if cached is None:
            cached = np.asarray(mechanism.rdp(self._order_array), dtype=np.float64)
            if cached.shape != self._order_array.shape or not np.all(cached >= 0):
                raise PrivacyConfigError(
                    f"{mechanism!r}.rdp gave {cached.shape} values (need one per order, each >= 0)"
                )
            with contextlib.suppress(TypeError):
                self._curve_cache[mechanism] = cached
        return cached

    def record(self, client_id: int, mechanism: RdpMechanism, times: int = 1) -> None:
        """Compose ``times`` releases of ``mechanism`` into client ``client_id``'s curve."""
        if isinstance(client_id, bool) or not isinstance(client_id, int | np.integer):
            raise PrivacyConfigError(f"client_id must be an integer, got {client_id!r}")
        times = _count(times, "times")
        cid = int(client_id)
        added = self._curve(mechanism) * times  # a new array: the cache stays intact
        previous = self.curves.get(cid)
        self.curves[cid] = added if previous is None else previous + added
        self.releases[cid] = self.releases.get(cid, 0) + times
        self.recorded[mechanism.name] = self.recorded.get(mechanism.name, 0) + times

    def end_round(self) -> None:
        """Close a round (counted in :attr:`rounds` and the summary)."""
        self.rounds += 1

    def record_round(self, released: Iterable[tuple[Iterable[int], RdpMechanism]]) -> None:
        """One round: each ``(members, mechanism)`` is a released sum and the honest,
        noise-adding clients whose updates it contains; then :meth:`end_round`."""
        for members, mechanism in released:
            for client in members:
                self.record(client, mechanism)
        self.end_round()

    def rdp(self, client_id: int) -> np.ndarray:
        """Client ``client_id``'s composed RDP curve (zeros if it was never recorded)."""
        curve = self.curves.get(int(client_id))
        return np.zeros_like(self._order_array) if curve is None else curve.copy()

    def epsilon(self, client_id: int, delta: float) -> float:
        """ε(δ) of client ``client_id`` (0.0 if it was never recorded: nothing about it
        was released)."""
        curve = self.curves.get(int(client_id))
        if curve is None:
            check_delta(delta)
            return 0.0
        return rdp_to_epsilon(self._order_array, curve, delta, self.conversion)

    def epsilons(self, delta: float) -> dict[int, float]:
        """ε(δ) of every recorded client (identical curves converted once)."""
        out: dict[int, float] = {}
        cache: dict[bytes, float] = {}
        for cid in sorted(self.curves):
            curve = self.curves[cid]
            key = curve.tobytes()
            if key not in cache:
                cache[key] = rdp_to_epsilon(self._order_array, curve, delta, self.conversion)
            out[cid] = cache[key]
        return out

    @property
    def mechanism_name(self) -> str | None:
        """:attr:`mechanism`, or the recorded mechanisms' names joined by '+'."""
        if self.mechanism is not None:
            return self.mechanism
        return "+".join(sorted(self.recorded)) if self.recorded else None

    def summary(self, delta: float) -> dict[str, Any]:
        """JSON-ready: mechanism, rounds, δ, worst/median/best ε over the clients (the keys
        of :meth:`ClusterPrivacyLedger.summary`, plus "mechanism" and "clients")."""
        eps = list(self.epsilons(delta).values())
        if not eps:
            return {"mechanism": self.mechanism_name, "rounds": self.rounds, "epsilon_max": None}
        return {
            "mechanism": self.mechanism_name,
            "rounds": self.rounds,
            "clients": len(eps),
            "delta": float(delta),
            "epsilon_max": max(eps),
            "epsilon_median": float(np.median(eps)),
            "epsilon_min": min(eps),
        }

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot (floats survive ``json`` exactly)."""
        return {
            "format": STATE_FORMAT,
            "mechanism": self.mechanism,
            "orders": list(self.orders),
            "conversion": self.conversion,
            "rounds": self.rounds,
            "clients": {
                str(cid): {"rdp": [float(v) for v in self.curves[cid]], "releases": n}
                for cid, n in sorted(self.releases.items())
            },
            "recorded": dict(sorted(self.recorded.items())),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace the recorded releases and rounds by those of ``state`` (from a ledger
        with the same mechanism label, orders and conversion).

        Raises:
            AccountantStateError: another format, another configuration, or a malformed
                entry.
        """
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise AccountantStateError(
                f"not a ledger state of format {STATE_FORMAT!r}; save it with "
                "DistributedDPLedger.state_dict()"
            )
        try:
            orders = [float(a) for a in state["orders"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise AccountantStateError(f"malformed ledger orders: {exc}") from exc
        mine = (self.mechanism, list(self.orders), self.conversion)
        if (state.get("mechanism"), orders, state.get("conversion")) != mine:
            raise AccountantStateError(
                "the state's mechanism/orders/conversion differ from this ledger's; build "
                "it with DistributedDPLedger.from_state_dict(state) instead"
            )
        curves: dict[int, np.ndarray] = {}
        releases: dict[int, int] = {}
        try:
            for key, entry in state["clients"].items():
                cid = int(key)
                curve = np.asarray(entry["rdp"], dtype=np.float64)
                n = entry["releases"]
                if curve.shape != self._order_array.shape or not np.all(curve >= 0):
                    raise ValueError(f"client {cid}: need {len(orders)} RDP values >= 0")
                if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                    raise ValueError(f"client {cid}: releases must be an integer >= 1")
                curves[cid], releases[cid] = curve, n
            recorded = {str(k): int(v) for k, v in state["recorded"].items()}
            rounds = state["rounds"]
            if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
                raise ValueError(f"rounds must be an integer >= 0, got {rounds!r}")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise AccountantStateError(f"malformed ledger state: {exc}") from exc
        self.curves, self.releases, self.recorded, self.rounds = (
            curves,
            releases,
            recorded,
            rounds,
        )

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> DistributedDPLedger:
        """A new ledger with the configuration and releases of ``state``."""
        try:
            ledger = cls(
                state["mechanism"], orders=tuple(state["orders"]), conversion=state["conversion"]
            )
        except (KeyError, TypeError, PrivacyConfigError) as exc:
            raise AccountantStateError(f"malformed ledger state: {exc}") from exc
        ledger.load_state_dict(state)
        return ledger


def released_cells(released: Sequence[Sequence[int]], honest: Sequence[int]) -> list[list[int]]:
    """The honest clients grouped by the set of released sums they are in (the cells of
    the sets' Venn diagram), each cell a sorted list; clients in no released sum are left
    out.

    Every released sum is a sum of whole cells (plus known Byzantine inputs), so what the
    server sees is a post-processing of the cell sums; the cells are disjoint, so client
    a's privacy is at least that of its own cell's sum: the distributed mechanism with
    that many noise-adding members. With one clustering the cells are the clusters'
    honest survivors; overlapping reclusterings cut them finer (this bound, unlike the
    Gaussian projection of :mod:`sharefl.privacy.cluster_noise`, does not use the
    remaining noise of the other members of each sum)."""
    honest_set = set(honest)
    signature: dict[int, list[int]] = {}
    for index, members in enumerate(released):
        for c in members:
            if c in honest_set:
                signature.setdefault(c, []).append(index)
    cells: dict[tuple[int, ...], list[int]] = {}
    for c, where in signature.items():
        cells.setdefault(tuple(where), []).append(c)
    return sorted(sorted(cell) for cell in cells.values())


def cell_noise_adders(
    released: Sequence[Sequence[int]], honest: Sequence[int], colluders: int
) -> list[tuple[list[int], int]]:
    """Each cell of :func:`released_cells` with the noise-adding members it is charged:
    ``max(1, n − hidden)`` for a cell of n honest clients, where ``hidden = max(0, t −
    b)``, t = ``colluders`` and b the most non-honest (Byzantine, known) members of a
    released sum that contains the cell.

    The split's threat model is that at most t members of every released sum add no noise
    (or tell the server theirs), the known Byzantine members among them; so at most
    t − b_S of the clients the caller calls honest are secret colluders in a sum S, and a
    cell lies inside every sum that contains it. The client being charged always adds its
    own share (hence at least 1). With t = 0 this is the cell's size.

    Raises :class:`PrivacyConfigError` for ``colluders < 0``."""
    if isinstance(colluders, bool) or colluders < 0:
        raise PrivacyConfigError(f"colluders must be an integer >= 0, got {colluders!r}")
    honest_set = set(honest)
    known = [sum(1 for c in members if c not in honest_set) for members in released]
    where: dict[int, list[int]] = {}
    for index, members in enumerate(released):
        for c in members:
            if c in honest_set:
                where.setdefault(c, []).append(index)
    out = []
    for cell in released_cells(released, honest):
        byzantine = max(known[i] for i in where[cell[0]])
        hidden = max(0, colluders - byzantine)
        out.append((cell, max(1, len(cell) - hidden)))
    return out
