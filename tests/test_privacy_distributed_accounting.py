"""Accounting of the distributed discrete Gaussian and Skellam mechanisms
(sharefl.privacy.distributed_accounting), against independent oracles:

- the exact Rényi divergences of the noise distributions, computed from their pmfs
  (log-domain convolution of discrete Gaussians; the Skellam pmf e^{-2μ} I_|k|(2μ)): every
  bound must lie above them, and be tight where the papers say it is;
- dp-accounting's privacy-loss distribution of the discrete Gaussian (exact ε(δ));
- the Gaussian mechanism's RDP and ``PrivacyAccountant`` for the limits;
- TensorFlow Federated's published test vectors for the rounding's norm bound, and the
  authors' own accounting formulas (google-research/federated, distributed_dp/
  accounting_utils.py) evaluated by hand at several parameter sets (the papers show only
  plots of ε, so no table value can be reproduced).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import ive, logsumexp

from sharefl.privacy.accountant import PrivacyAccountant
from sharefl.privacy.distributed_accounting import (
    DEFAULT_ORDERS,
    DiscreteGaussianSum,
    DistributedDPLedger,
    RdpMechanism,
    Sensitivity,
    SkellamSum,
    ddg_tau,
    rdp_to_epsilon,
    rounded_sensitivity,
)
from sharefl.privacy.errors import AccountantStateError, PrivacyConfigError

# ------------------------------------------------------------------------------ oracles


def _log_conv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """log of the convolution of two pmfs given as logs (exact in the tails)."""
    out = np.full(len(a) + len(b) - 1, -np.inf)
    for i, ai in enumerate(a):
        out[i : i + len(b)] = np.logaddexp(out[i : i + len(b)], ai + b)
    return out


def _log_ddg_sum(sigma2: float, members: int, half_width: int) -> np.ndarray:
    """log pmf of the sum of ``members`` N_Z(0, σ²) on [−n·L, n·L] (each truncated to
    [−L, L], L = ``half_width``, far beyond where the divergences below get weight)."""
    x = np.arange(-half_width, half_width + 1)
    one = -(x**2) / (2 * sigma2)
    one -= logsumexp(one)
    out = one
    for _ in range(members - 1):
        out = _log_conv(out, one)
    return out


def _renyi_shift(log_pmf: np.ndarray, shift: int, alpha: float) -> float:
    """D_α(Z ‖ Z + shift) for the pmf on a centred grid, checking that the grid's ends
    carry no weight."""
    lp, lq = log_pmf[shift:], log_pmf[:-shift]  # P[Z = x], P[Z + shift = x]
    terms = alpha * lp + (1 - alpha) * lq
    assert np.all(np.isfinite(terms))
    total = logsumexp(terms)
    assert max(terms[0], terms[-1]) < total - 40, "grid too narrow for this order"
    return float(total / (alpha - 1))


def _log_skellam(mu: float, half_width: int) -> np.ndarray:
    """log pmf of Sk(μ, μ) = Poisson(μ) − Poisson(μ): e^{−2μ} I_|k|(2μ) = ive(|k|, 2μ)."""
    k = np.abs(np.arange(-half_width, half_width + 1))
    return np.log(ive(k, 2 * mu))


# -------------------------------------------------------------------------------- orders


def test_default_orders_are_dp_accountings():
    from dp_accounting.rdp import rdp_privacy_accountant

    assert list(DEFAULT_ORDERS) == list(rdp_privacy_accountant.DEFAULT_RDP_ORDERS)


# ------------------------------------------------------------------- rounding sensitivity


@pytest.mark.parametrize(
    ("clip", "gamma", "beta", "dim", "expected"),
    [
        (1.0, 1e-9, 0.0, 10**9, 1.0000316227766017),
        (1.0, 1e-2, 0.0, 10**9, 317.2277660168379),
        (1.0, 1e-9, 0.01, 10**9, 1.000000001642451),
        (1.0, 1e-2, 0.01, 10**9, 158.13231445360802),
        (1.0, 1e-9, 0.5, 10**9, 1.0000000007137142),
        (1.0, 1e-2, 0.5, 10**9, 158.12296930808552),
    ],
)
def test_rounded_l2_matches_tff_published_vectors(clip, gamma, beta, dim, expected):
    """TFF's InflatedNormTest vectors (discretization_test.py, "computed independently ...
    using Equations (18) and (19) in Section 4.1" of arXiv:2102.06387), in unscaled units:
    our integer-domain l2 times γ."""
    sensitivity = rounded_sensitivity(clip, gamma, dim, beta)
    assert isinstance(sensitivity, Sensitivity)
    l1, l2 = sensitivity
    assert sensitivity.l2 == l2 and sensitivity.l1 == l1
    assert l2 * gamma == pytest.approx(expected, rel=1e-12)
    assert l1 == pytest.approx(min(l2 * l2, math.sqrt(dim) * l2), rel=1e-15)


def test_rounded_sensitivity_bounds_real_rounded_vectors():
    """Rotate-free check of the norm bounds: random vectors of norm c/γ, rounded at random
    coordinate-wise, never exceed c/γ + √d, exceed the conditional bound with frequency
    ≤ β, and their integer l1 norm obeys the l1 bound when the l2 bound holds."""
    rng = np.random.default_rng(7)
    clip, gamma, dim, beta = 1.0, 0.05, 64, 0.05
    _, l2_plain = rounded_sensitivity(clip, gamma, dim, 0.0)
    l1_cond, l2_cond = rounded_sensitivity(clip, gamma, dim, beta)
    assert l2_cond < l2_plain
    over = 0
    trials = 4000
    for _ in range(trials):
        v = rng.standard_normal(dim)
        v *= (clip / gamma) / np.linalg.norm(v)
        low = np.floor(v)
        rounded = low + (rng.random(dim) < (v - low))
        norm = np.linalg.norm(rounded)
        assert norm <= l2_plain + 1e-9
        if norm > l2_cond:
            over += 1
        else:
            assert np.abs(rounded).sum() <= l1_cond + 1e-9
    assert over / trials <= beta


@pytest.mark.parametrize(
    "args",
    [(0.0, 0.1, 4, 0.0), (1.0, 0.0, 4, 0.0), (1.0, 0.1, 0, 0.0), (1.0, 0.1, 4, 1.0)],
)
def test_rounded_sensitivity_rejects_bad_parameters(args):
    with pytest.raises(PrivacyConfigError):
        rounded_sensitivity(*args)


# --------------------------------------------------------------- distributed discrete G.


def test_tau_is_the_theorems_sum():
    s2 = 0.7
    assert ddg_tau(s2, 1) == 0.0
    assert ddg_tau(s2, 2) == pytest.approx(10 * math.exp(-(math.pi**2) * s2), rel=1e-14)
    want = 10 * sum(math.exp(-2 * math.pi**2 * s2 * k / (k + 1)) for k in range(1, 7))
    assert ddg_tau(s2, 7) == pytest.approx(want, rel=1e-14)
    assert ddg_tau(76.0, 10**5) == 0.0


def test_single_discrete_gaussian_is_the_gaussians_zcdp():
    m = DiscreteGaussianSum(4.0, 1, 3.0, 2.0, 5)
    orders = np.array([1.5, 2.0, 10.0, 256.0])
    assert m.name == "discrete_gaussian"
    np.testing.assert_allclose(m.rdp(orders), orders * 4.0 / 8.0, rtol=1e-15)


@pytest.mark.parametrize("sigma", [0.5, 0.6, 0.8, 1.0, 1.5])
@pytest.mark.parametrize("members", [2, 3, 5])
def test_ddg_bound_dominates_the_exact_divergence(sigma, members):
    """Exact D_α(Z ‖ Z + Δ) of a sum of n discrete Gaussians (Z's pmf by convolution)
    lies below the bound at every order, in one and two coordinates, and the bound is
    tight (within 0.1 %) once τ is negligible: a wrong constant fails one or the other."""
    log_pmf = _log_ddg_sum(sigma**2, members, half_width=60)
    for shift in (1, 2, 4):
        one_d = DiscreteGaussianSum(sigma**2, members, shift, shift, 1)
        two_d = DiscreteGaussianSum(sigma**2, members, 2 * shift, math.sqrt(2) * shift, 2)
        for alpha in (1.5, 2.0, 4.0, 8.0):
            exact = _renyi_shift(log_pmf, shift, alpha)
            bound = float(one_d.rdp([alpha])[0])
            assert exact <= bound * (1 + 1e-12)
            # Δ = (shift, shift): the coordinates are independent, the divergences add
            assert 2 * exact <= float(two_d.rdp([alpha])[0]) * (1 + 1e-12)
            if sigma >= 1.5:
                assert exact >= bound * 0.999


def test_single_discrete_gaussian_bound_is_tight():
    """Canonne–Kamath–Steinke: D_α ≤ αΔ²/(2σ²), with equality when (α − 1)Δ is an
    integer (the shifted theta sum equals the normaliser) and close to it otherwise."""
    sigma = 1.2
    log_pmf = _log_ddg_sum(sigma**2, 1, half_width=80)
    m = DiscreteGaussianSum(sigma**2, 1, 3, 3, 1)
    for alpha in (1.5, 3.0, 6.0):
        exact = _renyi_shift(log_pmf, 3, alpha)
        bound = float(m.rdp([alpha])[0])
        assert bound * 0.999 <= exact <= bound * (1 + 1e-12)


def test_single_discrete_gaussian_against_dp_accounting_pld():
    """dp-accounting's PLD of the discrete Gaussian gives the exact ε(δ) (up to its
    pessimistic discretisation); the RDP route must lie above it, within 12 %."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    for sigma, shift in ((1.0, 1), (2.0, 1), (5.0, 3), (0.5, 1)):
        exact = pld.from_discrete_gaussian_mechanism(
            sigma, sensitivity=shift, value_discretization_interval=1e-4
        ).get_epsilon_for_delta(1e-5)
        ledger = DistributedDPLedger()
        ledger.record(0, DiscreteGaussianSum(sigma**2, 1, shift, shift, 1))
        ours = ledger.epsilon(0, 1e-5)
        assert exact <= ours <= 1.12 * exact


