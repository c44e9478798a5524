"""Properties and exact cases of the aggregators and pre-aggregators of sharefl.robust."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from conftest import examples
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sharefl.robust import (
    MDA,
    NNM,
    AggregationError,
    Aggregator,
    Bucketing,
    CenteredClipping,
    CenteredClippingState,
    Clipping,
    GeometricMedian,
    Krum,
    MeaMed,
    Mean,
    Median,
    MultiKrum,
    Pipeline,
    TrimmedMean,
    TrMean,
    pairwise_sq_distances,
    weiszfeld,
)

PROPERTY = settings(max_examples=examples(40), deadline=None)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads and signed zeros included)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(width), b.contiguous().view(width))


# ------------------------------------------------------------------ the rules under test


@dataclass(frozen=True)
class Rule:
    """How to build a rule for n rows, and which properties it has."""

    name: str
    build: Callable[[int, int], Aggregator]  # (n, f) -> rule
    max_f: Callable[[int], int]
    min_rows: int
    # bitwise equal under row permutation (selections and sorted sums); the others sum
    # rows in input order and agree up to rounding
    exact_permutation: bool = True
    translation: bool = True
    survives_nonfinite: bool = True
    # translation keeps exact ties exact; a pipeline of two selections breaks ties on
    # rounded intermediate values, so it is tested on tie-free (continuous) data only
    ties_translate: bool = True


RULES = [
    Rule("Mean", lambda n, f: Mean(), lambda n: 0, 1, False, True, False),
    Rule("Median", lambda n, f: Median(f=f), lambda n: (n - 1) // 2, 1),
    Rule("TrimmedMean", lambda n, f: TrimmedMean(f=f), lambda n: (n - 1) // 2, 1),
    Rule("MeaMed", lambda n, f: MeaMed(f=f), lambda n: (n - 1) // 2, 1),
    Rule("Krum", lambda n, f: Krum(f=f), lambda n: (n - 3) // 2, 3),
    Rule("MultiKrum", lambda n, f: MultiKrum(f=f), lambda n: (n - 3) // 2, 3, False),
    Rule("MDA", lambda n, f: MDA(f=f), lambda n: min(3, (n - 1) // 2), 1, False),
    Rule(
        "GeometricMedian",
        lambda n, f: GeometricMedian(f=f, tol=1e-12, max_iter=1000),
        lambda n: (n - 1) // 2,
        1,
        False,
    ),
    Rule(
        "CenteredClipping",
        lambda n, f: CenteredClipping(f=f, tau=5.0),
        lambda n: (n - 1) // 2,
        1,
        False,
        False,
    ),
    Rule(
        "NNM+MultiKrum",
        lambda n, f: Pipeline(aggregator=MultiKrum(f=f), pre=(NNM(f=f),)),  # type: ignore[arg-type]
        lambda n: (n - 3) // 2,
        3,
        False,
        ties_translate=False,
    ),
]
RULE_IDS = [r.name for r in RULES]

finite = st.floats(-100, 100, allow_nan=False, allow_infinity=False, allow_subnormal=False)


#: floats on a 2^-10 lattice: sums and translations of them are exact in float64, so a
#: translation keeps exact ties exact (with arbitrary floats, x + t can round two distinct
#: values to one, and tie-breaking legitimately changes)
lattice = st.integers(-100_000, 100_000).map(lambda k: k / 1024)


@st.composite
def cases(
    draw: st.DrawFn,
    rule: Rule,
    max_rows: int = 9,
    max_d: int = 4,
    ties: bool = True,
    values: st.SearchStrategy[float] = finite,
):
    """(X float64 [n, d], f) with n >= the rule's minimum."""
    n = draw(st.integers(rule.min_rows, max_rows))
    d = draw(st.integers(1, max_d))
    f = draw(st.integers(0, max(0, rule.max_f(n))))
    if not ties:  # generic data: Gaussian rows, no exact ties between distances
        seed = draw(st.integers(0, 2**32 - 1))
        g = torch.Generator().manual_seed(seed)
        return torch.randn(n, d, generator=g, dtype=torch.float64) * 10, f
    grid = draw(st.booleans())  # many ties on a coarse grid, or arbitrary floats
    entries = st.integers(-3, 3).map(float) if grid else values
    X = torch.tensor(draw(st.lists(entries, min_size=n * d, max_size=n * d)), dtype=torch.float64)
    return X.reshape(n, d), f


