"""The papers' server rules: SHARE hierarchical aggregation and Zeno++, the noise-aware
filter, RSA / DP-RSA, and the decentralized neighbour rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from sharefl.robust import (
    IOS,
    AggregationError,
    ClusterScale,
    DecentralizedTrimmedMean,
    GeometricMedian,
    HierarchicalAggregator,
    Krum,
    Mean,
    Median,
    NoiseAwareFilter,
    RSAMaster,
    SelfCenteredClipping,
    TrimmedMean,
    ZenoPlusPlus,
    metropolis_hastings_weights,
    prob_always_with_byzantine,
    rsa_sign,
    rsa_worker_step,
    share_tolerance,
)
from sharefl.robust.noise_filter import ks_pvalue, ks_statistic


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# ------------------------------------------------------------------ SHARE


SUMS = t([[1.0, 2.0], [3.0, 0.0], [2.0, 4.0], [100.0, -50.0]])
SIZES = [3, 2, 3, 4]


def test_lemma1_mean_over_cluster_sums_is_fedavg() -> None:
    total = HierarchicalAggregator(rule=Mean())(SUMS)
    torch.testing.assert_close(total, SUMS.sum(dim=0))
    mean = HierarchicalAggregator(rule=Mean(), scale=ClusterScale.MEAN)(SUMS, SIZES)
    torch.testing.assert_close(mean, SUMS.sum(dim=0) / sum(SIZES))


def test_scale_conventions_for_a_robust_rule() -> None:
    rule = Median(f=1)
    total = HierarchicalAggregator(rule=rule)(SUMS)
    torch.testing.assert_close(total, 4 * rule(SUMS))  # c = 4 clusters
    mean = HierarchicalAggregator(rule=rule, scale="mean")(SUMS, torch.tensor(SIZES))
    torch.testing.assert_close(mean, rule(SUMS / t(SIZES)[:, None]))
    # weights = cluster sizes for rules that take weights
    gm = HierarchicalAggregator(rule=GeometricMedian(), scale="mean")(SUMS, SIZES)
    torch.testing.assert_close(gm, GeometricMedian()(SUMS / t(SIZES)[:, None], t(SIZES)))


def test_zeno_in_the_hierarchy_sums_accepted_clusters() -> None:
    grad = t([-1.0, 0.0])  # accepts clusters moving along +x (descent on <grad, x>)
    zeno = ZenoPlusPlus(lr=1.0, rho=1e-2, epsilon=0.0)
    accepted = zeno.accepted(SUMS, grad)
    assert accepted.tolist() == [True, True, True, False]  # 100 - 1e-2 * 12500 < 0
    total = HierarchicalAggregator(rule=zeno)(SUMS, validation_grad=grad)
    torch.testing.assert_close(total, SUMS[:3].sum(dim=0))
    mean = HierarchicalAggregator(rule=zeno, scale="mean")(SUMS, SIZES, validation_grad=grad)
    torch.testing.assert_close(mean, SUMS[:3].sum(dim=0) / 12)
    assert HierarchicalAggregator(rule=zeno).tolerance is None
    assert HierarchicalAggregator(rule=Krum(f=1)).tolerance == 1


def test_reclustering_rounds_are_averaged() -> None:
    rounds = [SUMS, SUMS.flip(0) * 2, SUMS + 1]
    hier = HierarchicalAggregator(rule=TrimmedMean(f=1))
    expected = torch.stack([hier(r) for r in rounds]).mean(dim=0)
    torch.testing.assert_close(hier.average(rounds), expected)
    calls = []

    def validation_grad() -> torch.Tensor:  # a fresh batch per reclustering (Algorithm 2)
        calls.append(1)
        return t([-1.0, 0.0])

    HierarchicalAggregator(rule=ZenoPlusPlus()).average(rounds, validation_grad=validation_grad)
    assert len(calls) == 3
    mean = HierarchicalAggregator(rule=Mean(), scale="mean")
    torch.testing.assert_close(
        mean.average([SUMS, SUMS], [SIZES, SIZES]), SUMS.sum(dim=0) / sum(SIZES)
    )


def test_lemma2_tolerance_and_appendix_e() -> None:
    assert share_tolerance(40, 3) == pytest.approx(40 / 3)  # the paper's example: 13.3 > 12
    assert math.floor(share_tolerance(40, 3)) == 13
    assert prob_always_with_byzantine(60, 12, 3, 1) == pytest.approx(0.368, abs=1e-3)
    assert prob_always_with_byzantine(60, 12, 3, 10) == pytest.approx(4.6e-5, rel=0.05)
    assert prob_always_with_byzantine(60, 12, 10, 10) == pytest.approx(0.32, abs=0.01)


def test_hierarchical_errors() -> None:
    with pytest.raises(AggregationError, match="cluster sizes"):
        HierarchicalAggregator(rule=Median(), scale="mean")(SUMS)
    with pytest.raises(AggregationError, match="positive client counts"):
        HierarchicalAggregator(rule=Median(), scale="mean")(SUMS, [1, 2])
    with pytest.raises(AggregationError, match="an Aggregator, a Pipeline or ZenoPlusPlus"):
        HierarchicalAggregator(rule=lambda X: X.mean(0))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        HierarchicalAggregator(rule=Median(), scale="median")  # type: ignore[arg-type]
    with pytest.raises(AggregationError):
        HierarchicalAggregator(rule=Median()).average([])
    with pytest.raises(AggregationError):
        share_tolerance(3, 0)


def test_zeno_scores_by_hand() -> None:
    X = t([[1.0, 0.0], [0.0, 2.0], [math.nan, 0.0]])
    grad = t([-2.0, 1.0])
    zeno = ZenoPlusPlus(lr=0.5, rho=0.1, epsilon=0.3)
    # -0.5 <g, x> - 0.1 |x|^2: [1 - 0.1, -1 - 0.4, nan]
    scores = zeno.scores(X, grad)
    torch.testing.assert_close(scores[:2], t([0.9, -1.4]))
    assert math.isnan(scores[2])
    torch.testing.assert_close(zeno(X, grad), t([1.0, 0.0]))  # threshold -0.15
    torch.testing.assert_close(zeno(X, lambda: grad), t([1.0, 0.0]))
    assert torch.equal(zeno(X[1:2], grad), torch.zeros(2, dtype=torch.float64))
    with pytest.raises(AggregationError, match="validation_grad"):
        zeno(X, torch.zeros(3))
    with pytest.raises(AggregationError):
        ZenoPlusPlus(rho=-1.0)


# ------------------------------------------------------------------ noise-aware filter


def test_ks_statistic_and_pvalue_match_scipy() -> None:
    rng = np.random.default_rng(0)
    for d, scale in ((50, 0.3), (2000, 0.3), (2000, 0.5)):
        x = rng.normal(0.0, scale, size=d)
        ref = stats.kstest(x, "norm", args=(0.0, 0.3))
        assert ks_statistic(torch.from_numpy(x), 0.3) == pytest.approx(ref.statistic, rel=1e-12)
        assert ks_pvalue(ref.statistic, d) == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-300)


def test_first_stage_accepts_noise_and_rejects_the_rest() -> None:
    g = torch.Generator().manual_seed(0)
    sigma, b, d = 0.8, 16, 20_000
    s = sigma / b
    flt = NoiseAwareFilter(noise_multiplier=sigma, batch_size=b, honest_fraction=0.5)
    lo, hi = flt.norm_bounds(d)
    assert lo == pytest.approx(s * s * (d - 3 * math.sqrt(2 * d)))
    assert hi == pytest.approx(s * s * (d + 3 * math.sqrt(2 * d)))
    honest = torch.randn(6, d, generator=g) * s
    uniform = (torch.rand(1, d, generator=g) - 0.5) * s * math.sqrt(12)  # same variance
    loud = torch.randn(1, d, generator=g) * 2 * s
    X = torch.cat([honest, uniform, loud, torch.zeros(1, d), torch.full((1, d), math.inf)])
    passed, pvalues = flt.first_stage_tests(X, (X.double() ** 2).sum(dim=1))
    assert passed[:6].all()  # seeded: all six honest uploads pass
    assert not passed[6:].any()
    assert pvalues[6] < 1e-6  # the uniform upload passes the norm test and fails KS
    assert math.isnan(pvalues[7])  # the loud one fails the norm test first


def test_second_stage_by_hand() -> None:
    # first stage off; gamma = 0.5 of 4 workers: select 2 per round
    flt = NoiseAwareFilter(noise_multiplier=1.0, honest_fraction=0.5, first_stage=False)
    X = t([[1.0, 0.0], [2.0, 0.0], [-1.0, 0.0], [0.5, 0.5]])
    aux = t([1.0, 0.0])
    r = flt.filter(X, aux)
    # scores 1, 2, -1, 0.5; mean of the top 2 is 1.5: only worker 1 keeps its score
    torch.testing.assert_close(r.scores, t([0.0, 2.0, 0.0, 0.0]))
    assert r.selected.tolist() == [1, 0]  # tie at 0 broken by the lower index
    torch.testing.assert_close(r.aggregate, (X[1] + X[0]) / 4)  # divided by n (line 15)
    r2 = flt.filter(t([[3.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]), aux)
    torch.testing.assert_close(r2.cumulative, t([3.0, 2.0, 0.0, 0.0]))
    assert r2.selected.tolist() == [0, 1] and flt.state.rounds == 2


def test_filter_variants() -> None:
    X = t([[1.0, 0.0], [2.0, 0.0], [-1.0, 0.0], [0.0, 3.0]])
    aux = t([2.0, 0.0])
    cosine = NoiseAwareFilter(
        noise_multiplier=1.0,
        honest_fraction=0.75,
        first_stage=False,
        score="cosine",
        normalize="selected",
        top_k="floor",
    )
    r = cosine.filter(X, aux)
    # cosines 1, 1, -1, 0; top 3 mean 2/3: workers 0 and 1 keep 1
    torch.testing.assert_close(r.scores, t([1.0, 1.0, 0.0, 0.0]))
    assert r.selected.tolist() == [0, 1, 2]
    torch.testing.assert_close(r.aggregate, X[:3].sum(dim=0) / 3)
    momentum = NoiseAwareFilter(
        noise_multiplier=1.0, honest_fraction=0.5, first_stage=False, server_momentum=0.9
    )
    momentum(X, aux)
    torch.testing.assert_close(momentum.state.momentum, 0.1 * aux)
    momentum(X, t([0.0, 1.0]))
    torch.testing.assert_close(momentum.state.momentum, 0.09 * aux + 0.1 * t([0.0, 1.0]))


def test_filter_rejects_nonfinite_uploads_and_checks_its_state() -> None:
    flt = NoiseAwareFilter(noise_multiplier=1.0, honest_fraction=0.5, first_stage=False)
    X = t([[1.0, 0.0], [math.inf, 0.0], [math.nan, 1.0], [2.0, 0.0]])
    r = flt.filter(X, t([1.0, 0.0]))
    assert r.passed.tolist() == [True, False, False, True]
    assert torch.isfinite(r.aggregate).all()
    with pytest.raises(AggregationError, match="workers"):
        flt(torch.zeros(3, 2), t([1.0, 0.0]))
    for bad in (
        {"honest_fraction": 0.0},
        {"honest_fraction": 0.5, "ks_alpha": 1.5},
        {"honest_fraction": 0.5, "server_momentum": 1.0},
        {"honest_fraction": 0.5, "score": "dot"},
        {"honest_fraction": 0.5, "batch_size": 0},
    ):
        with pytest.raises(AggregationError):
            NoiseAwareFilter(noise_multiplier=1.0, **bad)


def test_filter_selects_honest_workers_under_olmp_like_attack() -> None:
    """End to end: DP-noised honest uploads around a signal, attackers pointing away."""
    g = torch.Generator().manual_seed(1)
    d, sigma, b = 4000, 1.0, 16
    s = sigma / b
    signal = torch.zeros(d)
    signal[:40] = 0.05
    flt = NoiseAwareFilter(noise_multiplier=sigma, batch_size=b, honest_fraction=0.4)
    for _ in range(5):
        honest = signal + torch.randn(4, d, generator=g) * s
        byz = (-honest.sum(dim=0) / 2).expand(6, d)  # OLMP: -Σ honest / sqrt(4)
        r = flt.filter(torch.cat([honest, byz]), signal)
    assert set(r.selected.tolist()) == {0, 1, 2, 3}


# ------------------------------------------------------------------ RSA / DP-RSA


def test_rsa_sign_convention() -> None:
    v = t([-2.0, 0.0, -0.0, 3.0, math.nan])
    assert rsa_sign(v).tolist() == [-1.0, 1.0, 1.0, 1.0, -1.0]
    assert rsa_sign(v.float()).dtype == torch.float32


def test_rsa_master_and_worker_steps() -> None:
    x0 = t([1.0, -1.0, 0.0])
    msgs = t([[1.0, 1.0, -1.0], [1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
    master = RSAMaster(lr=0.1, penalty=0.5, regularization=0.25)
    # x0 - 0.1 (2 * 0.25 x0 + 0.5 * [3, 1, -1])
    expected = x0 - 0.1 * (0.5 * x0 + 0.5 * t([3.0, 1.0, -1.0]))
    torch.testing.assert_close(master.step(x0, msgs), expected)
    # only the sum is needed: it composes with secure aggregation
    torch.testing.assert_close(master.step(x0, msgs.sum(dim=0)), expected)
    custom = RSAMaster(lr=0.1, penalty=0.5, regularizer_grad=lambda x: torch.zeros_like(x))
    torch.testing.assert_close(custom.step(x0, msgs), x0 - 0.05 * t([3.0, 1.0, -1.0]))
    with pytest.raises(AggregationError):
        master.step(x0, torch.ones(4))
    xk = t([0.5, -1.0, 2.0])
    message = rsa_sign(x0 - xk)
    assert message.tolist() == [1.0, 1.0, -1.0]
    step = rsa_worker_step(xk, t([1.0, 0.0, 0.0]), message, lr=0.1, penalty=0.5)
    torch.testing.assert_close(step, xk - 0.1 * (t([1.0, 0.0, 0.0]) - 0.5 * message))
    # the worker moves towards x0 by lr * penalty per coordinate when its gradient is 0
    moved = rsa_worker_step(xk, torch.zeros(3, dtype=torch.float64), message, lr=0.1, penalty=0.5)
    assert ((moved - xk) * (x0 - xk) >= 0).all()


def test_rsa_byzantine_influence_is_bounded_by_their_count() -> None:
    x0 = torch.zeros(5, dtype=torch.float64)
    honest = torch.ones(7, 5, dtype=torch.float64)
    master = RSAMaster(lr=0.1, penalty=0.2, regularization=0.0)
    clean = master.step(x0, honest)
    for byz in (torch.full((2, 5), -1.0), rsa_sign(torch.randn(2, 5, dtype=torch.float64))):
        moved = master.step(x0, torch.cat([honest, byz.double()])) - clean
        assert float(moved.abs().max()) <= 2 * 0.1 * 0.2 + 1e-12


# ------------------------------------------------------------------ decentralized


def test_metropolis_hastings_weights() -> None:
    path = torch.tensor([[0, 1, 0], [1, 0, 1], [0, 1, 0]])
    W = metropolis_hastings_weights(path)
    torch.testing.assert_close(W, t([[2 / 3, 1 / 3, 0], [1 / 3, 1 / 3, 1 / 3], [0, 1 / 3, 2 / 3]]))
    g = torch.Generator().manual_seed(0)
    A = torch.rand(12, 12, generator=g) < 0.7
    A = A | A.T
    W = metropolis_hastings_weights(A)
    torch.testing.assert_close(W, W.T)
    torch.testing.assert_close(W.sum(dim=1), torch.ones(12, dtype=torch.float64))
    with pytest.raises(AggregationError, match="symmetric"):
        metropolis_hastings_weights(torch.tensor([[0, 1], [0, 0]]))


def test_decentralized_trimmed_mean() -> None:
    own = t([0.0])
    received = t([[1.0], [2.0], [100.0], [-100.0]])
    torch.testing.assert_close(DecentralizedTrimmedMean(q=1)(own, received), t([1.0]))
    torch.testing.assert_close(DecentralizedTrimmedMean(q=2)(own, received), own)
    torch.testing.assert_close(DecentralizedTrimmedMean(q=0)(own, received), t([3 / 5]))
    with pytest.raises(AggregationError, match="lower q to at most 2"):
        DecentralizedTrimmedMean(q=3)(own, received)


@settings(max_examples=examples(40), deadline=None)
@given(
    honest=st.lists(st.floats(-10, 10), min_size=1, max_size=6),
    byz=st.lists(st.sampled_from([math.inf, -math.inf, math.nan, 1e9, -1e9]), max_size=3),
    own=st.floats(-10, 10),
)
def test_decentralized_trimmed_mean_stays_in_the_honest_range(honest, byz, own) -> None:
    q = len(byz)
    received = t([[v] for v in honest + byz])
    if received.shape[0] < 2 * q:
        return
    out = float(DecentralizedTrimmedMean(q=q)(t([own]), received)[0])
    values = [*honest, own]
    assert min(values) - 1e-9 <= out <= max(values) + 1e-9


def test_self_centered_clipping() -> None:
    own = t([0.0, 0.0])
    received = t([[3.0, 0.0], [0.5, 0.0], [math.inf, 0.0]])
    out = SelfCenteredClipping(tau=1.0)(own, received, t([0.25, 0.25, 0.25]))
    torch.testing.assert_close(out, t([0.375, 0.0]))
    uniform = SelfCenteredClipping(tau=1.0)(own, received[:2])
    torch.testing.assert_close(uniform, t([0.5, 0.0]))
    with pytest.raises(AggregationError, match="sum to at most 1"):
        SelfCenteredClipping(tau=1.0)(own, received, t([0.5, 0.5, 0.5]))


def test_ios() -> None:
    own = t([0.0])
    received = t([[1.0], [-1.0], [10.0]])
    # mean 2.5; 10 is the farthest neighbour; the rest averages to 0
    torch.testing.assert_close(IOS(q=1)(own, received), t([0.0]))
    torch.testing.assert_close(IOS(q=0)(own, received), t([2.5]))
    received = t([[1.0], [math.nan], [-1.0], [math.inf]])
    torch.testing.assert_close(IOS(q=2)(own, received), t([0.0]))
    weighted = IOS(q=1)(own, t([[1.0], [3.0], [50.0]]), t([0.2, 0.2, 0.1]))
    torch.testing.assert_close(weighted, t([(0.2 + 0.6) / 0.9]))
    with pytest.raises(AggregationError, match="lower q"):
        IOS(q=4)(own, t([[1.0], [2.0]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_paper_rules_keep_dtype_and_leave_inputs_unchanged(dtype) -> None:
    g = torch.Generator().manual_seed(7)
    X = torch.randn(8, 64, generator=g).to(dtype)
    v = torch.randn(64, generator=g).to(dtype)
    before_X, before_v = X.clone(), v.clone()
    outputs = [
        HierarchicalAggregator(rule=TrimmedMean(f=2))(X),
        HierarchicalAggregator(rule=GeometricMedian(), scale="mean")(X, [3] * 8),
        ZenoPlusPlus(rho=1e-3, epsilon=10.0)(X, v),
        NoiseAwareFilter(noise_multiplier=16.0, honest_fraction=0.5)(X, v),
        DecentralizedTrimmedMean(q=2)(v, X),
        SelfCenteredClipping(tau=1.0)(v, X),
        IOS(q=2)(v, X),
        RSAMaster().step(v, rsa_sign(X)),
    ]
    for out in outputs:
        assert out.dtype == dtype and out.shape == (64,)
        assert torch.isfinite(out.float()).all()
    assert torch.equal(X, before_X) and torch.equal(v, before_v)