def test_ddg_with_large_sigma_is_the_continuous_gaussian():
    """τ underflows to 0 and the bound is exactly α Δ2²/(2nσ²), the continuous Gaussian's
    RDP with the members' total variance nσ²."""
    m = DiscreteGaussianSum(400.0, 10, 900.0, 30.0, 1000)
    assert m.tau == 0.0
    orders = np.asarray(DEFAULT_ORDERS)
    np.testing.assert_allclose(m.rdp(orders), orders * 30.0**2 / (2 * 10 * 400.0), rtol=1e-15)
    assert m.rho == 30.0**2 / (2 * 10 * 400.0)


def _authors_ddg_rdp(alpha, sigma2, members, l1, l2, dim):
    """Proposition 14's per-order bound as the authors' accounting code writes it."""
    tau = ddg_tau(sigma2, members)
    s1 = l1 / math.sqrt(members * sigma2)
    s2 = l2 / math.sqrt(members * sigma2)
    return min(
        alpha / 2 * s2**2 + tau * dim,
        alpha / 2 * (s2**2 + 2 * s1 * tau + tau**2 * dim),
        alpha / 2 * (s2 + math.sqrt(dim) * tau) ** 2,
    )


@given(
    sigma2=st.floats(0.25, 3.0),
    members=st.integers(2, 40),
    l2=st.floats(0.5, 50.0),
    spread=st.floats(0.0, 1.0),
    dim=st.integers(1, 10_000),
)
def test_ddg_bound_is_never_below_the_per_order_proposition(sigma2, members, l2, spread, dim):
    """Our zCDP form is implied by Proposition 14 (it is ≥ at every order ≥ 1), and equals
    it where the L1/L2 branches are the minimum."""
    l1 = l2 * (1 + spread * (math.sqrt(dim) - 1))
    m = DiscreteGaussianSum(sigma2, members, l1, l2, dim)
    for alpha in (1.1, 2.0, 8.0, 64.0):
        theirs = _authors_ddg_rdp(alpha, sigma2, members, l1, l2, dim)
        assert float(m.rdp([alpha])[0]) >= theirs * (1 - 1e-12)