def tolerance(X: torch.Tensor) -> float:
    scale = float(X[torch.isfinite(X)].abs().max()) if torch.isfinite(X).any() else 1.0
    return 1e-6 * max(1.0, scale)


# ------------------------------------------------------------------ properties of every rule


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
@PROPERTY
@given(data=st.data())
def test_permutation_invariance(rule: Rule, data: st.DataObject) -> None:
    X, f = data.draw(cases(rule))
    perm = torch.tensor(data.draw(st.permutations(range(X.shape[0]))))
    out, permuted = rule.build(X.shape[0], f)(X), rule.build(X.shape[0], f)(X[perm])
    if rule.exact_permutation:  # the same values (rows differing in the sign of a zero tie)
        torch.testing.assert_close(out, permuted, rtol=0, atol=0, equal_nan=True)
    else:
        torch.testing.assert_close(out, permuted, atol=tolerance(X), rtol=1e-6)


@pytest.mark.parametrize("rule", [r for r in RULES if r.translation], ids=lambda r: r.name)
@PROPERTY
@given(data=st.data())
def test_translation_equivariance(rule: Rule, data: st.DataObject) -> None:
    X, f = data.draw(cases(rule, ties=rule.ties_translate, values=lattice))
    t = torch.tensor(data.draw(st.lists(lattice, min_size=X.shape[1], max_size=X.shape[1])))
    t = t.to(X.dtype) * data.draw(st.sampled_from([1.0, 1e3]))
    agg = rule.build(X.shape[0], f)
    solve = getattr(agg, "solve", None)
    if solve is not None:
        # An iterative rule is equivariant up to its tolerance once it converged; a case
        # whose median sits on a data point (e.g. [[0,3,3],[3,3,3],[0,0,0],[1,3,3]], found
        # by the search) may not converge within max_iter, and then nothing is promised.
        assume(solve(X).converged and solve(X + t).converged)
    torch.testing.assert_close(agg(X + t), agg(X) + t, atol=tolerance(X + t) * 10, rtol=1e-6)


