"""The secure random source and the exact discrete samplers, against independent oracles.

Oracles: the exact pmfs (the discrete Gaussian normalised over a wide integer range,
``scipy.stats.skellam`` / ``poisson``), exact rational arithmetic (``fractions``) for the
comparisons a scripted keystream forces, and Taylor series with remainder bounds for the
tabulated CDF levels. Every statistical test uses a fixed seed (deterministic) and
``p > 1e-3``; a naive sampler failing the same test shows it has power.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from sharefl.privacy import discrete_samplers as ds
from sharefl.privacy.errors import PrivacyConfigError
from sharefl.privacy.exact_inversion import ExactInversionTable
from sharefl.privacy.secure_random import SecureRandom

P_MIN = 1e-3


def seeded(i: int) -> SecureRandom:
    return SecureRandom.from_seed(bytes([i]) * 48)


class Scripted(SecureRandom):
    """A SecureRandom whose first keystream words are given (then the seeded stream)."""

    def __init__(self, script: list[int]) -> None:
        self._start(bytes(48))
        self.script = list(script)

    def words(self, n: int) -> np.ndarray:
        head = [self.script.pop(0) for _ in range(min(n, len(self.script)))]
        rest = super().words(n - len(head)) if n > len(head) else np.zeros(0, np.uint64)
        return np.concatenate([np.array(head, dtype=np.uint64), rest])


# ------------------------------------------------------------------ chi-square helper


def chi_square_p(samples: np.ndarray, pmf: Callable[[np.ndarray], np.ndarray], lo: int, hi: int):
    """p-value of Pearson's test of ``samples`` against ``pmf`` on ``[lo, hi]`` (which must
    hold all but a negligible mass), tail bins pooled until each expects >= 5."""
    support = np.arange(lo, hi + 1)
    expected = pmf(support).astype(np.float64)
    assert abs(expected.sum() - 1) < 1e-9, "the range must hold the whole mass"
    assert samples.min() >= lo and samples.max() <= hi
    observed = np.bincount(samples - lo, minlength=hi - lo + 1).astype(np.float64)
    expected *= samples.shape[0]
    bins_e, bins_o, acc_e, acc_o = [], [], 0.0, 0.0
    for e, o in zip(expected, observed, strict=True):
        acc_e, acc_o = acc_e + e, acc_o + o
        if acc_e >= 5:
            bins_e.append(acc_e)
            bins_o.append(acc_o)
            acc_e = acc_o = 0.0
    bins_e[-1] += acc_e
    bins_o[-1] += acc_o
    # The left tail was pooled greedily; pool the right tail the same way.
    while len(bins_e) > 2 and bins_e[-1] < 5:
        bins_e[-2] += bins_e.pop()
        bins_o[-2] += bins_o.pop()
    e_arr = np.array(bins_e)
    e_arr *= samples.shape[0] / e_arr.sum()
    return stats.chisquare(np.array(bins_o), e_arr).pvalue


def dg_pmf(s2: float, half: int) -> Callable[[np.ndarray], np.ndarray]:
    x = np.arange(-half, half + 1, dtype=np.float64)
    w = np.exp(-(x**2) / (2 * s2))
    total = w.sum()
    return lambda k: np.exp(-(k.astype(np.float64) ** 2) / (2 * s2)) / total


def dg_moments(s2: float) -> tuple[float, float]:
    """E[X²], E[X⁴] of N_Z(0, s2) from the exact pmf."""
    half = int(40 * math.sqrt(s2)) + 40
    x = np.arange(-half, half + 1, dtype=np.float64)
    p = np.exp(-(x**2) / (2 * s2))
    p /= p.sum()
    return float((p * x**2).sum()), float((p * x**4).sum())


# ------------------------------------------------------------------ SecureRandom


def test_seed_reproduces_and_default_is_fresh():
    a, b = seeded(1), seeded(1)
    assert np.array_equal(a.words(1000), b.words(1000))
    assert np.array_equal(a.below(np.full(50, 7)), b.below(np.full(50, 7)))
    assert not np.array_equal(seeded(1).words(8), seeded(2).words(8))
    assert not np.array_equal(SecureRandom().words(8), SecureRandom().words(8))
    x = ds.discrete_gaussian(25.0, 1000, seeded(3))
    assert np.array_equal(x, ds.discrete_gaussian(25.0, 1000, seeded(3)))
    assert not np.array_equal(ds.discrete_gaussian(25.0, 1000), ds.discrete_gaussian(25.0, 1000))


def test_keystream_is_aes256_ctr_of_zeros():
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    seed = bytes(range(48))
    stream = Cipher(algorithms.AES(seed[:32]), modes.CTR(seed[32:])).encryptor()
    expected = np.frombuffer(stream.update(bytes(8 * 10)), dtype="<u8")
    assert np.array_equal(SecureRandom.from_seed(seed).words(10), expected)


@pytest.mark.parametrize("seed", [b"", bytes(47), bytes(49), "x" * 48, None])
def test_bad_seed_is_refused(seed):
    with pytest.raises(PrivacyConfigError, match="48 bytes"):
        SecureRandom.from_seed(seed)


def test_words_shapes_and_bits():
    rng = seeded(4)
    for n in (0, 1, 2047, 2048, 200_000):
        assert rng.words(n).shape == (n,) and rng.words(n).dtype == np.uint64
    assert rng.words32(5).dtype == np.uint32
    bits = rng.bits(100_000)
    assert bits.dtype == np.bool_ and abs(bits.mean() - 0.5) < 5 * 0.5 / math.sqrt(1e5)
    u = rng.uniform(100_000)
    assert u.min() >= 0 and u.max() < 1
    assert np.all(u * 2.0**53 == np.floor(u * 2.0**53))  # on the 2^-53 grid
    with pytest.raises(PrivacyConfigError):
        rng.words(-1)


@pytest.mark.parametrize("bound", [1, 2, 7, 101, 2**32 - 5, 3 * 2**62, 2**63 + 12345, 2**64 - 3])
def test_below_is_uniform(bound):
    rng = seeded(5)
    n = 40_000
    x = rng.below(np.full(n, bound, dtype=np.uint64))
    assert x.dtype == np.uint64 and int(x.max()) < bound
    if bound == 1:
        assert not x.any()
        return
    bins = min(bound, 16)
    # Bin b holds the values v with floor(v * bins / bound) = b: exact proportions.
    edges = [-(-bound * b // bins) for b in range(bins + 1)]
    counts = np.histogram([int(v) for v in x], bins=edges)[0] if bound > 2**53 else None
    if counts is None:
        counts = np.bincount((x * bins // bound).astype(np.int64), minlength=bins)
    expected = np.diff(edges) / bound * n
    assert stats.chisquare(counts, expected).pvalue > P_MIN


def test_naive_modulo_fails_the_uniformity_test():
    """The test above has power: ``u mod b`` for b = 3·2^62 favours the values < 2^62."""
    bound, bins, n = 3 * 2**62, 3, 40_000
    x = seeded(6).words(n) % np.uint64(bound)
    counts = np.bincount((x // np.uint64(2**62)).astype(np.int64), minlength=bins)
    assert stats.chisquare(counts, np.full(bins, n / bins)).pvalue < 1e-10


def test_below_elementwise_bounds_and_errors():
    rng = seeded(7)
    bounds = np.array([[1, 2], [10, 2**63]], dtype=np.uint64)
    x = rng.below(bounds)
    assert x.shape == (2, 2) and np.all(x < bounds)
    for bad in (np.array([0]), np.array([-3]), np.array([1.5]), 0, 2**64):
        with pytest.raises(PrivacyConfigError):
            rng.below(bad)


@pytest.mark.parametrize("bound", [3, 101, 2**32, 2**40 + 7])
def test_uniform_ints_is_uniform(bound):
    n = 40_000
    x = seeded(8).uniform_ints(bound, n)
    assert int(x.max()) < bound
    bins = min(bound, 20)
    edges = [-(-bound * b // bins) for b in range(bins + 1)]
    counts = np.histogram(x.astype(np.float64), bins=np.array(edges, dtype=np.float64))[0]
    assert stats.chisquare(counts, np.diff(edges) / bound * n).pvalue > P_MIN
    with pytest.raises(PrivacyConfigError):
        seeded(8).uniform_ints(0, 3)


@pytest.mark.parametrize(
    ("num", "den"),
    [(0, 5), (5, 5), (1, 3), (2**31 - 1, 2**32 - 1), (1, 2**40), (2**62, 2**63 - 1), (7, 10)],
)
def test_bernoulli_frequency(num, den):
    n = 200_000
    b = seeded(9).bernoulli(np.full(n, num, dtype=np.uint64), den)
    p = num / den
    assert b.dtype == np.bool_
    if p in (0.0, 1.0):
        assert b.all() == (p == 1.0) and b.any() == (p == 1.0)
    else:
        assert abs(b.mean() - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-12


def test_bernoulli_errors():
    rng = seeded(10)
    for num, den in [(2, 1), (1, 0), (-1, 3), (1, 2**63), (0.5, 1)]:
        with pytest.raises(PrivacyConfigError):
            rng.bernoulli(num, den)


@pytest.mark.parametrize("den", [3, 1000003, 2**32 - 1, 2**40 + 3, 3 * 2**61 + 1])
def test_bernoulli_undecided_prefix_is_settled_by_later_bits(den):
    """Script the first word to the one ``u`` whose interval straddles ``num/den``: the
    answer must be ``[U < num/den]`` for the real ``U`` the scripted bits spell."""
    gen = np.random.default_rng(den)
    width = 32 if den < 2**32 else 64
    for _ in range(40):
        num = int(gen.integers(1, den))
        u = num * 2**width // den  # u/2^w <= num/den < (u+1)/2^w: undecided
        nxt = int(gen.integers(0, 2**63)) * 2 + int(gen.integers(0, 2))
        low = nxt % 2**width if width == 32 else nxt
        prefix = Fraction(u * 2**width + low, 2 ** (2 * width))
        p = Fraction(num, den)
        if prefix < p < prefix + Fraction(1, 2 ** (2 * width)):
            continue  # still undecided after two words: skip this draw
        got = Scripted([u, nxt]).bernoulli(np.array([num], dtype=np.uint64), den)
        assert bool(got[0]) == (prefix < p)


# ------------------------------------------------------------------ exact inversion


def exp_neg_interval(x: Fraction, bits: int = 200) -> tuple[Fraction, Fraction]:
    """An independent oracle: the Taylor series of e^x with a remainder bound, then 1/·."""
    term, total, j = Fraction(1), Fraction(0), 0
    while True:
        total += term
        j += 1
        term = term * x / j
        if j > 2 * x + 2 and term < Fraction(1, 2**bits):
            tail = term * 2  # the remaining terms shrink by at least 1/2 each
            return 1 / (total + tail), 1 / total


def test_geometric_table_levels_match_an_independent_oracle():
    table = ds._geometric_table()
    assert table.offset == 0
    for v, level in enumerate(table.levels.tolist()):
        lo, hi = exp_neg_interval(Fraction(v + 1))
        # L_v = floor((1 - e^-(v+1)) 2^64)
        assert math.floor((1 - hi) * 2**64) == level == math.floor((1 - lo) * 2**64)


@functools.lru_cache
def poisson_cdf_interval(mu: Fraction, k: int) -> tuple[Fraction, Fraction]:
    lo, hi = exp_neg_interval(mu, 160) if k == 0 else poisson_cdf_interval(mu, 0)
    s = sum(mu**j / math.factorial(j) for j in range(k + 1))
    return lo * s, hi * s


@pytest.mark.parametrize("mu", [Fraction(3), Fraction(60)])
def test_inversion_ties_are_settled_exactly(mu):
    """A first word equal to a level L_k (or 0 below a run of zero levels) leaves the
    comparison open; the next word decides, and the answer must be the inverse CDF of the
    128-bit number the two words spell."""
    table = ds._poisson_table(mu)
    gen = np.random.default_rng(int(mu))
    cases = [int(level) for level in table.levels[:: max(1, len(table.levels) // 12)]]
    if table.offset:
        cases.append(0)
    assert mu < 10 or table.offset > 0  # μ = 60 exercises the cut-off run of zero levels
    for first in cases:
        second = int(gen.integers(0, 2**63)) * 2 + 1
        lo_u = Fraction(first * 2**64 + second, 2**128)
        hi_u = lo_u + Fraction(1, 2**128)
        k = 0
        while poisson_cdf_interval(mu, k)[1] <= lo_u:  # F(k) <= U surely
            k += 1
        assert hi_u <= poisson_cdf_interval(mu, k)[0], "the oracle must decide this case"
        assert table.sample(1, Scripted([first, second]))[0] == k


def test_inversion_table_refuses_too_wide_a_distribution(monkeypatch):
    from sharefl.privacy import exact_inversion

    monkeypatch.setattr(exact_inversion, "_MAX_LEVELS", 100)
    with pytest.raises(PrivacyConfigError, match="too spread out"):
        ExactInversionTable(ds._dg_magnitude_weights(Fraction(10**6)), "wide")


# ------------------------------------------------------------------ Bernoulli(exp(-γ))


@pytest.mark.parametrize(("num", "den"), [(0, 7), (3, 7), (7, 7), (2**50, 2**54 + 1)])
def test_bernoulli_exp_fraction_frequency(num, den):
    n = 100_000
    got = ds._bernoulli_exp_fraction(np.full(n, num, dtype=np.uint64), den, seeded(11))
    p = math.exp(-num / den)
    assert abs(got.mean() - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-12


def test_k_loop_split_branch_has_the_same_law(monkeypatch):
    """Beyond _K_FAST, Bernoulli(num/(k·den)) is drawn as Bernoulli(num/den)·Bernoulli(1/k)."""
    monkeypatch.setattr(ds, "_K_FAST", 1)
    n = 100_000
    got = ds._bernoulli_exp_fraction(np.full(n, 9, dtype=np.uint64), 10, seeded(12))
    p = math.exp(-0.9)
    assert abs(got.mean() - p) < 5 * math.sqrt(p * (1 - p) / n)


def test_geometric_exp_minus_one_law():
    v = ds._geometric_exp_minus_one(100_000, seeded(13))
    pmf = lambda k: (1 - math.exp(-1)) * np.exp(-k.astype(np.float64))  # noqa: E731
    tail = lambda k: pmf(k) + (k == 40) * math.exp(-41.0)  # noqa: E731
    assert chi_square_p(v, tail, 0, 40) > P_MIN


# ------------------------------------------------------------------ discrete Gaussian


@pytest.mark.parametrize("sigma", [0.3, 0.7, 1.5, 5.0, 40.0])
@pytest.mark.parametrize("method", ["cks", "table"])
def test_discrete_gaussian_matches_exact_pmf(sigma, method):
    dg = ds.DiscreteGaussian(sigma**2)
    s2 = float(dg.sigma_squared)
    half = int(12 * sigma) + 12
    x = dg.sample(30_000, seeded(20), method=method)
    assert x.dtype == np.int64 and x.shape == (30_000,)
    assert chi_square_p(x, dg_pmf(s2, half), -half, half) > P_MIN
    # Moments: E[X] = 0, E[X²] the exact variance (below σ² for small σ).
    ex2, ex4 = dg_moments(s2)
    se2 = math.sqrt((ex4 - ex2**2) / x.shape[0])
    assert abs(x.mean()) < 5 * math.sqrt(ex2 / x.shape[0])
    assert abs((x.astype(np.float64) ** 2).mean() - ex2) < 5 * se2
    assert dg.variance == pytest.approx(ex2, rel=1e-9)


def test_naive_rounding_fails_the_same_test():
    """round(N(0, σ²)) at σ = 0.5 puts 0.159 on ±1 instead of 0.119: the test sees it."""
    s2, half = 0.25, 20
    naive = np.round(np.random.default_rng(0).normal(0, 0.5, 30_000)).astype(np.int64)
    assert chi_square_p(naive, dg_pmf(s2, half), -half, half) < 1e-10
    exact = ds.discrete_gaussian(s2, 30_000, seeded(21))
    assert chi_square_p(exact, dg_pmf(s2, half), -half, half) > P_MIN


def test_small_sigma_variance_is_below_sigma_squared():
    dg = ds.DiscreteGaussian(0.09)
    assert dg.variance < 0.0078 and dg.variance == pytest.approx(dg_moments(0.09)[0])
    assert np.all(ds.discrete_gaussian(1e-4, 10_000, seeded(22)) == 0)


@pytest.mark.parametrize("sigma", [300.0, 2.0**20])
def test_large_sigma_moments_by_cks(sigma):
    dg = ds.DiscreteGaussian(sigma**2)
    x = dg.sample(20_000, seeded(23), method="cks").astype(np.float64)
    n = x.shape[0]
    s2 = float(dg.sigma_squared)
    assert abs(x.mean()) < 5 * math.sqrt(s2 / n)
    assert abs((x**2).mean() / s2 - 1) < 5 * math.sqrt(2 / n)  # E[X⁴] = 3σ⁴ here
    # Standardised, the law is N(0, 1) to within 1e-9: Kolmogorov-Smirnov.
    assert stats.kstest(x / math.sqrt(s2), "norm").pvalue > P_MIN


@pytest.mark.parametrize(
    "request_s2", [1e-12, 0.01, 0.09, 0.25, 0.99, 2.25, 1e4, Fraction(10**8, 3), 2.0**40]
)
def test_sigma_squared_is_rounded_up_within_the_design(request_s2):
    dg = ds.DiscreteGaussian(request_s2)
    requested = Fraction(request_s2)
    assert dg.sigma_squared >= requested
    assert dg.sigma_squared - requested <= Fraction(dg.t, dg.q)
    assert dg.sigma_squared == Fraction(dg.t * dg.r, dg.q)
    assert dg.q & (dg.q - 1) == 0 and dg.q <= 2**32
    assert (dg.t - 1) ** 2 <= requested < dg.t**2  # t = ⌊σ⌋ + 1
    assert dg.denominator == 2 * dg.q * dg.t * dg.r
    assert dg.denominator * 2**8 < 2**63
    assert (dg.y_max * dg.q - dg.r) ** 2 < 2**63 <= ((dg.y_max + 1) * dg.q - dg.r) ** 2
    assert dg.g_tail >= 2**8
    if requested >= 1:
        assert float(dg.sigma_squared / requested - 1) < 2**-25
    else:
        increase = dg.sigma_squared - requested
        assert increase <= max(Fraction(1, 2**32), Fraction(math.sqrt(requested)) / 2**26)


def test_tail_samples_are_exact():
    """|Y| > y_max: the Python-int path. Right above y_max the exponent is g_tail plus
    a fraction, so after the g_tail coins the acceptance is exp(-(γ - g_tail))."""
    dg = ds.DiscreteGaussian(0.09)
    rng = seeded(24)
    for a in (dg.y_max + 1, dg.y_max + 2):
        gamma = Fraction((a * dg.q - dg.r) ** 2, dg.denominator)
        p = math.exp(-float(gamma - dg.g_tail))
        n = 3000 if p > 1e-3 else 300
        got = sum(dg._finish_tail(a, rng) for _ in range(n))
        assert abs(got / n - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-9
    # In a batch, tail candidates are (all but surely) rejected and the others handled.
    y = np.array([0] * 20_000 + [dg.y_max + 3] * 5000, dtype=np.int64)
    passed = dg._accept(y, rng)
    assert not passed[20_000:].any()
    p0 = math.exp(-float(Fraction(dg.r**2, dg.denominator)))
    assert abs(passed[:20_000].mean() - p0) < 5 * math.sqrt(p0 * (1 - p0) / 20_000)


def test_zero_shapes_and_errors():
    assert np.array_equal(ds.discrete_gaussian(0, (2, 3)), np.zeros((2, 3), dtype=np.int64))
    assert ds.DiscreteGaussian(0).variance == 0
    assert ds.discrete_gaussian(4.0, (3, 0, 2), seeded(25)).shape == (3, 0, 2)
    assert ds.discrete_gaussian(4.0, (5, 7), seeded(25)).shape == (5, 7)
    for bad in (-1.0, float("nan"), float("inf"), -Fraction(1, 3), "1", True, 2.0**60):
        with pytest.raises(PrivacyConfigError):
            ds.DiscreteGaussian(bad)
    for size in (-1, (2, -1), 1.5):
        with pytest.raises(PrivacyConfigError):
            ds.discrete_gaussian(1.0, size)
    with pytest.raises(PrivacyConfigError, match="method"):
        ds.discrete_gaussian(1.0, 3, method="naive")


# ------------------------------------------------------------------ Skellam


@pytest.mark.parametrize(
    ("mu", "method"),
    [
        (0.5, "table"),
        (3.0, "table"),
        (50.0, "table"),
        (50.0, "ptrs"),
        (2000.0, "table"),
        (2000.0, "ptrs"),
    ],
)
def test_skellam_matches_exact_pmf(mu, method):
    x = ds.skellam(mu, 30_000, seeded(30), method=method)
    half = int(12 * math.sqrt(2 * mu)) + 15
    pmf = lambda k: stats.skellam.pmf(k, mu, mu)  # noqa: E731
    assert chi_square_p(x, pmf, -half, half) > P_MIN
    n = x.shape[0]
    var = 2 * mu
    fourth = 3 * var**2 + var  # E[X⁴] of Sk(μ, μ): cumulants κ2 = κ4 = 2μ
    assert abs(x.mean()) < 5 * math.sqrt(var / n)
    assert abs((x.astype(np.float64) ** 2).mean() - var) < 5 * math.sqrt((fourth - var**2) / n)


@pytest.mark.parametrize("method", ["table", "ptrs"])
def test_poisson_matches_exact_pmf(method):
    mu = 60.0
    x = ds._poisson(30_000, Fraction(mu), seeded(31), method)
    assert chi_square_p(x, lambda k: stats.poisson.pmf(k, mu), 0, 200) > P_MIN


def test_skellam_dataclass_and_errors():
    sk = ds.Skellam(Fraction(5, 2))
    assert sk.variance == 5 and sk.mu == Fraction(5, 2)
    assert ds.Skellam(1.5).mu == Fraction(3, 2)
    assert np.array_equal(ds.skellam(0, 4), np.zeros(4, dtype=np.int64))
    assert ds.skellam(2.0, (2, 5), seeded(32)).shape == (2, 5)
    for bad in (-0.5, float("nan"), float("inf"), 2.0**41):
        with pytest.raises(PrivacyConfigError):
            ds.Skellam(bad)
    with pytest.raises(PrivacyConfigError, match="PTRS"):
        ds.skellam(3.0, 10, method="ptrs")
    with pytest.raises(PrivacyConfigError, match="method"):
        ds.skellam(3.0, 10, method="inversion")


def test_log_factorial_matches_lgamma():
    k = np.array([0, 1, 5, 7, 8, 9, 50, 10**4, 10**9])
    expected = [math.lgamma(v + 1) for v in k.tolist()]
    assert np.allclose(ds._log_factorial(k), expected, rtol=1e-14, atol=1e-14)


# ------------------------------------------------------------------ slow: larger samples


@pytest.mark.slow
@pytest.mark.parametrize("sigma", [0.3, 0.5, 1.0, 3.0, 17.0, 100.0])
@pytest.mark.parametrize("method", ["cks", "table"])
def test_discrete_gaussian_large_sample(sigma, method):
    dg = ds.DiscreteGaussian(sigma**2)
    half = int(12 * sigma) + 12
    x = dg.sample(1_000_000, seeded(40), method=method)
    assert chi_square_p(x, dg_pmf(float(dg.sigma_squared), half), -half, half) > P_MIN


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mu", "method"), [(0.1, "table"), (7.0, "table"), (500.0, "table"), (500.0, "ptrs")]
)
def test_skellam_large_sample(mu, method):
    x = ds.skellam(mu, 1_000_000, seeded(41), method=method)
    half = int(12 * math.sqrt(2 * mu)) + 15
    assert chi_square_p(x, lambda k: stats.skellam.pmf(k, mu, mu), -half, half) > P_MIN