def test_ddg_rejects_bad_parameters():
    with pytest.raises(PrivacyConfigError, match="sigma >= 1/2"):
        DiscreteGaussianSum(0.2, 2, 1.0, 1.0, 1)
    DiscreteGaussianSum(0.2, 1, 1.0, 1.0, 1)  # a single discrete Gaussian: any σ
    for bad in [(0.0, 1, 1.0, 1.0, 1), (1.0, 0, 1.0, 1.0, 1), (1.0, 1, -1.0, 1.0, 1)]:
        with pytest.raises(PrivacyConfigError):
            DiscreteGaussianSum(*bad)
    with pytest.raises(PrivacyConfigError):
        DiscreteGaussianSum(1.0, 2, 1.0, 1.0, 0)
    with pytest.raises(PrivacyConfigError):
        DiscreteGaussianSum(1.0, 2, 1.0, 1.0, 3).rdp([1.0, 2.0])


def test_zero_sensitivity_costs_nothing():
    assert not np.any(DiscreteGaussianSum(0.3, 4, 0.0, 0.0, 10).rdp([2.0, 30.0]))
    assert not np.any(SkellamSum(1.0, 0.0, 0.0).rdp([2.0, 30.0]))


# ------------------------------------------------------------------------------ Skellam


@pytest.mark.parametrize("mu", [0.5, 2.0, 10.0, 50.0, 1000.0])
def test_skellam_bound_dominates_the_exact_divergence(mu):
    """Exact D_α(Sk(μ) ‖ Sk(μ) + Δ) from the pmf e^{−2μ}I_|k|(2μ) lies below Theorem 3.5's
    bound at integer orders, and within 0.2 % of it for μ = 1000 (variance 2μ: with the
    variance μ reading the bound would be off by 2×)."""
    half_width = int(20 * math.sqrt(2 * mu)) + 80
    log_pmf = _log_skellam(mu, half_width)
    assert abs(logsumexp(log_pmf)) < 1e-9
    for shift in (1, 2, 4):
        m = SkellamSum(mu, shift, shift)
        for alpha in (2, 3, 5, 8, 16):
            exact = _renyi_shift(log_pmf, shift, alpha)
            bound = float(m.rdp([alpha])[0])
            assert exact <= bound * (1 + 1e-12)
            if mu >= 1000:
                assert exact >= bound * 0.998