def test_centered_clipping_is_translation_equivariant_with_its_state() -> None:
    X = torch.randn(7, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([100.0, -50.0, 3.0], dtype=torch.float64)
    start = torch.tensor([0.5, 0.1, -0.2], dtype=torch.float64)
    a = CenteredClipping(tau=0.7, iterations=2, state=CenteredClippingState(start.clone()))
    b = CenteredClipping(tau=0.7, iterations=2, state=CenteredClippingState(start + t))
    torch.testing.assert_close(b(X + t), a(X) + t)


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
@PROPERTY
@given(data=st.data())
def test_all_rows_equal_gives_that_row(rule: Rule, data: st.DataObject) -> None:
    X, f = data.draw(cases(rule))
    row = X[0]
    out = rule.build(X.shape[0], f)(row.expand_as(X).clone())
    if rule.name in ("Median", "Krum"):  # selections: bitwise the row
        assert bits_equal(out, row.clone())
    elif rule.name == "CenteredClipping":  # one step from 0: the row clipped to norm 5
        norm = float(row.norm())
        torch.testing.assert_close(out, row * min(1.0, 5.0 / norm) if norm else row)
    else:
        torch.testing.assert_close(out, row, atol=1e-9, rtol=1e-12)


byzantine_value = st.one_of(
    finite.map(lambda v: v * 1e6),
    st.sampled_from([math.inf, -math.inf, math.nan, 1e300, -1e300]),
)


def smallest_n_with_f1(rule: Rule) -> int:
    return next(n for n in range(rule.min_rows, 50) if rule.max_f(n) >= 1)


@st.composite
def attacked(draw: st.DrawFn, rule: Rule):
    """(X, f, honest rows) with f >= 1 arbitrary rows, ±inf and NaN included."""
    n = draw(st.integers(smallest_n_with_f1(rule), 10))
    f = draw(st.integers(1, rule.max_f(n)))
    d = draw(st.integers(1, 4))
    honest = torch.tensor(
        draw(st.lists(finite, min_size=(n - f) * d, max_size=(n - f) * d)), dtype=torch.float64
    ).reshape(n - f, d)
    byz = torch.tensor(
        draw(st.lists(byzantine_value, min_size=f * d, max_size=f * d)), dtype=torch.float64
    ).reshape(f, d)
    rows = torch.cat([honest, byz])
    perm = torch.tensor(draw(st.permutations(range(n))))
    return rows[perm], f, honest


def diameter(H: torch.Tensor) -> float:
    return float(torch.cdist(H, H).max()) if H.shape[0] > 1 else 0.0


@pytest.mark.parametrize("rule", [r for r in RULES if r.survives_nonfinite], ids=lambda r: r.name)
@PROPERTY
@given(data=st.data())
def test_bounded_by_honest_rows_under_attack(rule: Rule, data: st.DataObject) -> None:
    X, f, H = data.draw(attacked(rule))
    n = X.shape[0]
    out = rule.build(n, f)(X)
    assert torch.isfinite(out).all()
    lo, hi = H.min(dim=0).values, H.max(dim=0).values
    width, diam, eps = hi - lo, diameter(H), 1e-6 * (1 + float(H.abs().max()))
    centre = H.mean(dim=0)
    radius = float((H - centre).norm(dim=1).max())
    if rule.name in ("Median", "TrimmedMean"):
        assert bool(((out >= lo - eps) & (out <= hi + eps)).all())
    elif rule.name == "MeaMed":
        assert bool(((out >= lo - width - eps) & (out <= hi + width + eps)).all())
    elif rule.name == "Krum":
        k = n - f - 2
        nearest = float((H - out).norm(dim=1).min())
        assert nearest <= diam * math.sqrt(k / (n - 2 * f - 1)) + eps
    elif rule.name in ("MultiKrum", "NNM+MultiKrum"):
        k = n - f - 2
        reach = diam * math.sqrt(k / (n - 2 * f - 1))
        assert float((out - centre).norm()) <= 2 * diam + reach + eps
    elif rule.name == "MDA":
        assert float((out - centre).norm()) <= 2 * diam + eps
    elif rule.name == "GeometricMedian":
        alpha = f / n
        bound = 2 * (1 - alpha) / (1 - 2 * alpha) * radius
        assert float((out - centre).norm()) <= bound + eps + 1e-4 * (1 + radius)
    elif rule.name == "CenteredClipping":
        # one step from 0: (1/n) Σ clip(x_i, 5); an arbitrary row adds at most 5 / n
        honest_part = Clipping(threshold=5.0)(H).sum(dim=0) / n
        assert float((out - honest_part).norm()) <= f * 5.0 / n + eps


# ------------------------------------------------------------------ dtype, device, inputs


ALL_BUILDERS: list[tuple[str, Callable[[], Callable[[torch.Tensor], torch.Tensor]]]] = [
    ("Mean", lambda: Mean()),
    ("Median", lambda: Median(f=2)),
    ("TrimmedMean", lambda: TrimmedMean(f=2)),
    ("MeaMed", lambda: MeaMed(f=2)),
    ("Krum", lambda: Krum(f=2)),
    ("MultiKrum", lambda: MultiKrum(f=2, m=3)),
    ("MDA", lambda: MDA(f=2)),
    ("GeometricMedian", lambda: GeometricMedian(f=2)),
    ("CenteredClipping", lambda: CenteredClipping(f=2, tau=1.0)),
    ("Clipping", lambda: Clipping(threshold=1.0)),
    ("NNM", lambda: NNM(f=2)),
    ("Bucketing", lambda: Bucketing(bucket_size=2, generator=torch.Generator().manual_seed(1))),
]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("name", "build"), ALL_BUILDERS, ids=[b[0] for b in ALL_BUILDERS])
def test_dtype_and_device_kept_and_input_unchanged(name, build, dtype, device) -> None:
    g = torch.Generator().manual_seed(3)
    X = torch.randn(9, 33, generator=g).to(device=device, dtype=dtype)
    X[8] = float("nan") if name not in ("Mean", "Clipping", "NNM", "Bucketing") else X[8]
    before = X.clone()
    out = build()(X)
    assert out.dtype == dtype and out.device.type == device
    assert bits_equal(X, before)
    reference = build()(X.to(torch.float64).cpu())
    assert out.shape == reference.shape
    tol = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}
    torch.testing.assert_close(
        out.cpu().to(torch.float64), reference, atol=tol[dtype], rtol=tol[dtype], equal_nan=True
    )