def test_skellam_tends_to_the_gaussian():
    """As μ → ∞ the bound over the Gaussian's αΔ2²/(2σ²), σ² = 2μ, decreases to 1."""
    orders = np.asarray(DEFAULT_ORDERS)
    ratios = []
    for mu in (1e2, 1e4, 1e6, 1e8):
        m = SkellamSum(mu, 12.0, 4.0)
        gaussian = np.ceil(orders) * 16.0 / (2 * m.variance)
        ratio = m.rdp(orders) / gaussian
        assert np.all(ratio >= 1.0)
        ratios.append(float(ratio.max()))
    assert ratios == sorted(ratios, reverse=True)
    assert ratios[-1] - 1 < 1e-6


def test_skellam_fractional_orders_use_the_next_integer():
    m = SkellamSum(3.0, 2.0, 1.5)
    np.testing.assert_array_equal(m.rdp([1.1, 1.5, 2.0]), m.rdp([2.0, 2.0, 2.0]))
    np.testing.assert_array_equal(m.rdp([2.5, 10.9]), m.rdp([3.0, 11.0]))


def test_skellam_shares_add_up():
    m = SkellamSum.of_shares([0.5, 1.25, 2.0], 3.0, 2.0)
    assert m == SkellamSum(3.75, 3.0, 2.0)
    assert m.variance == 7.5 and m.name == "skellam"
    with pytest.raises(PrivacyConfigError):
        SkellamSum.of_shares([], 1.0, 1.0)
    with pytest.raises(PrivacyConfigError):
        SkellamSum(0.0, 1.0, 1.0)


# ----------------------------------------------------- the authors' accounting, by hand

# google-research/federated distributed_dp/accounting_utils.py, q = 1: ddgauss_epsilon
# (gamma, local_stddev, num_clients, l2_sens, beta, dim, steps, delta) and
# skellam_epsilon(scale, central_stddev, l2_sens, beta, dim, steps, delta), orders
# 2..128 and 256, with tfp.get_privacy_spent's (improved) conversion. The values were
# computed from those formulas in a separate script, transcribed here.
AUTHORS_ORDERS = (*range(2, 129), 256)
AUTHORS_DDG = [
    # gamma, local std, n, clip, beta, dim, steps, delta, their ε
    (1e-3, 1 / math.sqrt(10), 10, 1.0, math.exp(-0.5), 2**16, 5, 1e-5, 12.433031480042894),
    (5e-3, 2 / math.sqrt(3), 3, 1.0, 0.0, 1000, 20, 1e-6, 16.012192271666205),
    (1e-2, 0.03, 100, 1.0, math.exp(-0.5), 4096, 1, 1e-5, 22.52218665940589),
]
AUTHORS_SKELLAM = [
    # scale, central std, clip, beta, dim, steps, delta, their ε
    (1e3, 1.0, 1.0, math.exp(-0.5), 2**16, 5, 1e-5, 12.43303977623145),
    (200.0, 2.0, 1.0, 0.0, 1000, 20, 1e-6, 16.01225324683908),
    (100.0, 0.3, 1.0, math.exp(-0.5), 4096, 1, 1e-5, 22.54503444813621),
    (10.0, 1.0, 1.0, 0.0, 16, 3, 1e-5, 13.720391480042895),
]


@pytest.mark.parametrize("case", AUTHORS_DDG)
def test_ddg_matches_the_authors_accounting(case):
    gamma, std, n, clip, beta, dim, steps, delta, theirs = case
    l1, l2 = rounded_sensitivity(clip, gamma, dim, beta)
    ledger = DistributedDPLedger(orders=AUTHORS_ORDERS)
    ledger.record(0, DiscreteGaussianSum((std / gamma) ** 2, n, l1, l2, dim), steps)
    assert ledger.epsilon(0, delta) == pytest.approx(theirs, rel=1e-12)


def test_ddg_is_above_the_authors_accounting_when_tau_matters():
    """σ = 0.52 in the integer domain, n = 2: τ = 0.69; their per-order term α/2·A + τd
    gives ε = 333.72, our zCDP form 361.46 (the price of reading Theorem 1 as A + 2τd)."""
    l1, l2 = rounded_sensitivity(1.0, 0.5, 4, 0.0)
    m = DiscreteGaussianSum((0.26 / 0.5) ** 2, 2, l1, l2, 4)
    assert m.tau == pytest.approx(0.6933946668527708, rel=1e-12)
    ledger = DistributedDPLedger(orders=AUTHORS_ORDERS)
    ledger.record(0, m, 10)
    assert ledger.epsilon(0, 1e-5) == pytest.approx(361.45619261775244, rel=1e-12)
    assert ledger.epsilon(0, 1e-5) >= 333.7204059436416


@pytest.mark.parametrize("case", AUTHORS_SKELLAM)
def test_skellam_matches_the_authors_accounting(case):
    """Their unscaled formula α l2²/(2v) + min(((2α−1)s l2² + 6 l1)/(4s³v²), 3 l1/(2sv))
    is Theorem 3.5 with Δ = s·l, 2μ = s²v."""
    scale, central_std, clip, beta, dim, steps, delta, theirs = case
    l1, l2 = rounded_sensitivity(clip, 1 / scale, dim, beta)
    ledger = DistributedDPLedger(orders=AUTHORS_ORDERS)
    ledger.record(0, SkellamSum((scale * central_std) ** 2 / 2, l1, l2), steps)
    assert ledger.epsilon(0, delta) == pytest.approx(theirs, rel=1e-12)


# ------------------------------------------------------------------------------- ledger