def test_non_contiguous_input() -> None:
    X = torch.randn(40, 7, dtype=torch.float64).T  # a [7, 40] strided view
    for rule in (Median(f=2), TrimmedMean(f=1), MeaMed(f=2), Krum(f=1), GeometricMedian()):
        torch.testing.assert_close(rule(X), rule(X.contiguous()), atol=1e-12, rtol=0)


def test_wide_input_crosses_blocks_and_threads() -> None:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(11, 70_001, generator=g)
    ref = torch.from_numpy(np.median(X.numpy(), axis=0))
    torch.testing.assert_close(Median(f=5)(X), ref)
    s = X.sort(dim=0).values
    torch.testing.assert_close(TrimmedMean(f=3)(X), s[3:8].mean(dim=0), atol=1e-6, rtol=1e-6)


def test_empty_columns() -> None:
    X = torch.empty(5, 0)
    for rule in (Mean(), Median(f=2), TrimmedMean(f=1), Krum(f=1), GeometricMedian()):
        assert rule(X).shape == (0,)


# ------------------------------------------------------------------ exact small cases


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def test_mean_weighted() -> None:
    X = t([[1.0, 2.0], [3.0, 6.0]])
    torch.testing.assert_close(Mean()(X), t([2.0, 4.0]))
    torch.testing.assert_close(Mean()(X, weights=torch.tensor([3.0, 1.0])), t([1.5, 3.0]))


def test_median_exact() -> None:
    torch.testing.assert_close(Median(f=1)(t([[1, 5], [2, 3], [10, 4]])), t([2, 4]))
    # even n: the average of the two middle values (torch.median would give the lower)
    torch.testing.assert_close(Median(f=1)(t([[1], [2], [4], [100]])), t([3.0]))
    torch.testing.assert_close(Median(f=1)(t([[1], [math.inf], [3]])), t([3.0]))
    torch.testing.assert_close(Median(f=1)(t([[1], [math.nan], [3]])), t([3.0]))


def test_trimmed_mean_exact() -> None:
    torch.testing.assert_close(TrimmedMean(f=1)(t([[1], [2], [3], [100]])), t([2.5]))
    torch.testing.assert_close(TrimmedMean(f=0)(t([[1], [2], [6]])), t([3.0]))
    X = t([[-math.inf, 0], [1, math.nan], [2, 1], [3, 2], [math.inf, 3]])
    torch.testing.assert_close(TrimmedMean(f=1)(X), t([2.0, 2.0]))
    assert TrMean is TrimmedMean


def test_meamed_exact() -> None:
    # median 2; the three nearest are 0, 1, 2
    torch.testing.assert_close(MeaMed(f=2)(t([[0], [1], [2], [10], [11]])), t([1.0]))
    # median 0; -1 and 1 tie for the last place: the smaller is kept
    torch.testing.assert_close(MeaMed(f=1)(t([[-1], [0], [1]])), t([-0.5]))
    torch.testing.assert_close(MeaMed(f=1)(t([[1], [0], [-1]])), t([-0.5]))
    torch.testing.assert_close(MeaMed(f=2)(t([[5], [6], [7], [math.nan], [-math.inf]])), t([6.0]))