def test_mechanisms_satisfy_the_protocol():
    assert isinstance(SkellamSum(1.0, 1.0, 1.0), RdpMechanism)
    assert isinstance(DiscreteGaussianSum(1.0, 2, 1.0, 1.0, 1), RdpMechanism)


@pytest.mark.parametrize(
    "mechanism", [DiscreteGaussianSum(0.8, 3, 5.0, 2.0, 9), SkellamSum(7.5, 5.0, 2.0)]
)
def test_composition_over_rounds_is_additive_at_every_order(mechanism):
    rounds = 37
    one = DistributedDPLedger()
    one.record(1, mechanism)
    looped, batched = DistributedDPLedger(), DistributedDPLedger()
    for _ in range(rounds):
        looped.record(1, mechanism)
    batched.record(1, mechanism, times=rounds)
    np.testing.assert_allclose(looped.rdp(1), rounds * one.rdp(1), rtol=1e-13)
    np.testing.assert_allclose(batched.rdp(1), rounds * one.rdp(1), rtol=1e-15)
    assert looped.releases[1] == batched.releases[1] == rounds


@pytest.mark.parametrize("conversion", ["improved", "classic"])
@pytest.mark.parametrize(("rounds", "delta"), [(1, 1e-5), (50, 1e-5), (1000, 1e-6)])
def test_gaussian_equivalent_matches_privacy_accountant(conversion, rounds, delta):
    """A DDG with τ = 0 is a Gaussian mechanism of noise multiplier √(nσ²)/Δ2; its ε(δ)
    equals PrivacyAccountant('rdp').step(σ_eff, 1.0, T) with the same conversion."""
    sigma2, members, l2 = 900.0, 8, 60.0
    ledger = DistributedDPLedger(conversion=conversion)
    ledger.record(3, DiscreteGaussianSum(sigma2, members, l2 * 4, l2, 64), rounds)
    accountant = PrivacyAccountant("rdp", conversion=conversion)
    accountant.step(math.sqrt(members * sigma2) / l2, 1.0, rounds)
    assert ledger.epsilon(3, delta) == pytest.approx(accountant.get_epsilon(delta), rel=1e-10)


@given(
    sigma2=st.floats(0.25, 1e4),
    members=st.integers(1, 30),
    l2=st.floats(0.1, 1e3),
    dim=st.integers(1, 10**6),
    factor=st.floats(1.0, 100.0),
    rounds=st.integers(1, 1000),
)
def test_more_noise_never_costs_more_epsilon(sigma2, members, l2, dim, factor, rounds):
    l1 = l2 * min(math.sqrt(dim), l2)
    pairs = [
        (
            DiscreteGaussianSum(sigma2, members, l1, l2, dim),
            DiscreteGaussianSum(sigma2 * factor, members, l1, l2, dim),
        ),
        (SkellamSum(sigma2 / 2, l1, l2), SkellamSum(sigma2 * factor / 2, l1, l2)),
    ]
    orders = np.asarray(DEFAULT_ORDERS)
    for less, more in pairs:
        assert np.all(more.rdp(orders) <= less.rdp(orders))
        eps = []
        for m in (less, more):
            ledger = DistributedDPLedger()
            ledger.record(0, m, rounds)
            eps.append(ledger.epsilon(0, 1e-5))
        assert eps[1] <= eps[0]


def test_per_client_epsilons_and_summary():
    ledger = DistributedDPLedger("skellam")
    weak = SkellamSum(50.0, 30.0, 6.0)
    strong = SkellamSum(5000.0, 30.0, 6.0)
    ledger.record_round([([1, 2, 3], strong), ([4, 5], weak), ([3], weak)])
    eps = ledger.epsilons(1e-5)  # client 3 is in two released sums of the round
    assert eps[1] == eps[2] < eps[4] == eps[5] < eps[3]
    assert ledger.epsilon(99, 1e-5) == 0.0
    assert ledger.releases == {1: 1, 2: 1, 3: 2, 4: 1, 5: 1}
    for c in (1, 2, 3, 4, 5):
        ledger.record(c, strong)
    ledger.end_round()
    eps = ledger.epsilons(1e-5)
    summary = ledger.summary(1e-5)
    json.dumps(summary)
    assert summary == {
        "mechanism": "skellam",
        "rounds": 2,
        "clients": 5,
        "delta": 1e-5,
        "epsilon_max": eps[3],
        "epsilon_median": eps[4],
        "epsilon_min": eps[1],
    }