def test_krum_and_multikrum_exact() -> None:
    X = t([[0.0], [1.0], [2.0], [10.0], [100.0]])
    # n = 5, f = 1: each score sums the 2 nearest squared distances: 5, 2, 5, 145, ...
    torch.testing.assert_close(Krum(f=1)(X), t([1.0]))
    torch.testing.assert_close(MultiKrum(f=1, m=3)(X), t([1.0]))
    torch.testing.assert_close(MultiKrum(f=1, m=1)(X), t([1.0]))
    # m = n - f = 4 by default: 0, 1, 2 and 10 (score 145 < 100's)
    torch.testing.assert_close(MultiKrum(f=1)(X), t([13 / 4]))
    # a tie (rows 0 and 2 score 5): broken by the canonical (lexicographic) order
    torch.testing.assert_close(MultiKrum(f=1, m=2)(X), t([0.5]))
    torch.testing.assert_close(MultiKrum(f=1, m=2)(X.flip(0)), t([0.5]))


def test_krum_ignores_nonfinite_rows() -> None:
    honest = t([[0.0, 0.0], [0.1, 0.0], [0.0, 0.1], [0.1, 0.1], [0.2, 0.0]])
    bad = t([[math.inf, 0.0], [math.nan, 1.0]])
    X = torch.cat([bad[:1], honest, bad[1:]])
    assert honest.eq(Krum(f=2)(X)).all(dim=1).any()
    torch.testing.assert_close(MultiKrum(f=2)(X), honest.mean(dim=0))


def test_distances_are_centred_for_far_data() -> None:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(12, 500, generator=g, dtype=torch.float64) * 1e-3
    far = X + 1e4  # squared norms 5e13 times the squared distances
    torch.testing.assert_close(
        pairwise_sq_distances(far), torch.cdist(X, X) ** 2, rtol=1e-9, atol=0
    )
    torch.testing.assert_close(Krum(f=3)(far) - 1e4, Krum(f=3)(X), rtol=0, atol=1e-9)
    torch.testing.assert_close(MultiKrum(f=3)(far) - 1e4, MultiKrum(f=3)(X), rtol=0, atol=1e-9)


def test_mda_exact() -> None:
    X = t([[0.0], [1.0], [3.0], [10.0]])
    torch.testing.assert_close(MDA(f=1)(X), t([4 / 3]))
    torch.testing.assert_close(MDA(f=0)(X), t([3.5]))
    # two far rows, one duplicated honest point
    X = t([[0, 0], [0, 0], [1, 0], [50, 50], [-50, 50]])
    torch.testing.assert_close(MDA(f=2)(X), t([1 / 3, 0]))


def test_mda_matches_brute_force() -> None:
    import itertools

    g = torch.Generator().manual_seed(5)
    for _ in range(20):
        X = torch.randn(8, 3, generator=g, dtype=torch.float64)
        D = torch.cdist(X, X)
        subsets = [list(s) for s in itertools.combinations(range(8), 6)]
        diameters = [float(D[s][:, s].max()) for s in subsets]
        optimal = [s for s, dia in zip(subsets, diameters, strict=True) if dia == min(diameters)]
        out = MDA(f=2)(X)
        assert any(torch.allclose(out, X[s].mean(dim=0)) for s in optimal)