def test_unlabelled_ledger_names_the_recorded_mechanisms():
    ledger = DistributedDPLedger()
    assert ledger.summary(1e-5) == {"mechanism": None, "rounds": 0, "epsilon_max": None}
    ledger.record(1, SkellamSum(100.0, 30.0, 6.0))
    assert ledger.summary(1e-5)["mechanism"] == "skellam"
    ledger.record(1, DiscreteGaussianSum(100.0, 3, 30.0, 6.0, 4))
    ledger.record(2, DiscreteGaussianSum(100.0, 1, 30.0, 6.0, 4))
    assert ledger.summary(1e-5)["mechanism"] == (
        "discrete_gaussian+distributed_discrete_gaussian+skellam"
    )
    assert DistributedDPLedger("skellam").summary(1e-5)["mechanism"] == "skellam"


def test_state_dict_round_trips_through_json():
    ledger = DistributedDPLedger("discrete_gaussian", conversion="classic")
    ledger.record_round([([0, 1, 2], DiscreteGaussianSum(0.9, 3, 7.0, 3.1, 17))])
    ledger.record_round([([2, 3], SkellamSum(12.3456789, 7.0, 3.1))])
    restored = DistributedDPLedger.from_state_dict(json.loads(json.dumps(ledger.state_dict())))
    assert restored.summary(1e-6) == ledger.summary(1e-6)
    assert restored.rounds == 2 and restored.releases == ledger.releases
    for cid in range(4):
        np.testing.assert_array_equal(restored.rdp(cid), ledger.rdp(cid))
    restored.record(2, SkellamSum(1.0, 1.0, 1.0))
    assert restored.epsilon(2, 1e-6) > ledger.epsilon(2, 1e-6)
    assert ledger.releases[2] == 2


def test_state_dict_mismatch_and_malformed():
    state = DistributedDPLedger().state_dict()
    with pytest.raises(AccountantStateError, match="from_state_dict"):
        DistributedDPLedger(conversion="classic").load_state_dict(state)
    with pytest.raises(AccountantStateError, match="from_state_dict"):
        DistributedDPLedger(orders=(2.0, 3.0)).load_state_dict(state)
    with pytest.raises(AccountantStateError, match="from_state_dict"):
        DistributedDPLedger("skellam").load_state_dict(state)
    with pytest.raises(AccountantStateError):
        DistributedDPLedger().load_state_dict(dict(state, rounds=-1))
    with pytest.raises(AccountantStateError):
        DistributedDPLedger().load_state_dict({"format": "other"})
    bad = dict(state, clients={"1": {"rdp": [1.0], "releases": 1}})
    with pytest.raises(AccountantStateError):
        DistributedDPLedger().load_state_dict(bad)
    with pytest.raises(AccountantStateError):
        DistributedDPLedger.from_state_dict({"format": state["format"]})


def test_ledger_rejects_bad_arguments():
    with pytest.raises(PrivacyConfigError):
        DistributedDPLedger(conversion="pld")  # type: ignore[arg-type]
    with pytest.raises(PrivacyConfigError):
        DistributedDPLedger(orders=(0.5, 2.0))
    ledger = DistributedDPLedger()
    with pytest.raises(PrivacyConfigError):
        ledger.record(True, SkellamSum(1.0, 1.0, 1.0))
    with pytest.raises(PrivacyConfigError):
        ledger.record(1, SkellamSum(1.0, 1.0, 1.0), times=0)
    ledger.record(1, SkellamSum(1.0, 1.0, 1.0))
    with pytest.raises(PrivacyConfigError):
        ledger.epsilon(1, 0.0)
    with pytest.raises(PrivacyConfigError):
        rdp_to_epsilon([2.0, 3.0], [1.0], 1e-5)