def test_mda_search_budget() -> None:
    X = torch.randn(30, 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(AggregationError, match="max_search_nodes"):
        MDA(f=10, max_search_nodes=3)(X)


def test_geometric_median_of_collinear_points_is_the_median() -> None:
    out = GeometricMedian(nu=1e-9, tol=1e-12)(t([[0.0], [1.0], [5.0]]))
    torch.testing.assert_close(out, t([1.0]), atol=1e-6, rtol=0)


@settings(max_examples=examples(25), deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(3, 12), d=st.integers(2, 6))
def test_geometric_median_optimality_condition(seed: int, n: int, d: int) -> None:
    """0 is in the subdifferential of Σ w_i ‖x_i - z‖ at the result: away from the points
    the weighted unit vectors towards them cancel; at a point x_k, the others' pull is at
    most w_k. Near a point the iteration converges sublinearly: after 5,000 updates the
    residual pull stays below 2e-4 of the total weight (largest seen over 21,000 draws:
    8.6e-5)."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    w = torch.rand(n, generator=g, dtype=torch.float64) + 0.1
    result = weiszfeld(X, w, nu=1e-12, tol=1e-14, max_iter=5000)
    z = result.median
    dist = (X - z).norm(dim=1)
    at_point = dist < 1e-7
    others = ~at_point
    pull = ((w[others] / dist[others])[:, None] * (z - X[others])).sum(dim=0)
    slack = float(w[at_point].sum()) if at_point.any() else 0.0
    assert float(pull.norm()) <= slack + 2e-4 * float(w.sum())
    assert result.objective == pytest.approx(float((w * dist).sum()), rel=1e-9)


def test_weiszfeld_returns_a_data_point_that_is_the_exact_median() -> None:
    """A heavy point is the minimiser (the others pull with 1 + 1 + 1 < 5): one update
    leaves the iterate near it; the final vertex test returns it exactly, converged."""
    X = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    w = torch.tensor([5.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    result = weiszfeld(X, w, nu=1e-12, tol=0.0, max_iter=1)
    assert result.converged
    assert torch.equal(result.median, X[0])
    assert result.objective == pytest.approx(2 + math.sqrt(2), rel=1e-12)
    # the median of a kite is no data point: the nearest point is not returned
    kite = torch.tensor([[2.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]], dtype=torch.float64)
    early = weiszfeld(kite, torch.ones(4), nu=1e-12, tol=0.0, max_iter=1)
    assert not early.converged and not any(torch.equal(early.median, x) for x in kite)


def test_weiszfeld_reports_iterations_and_converges_fast_on_gaussian_data() -> None:
    X = torch.randn(50, 1000, generator=torch.Generator().manual_seed(0))
    result = GeometricMedian(tol=1e-6).solve(X)
    assert result.converged and 1 <= result.iterations <= 10
    assert torch.isnan(weiszfeld(torch.full((3, 2), math.nan)).median).all()


def test_centered_clipping_exact_and_stateful() -> None:
    cc = CenteredClipping(tau=1.0)
    torch.testing.assert_close(cc(t([[3.0, 0.0], [0.0, 0.0]])), t([0.5, 0.0]))
    torch.testing.assert_close(cc.state.center, t([0.5, 0.0]))
    # second round starts at the stored centre: clip([3, 0] - [0.5, 0]) = [1, 0]
    torch.testing.assert_close(cc(t([[3.0, 0.0], [0.5, 0.0]])), t([1.0, 0.0]))
    cc.state.center = None
    torch.testing.assert_close(cc(t([[3.0, 0.0], [0.0, 0.0]])), t([0.5, 0.0]))
    # an infinite row contributes nothing
    out = CenteredClipping(f=1, tau=1.0)(t([[3.0, 0.0], [0.0, 0.0], [math.inf, 1.0]]))
    torch.testing.assert_close(out, t([1 / 3, 0.0]))


def test_clipping_exact() -> None:
    out = Clipping(threshold=1.0)(t([[3.0, 4.0], [0.3, 0.4], [math.nan, 0.0]]))
    torch.testing.assert_close(out, t([[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]]))


def test_nnm_exact_and_equivariant() -> None:
    X = t([[0.0], [1.0], [10.0]])
    torch.testing.assert_close(NNM(f=1)(X), t([[0.5], [0.5], [5.5]]))
    perm = torch.tensor([2, 0, 1])
    torch.testing.assert_close(NNM(f=1)(X[perm]), NNM(f=1)(X)[perm])
    X = t([[0.0], [1.0], [math.inf], [2.0], [3.0]])
    out = NNM(f=1)(X)
    assert math.isinf(out[2, 0]) and torch.isfinite(out[[0, 1, 3, 4]]).all()
    torch.testing.assert_close(out[0], t([1.5]))


def test_bucketing_reproducible_and_order_free() -> None:
    X = torch.arange(14, dtype=torch.float64).reshape(7, 2)
    a = Bucketing(bucket_size=3, generator=torch.Generator().manual_seed(4))(X)
    b = Bucketing(bucket_size=3, generator=torch.Generator().manual_seed(4))(X.flip(0))
    assert a.shape == (3, 2)
    torch.testing.assert_close(a, b)
    # every row lands in exactly one bucket: bucket sizes 3, 3, 1
    sizes = torch.tensor([3.0, 3.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close((a * sizes[:, None]).sum(dim=0), X.sum(dim=0))


def test_pipeline_applies_steps_in_order() -> None:
    X = t([[0.0], [1.0], [2.0], [3.0], [100.0]])
    pipe = Pipeline(aggregator=Median(f=1), pre=(Clipping(threshold=2.5),))
    torch.testing.assert_close(pipe(X), t([2.0]))


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("rule", "n", "message"),
    [
        (Median(f=2), 4, r"Median\(f=2\) needs n >= 2f \+ 1 = 5 rows, got n = 4: lower f to"),
        (TrimmedMean(f=3), 6, r"lower f to at most 2"),
        (MeaMed(f=1), 2, r"at most 0"),
        (Krum(f=1), 4, r"Krum\(f=1\) needs n >= 2f \+ 3 = 5"),
        (Krum(f=0), 2, r"aggregate at least 3 updates"),
        (MultiKrum(f=2), 6, r"2f \+ 3 = 7"),
        (MDA(f=2), 4, r"MDA"),
        (GeometricMedian(f=1), 2, r"GeometricMedian"),
        (CenteredClipping(f=3), 5, r"CenteredClipping"),
    ],
)
def test_too_few_rows_raise(rule, n: int, message: str) -> None:
    with pytest.raises(AggregationError, match=message):
        rule(torch.zeros(n, 2))
    assert isinstance(AggregationError("x"), ValueError)


def test_bad_configurations_raise() -> None:
    for make in (
        lambda: Median(f=-1),
        lambda: Krum(f=1.5),  # type: ignore[arg-type]
        lambda: MultiKrum(f=1, m=0),
        lambda: GeometricMedian(nu=0.0),
        lambda: GeometricMedian(max_iter=-1),
        lambda: CenteredClipping(tau=-1.0),
        lambda: Clipping(threshold=0.0),
        lambda: Bucketing(bucket_size=0, generator=torch.Generator()),
        lambda: Bucketing(bucket_size=2, generator=0),  # type: ignore[arg-type]
        lambda: NNM(f=-2),
        lambda: MDA(max_search_nodes=0),
    ):
        with pytest.raises(AggregationError):
            make()
    with pytest.raises(AggregationError, match="lower m"):
        MultiKrum(f=1, m=5)(torch.zeros(5, 2))
    with pytest.raises(AggregationError, match="NNM"):
        NNM(f=2)(torch.zeros(4, 2))


@pytest.mark.parametrize(
    "X",
    [torch.zeros(5), torch.zeros(5, 2, dtype=torch.int64), torch.zeros(0, 3), np.zeros((3, 2))],
)
def test_bad_inputs_raise(X) -> None:
    with pytest.raises(AggregationError):
        Median()(X)


def test_bad_weights_raise() -> None:
    X = torch.zeros(3, 2)
    for w in (torch.ones(2), torch.tensor([1.0, -1.0, 1.0]), torch.zeros(3), [1, math.inf, 1]):
        with pytest.raises(AggregationError):
            Mean()(X, weights=w)
    with pytest.raises(AggregationError):
        GeometricMedian()(X, weights=torch.ones(4))
    state = CenteredClippingState(center=torch.zeros(3))
    with pytest.raises(AggregationError, match=r"state\.center"):
        CenteredClipping(state=state)(X)


def test_max_f_matches_the_row_condition() -> None:
    assert Median.max_f(5) == 2 and Krum.max_f(5) == 1 and Krum.max_f(2) == -1
    assert Median(f=2).min_rows() == 5 and MultiKrum(f=2).min_rows() == 7
