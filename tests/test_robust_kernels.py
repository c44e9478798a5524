"""The building blocks of sharefl.robust: column-block order statistics, the canonical row
order, row primitives and pairwise distances."""

from __future__ import annotations

import math
import os
import signal

import numpy as np
import pytest
import torch
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sharefl.robust import MeaMed, Median, TrimmedMean, pairwise_sq_distances
from sharefl.robust._columns import columnwise, columnwise_torch
from sharefl.robust._order import canonical_order, sortable_bits
from sharefl.robust._rows import combine_rows, gram, row_dots, row_sq_distances, weighted_sum
from sharefl.robust.coordinate import _meamed_reduce, _median_reduce, _trimmed_reduce

any_float = st.floats(allow_nan=True, allow_infinity=True, width=32)


@st.composite
def matrices(draw: st.DrawFn, values=any_float, max_rows: int = 9, max_d: int = 5):
    n = draw(st.integers(1, max_rows))
    d = draw(st.integers(1, max_d))
    data = draw(st.lists(values, min_size=n * d, max_size=n * d))
    return torch.tensor(data, dtype=torch.float32).reshape(n, d)


def same(a: torch.Tensor, b: torch.Tensor, scale: float) -> None:
    """Equal up to float32 summation-order rounding relative to the data's magnitude."""
    torch.testing.assert_close(a, b, equal_nan=True, rtol=1e-6, atol=1e-6 * scale)


@settings(max_examples=examples(60), deadline=None)
@given(X=matrices(), data=st.data())
def test_numpy_blocks_agree_with_the_torch_path(X: torch.Tensor, data: st.DataObject) -> None:
    """The cache-blocked CPU kernels and the torch.sort path (other devices) agree."""
    n = X.shape[0]
    f = data.draw(st.integers(0, (n - 1) // 2))
    finite = X[torch.isfinite(X)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    for reduce in (_median_reduce, _trimmed_reduce(f), _meamed_reduce(f)):
        same(columnwise(X, reduce), columnwise_torch(X, reduce), scale)


@settings(max_examples=examples(40), deadline=None)
@given(X=matrices(values=st.floats(-1e3, 1e3, width=32)))
def test_coordinate_rules_against_sorting(X: torch.Tensor) -> None:
    n = X.shape[0]
    s = X.double().sort(dim=0).values
    f = (n - 1) // 2
    lower, upper = s[(n - 1) // 2], s[n // 2]
    torch.testing.assert_close(Median(f=f)(X).double(), (lower + upper) / 2, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        TrimmedMean(f=f)(X).double(), s[f : n - f].mean(dim=0), rtol=1e-5, atol=1e-4
    )
    assert MeaMed(f=f)(X).shape == (X.shape[1],)


def test_sortable_bits_order_is_the_float_order() -> None:
    values = torch.tensor(
        [-math.inf, -3.5, -1e-40, -0.0, 0.0, 1e-45, 2.0, 3.4e38, math.inf], dtype=torch.float32
    )
    keys = sortable_bits(values)
    assert torch.equal(keys.sort().values, keys)
    assert keys[3] == keys[4]  # -0.0 sorts as +0.0: a translation by 0 turns one into the other
    assert len(set(keys.tolist())) == values.numel() - 1
    nan = sortable_bits(torch.tensor([math.nan]))
    assert nan > keys[-1]  # the canonical NaN ranks above +inf
    for dtype in (torch.float64, torch.float16, torch.bfloat16):
        assert torch.equal(
            sortable_bits(values.to(dtype)).sort().values, sortable_bits(values.to(dtype))
        )


@settings(max_examples=examples(60), deadline=None)
@given(X=matrices(values=st.integers(-2, 2).map(float), max_rows=12), data=st.data())
def test_canonical_order_is_lexicographic_and_order_free(X: torch.Tensor, data) -> None:
    order = canonical_order(X)
    rows = [tuple(r) for r in X[order].tolist()]
    assert rows == sorted(rows)
    perm = torch.tensor(data.draw(st.permutations(range(X.shape[0]))))
    assert torch.equal(X[perm][canonical_order(X[perm])], X[order])


def test_canonical_order_on_wide_identical_and_nan_rows() -> None:
    X = torch.zeros(4, 100_000)
    X[2, 99_999] = -1.0  # differs only in the last column: found by growing blocks
    X[3, 0] = math.nan
    assert canonical_order(X).tolist() == [2, 0, 1, 3]
    assert canonical_order(torch.zeros(1, 3)).tolist() == [0]


def test_row_primitives() -> None:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(6, 100_000, generator=g, dtype=torch.float64)
    z = torch.randn(100_000, generator=g, dtype=torch.float64)
    torch.testing.assert_close(row_sq_distances(X, z), ((X - z) ** 2).sum(dim=1))
    torch.testing.assert_close(row_dots(X, z), X @ z)
    rows = torch.tensor([0, 2, 5])
    W = torch.rand(2, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(combine_rows(X, W, rows), W @ X[rows])
    torch.testing.assert_close(combine_rows(X, W[0], rows), W[0] @ X[rows])
    order = torch.tensor([5, 0, 2])
    torch.testing.assert_close(gram(X[[0, 2, 5]], torch.tensor([2, 0, 1])), X[order] @ X[order].T)
    X[4, 3] = math.inf
    X[1, 7] = math.nan
    assert torch.isinf(row_sq_distances(X)[[1, 4]]).all()
    full = torch.zeros(2, 6, dtype=torch.float64)
    full[:, rows] = W
    # rows 1 and 4 are left out: their inf and NaN must not leak into the sums (0 * inf)
    torch.testing.assert_close(weighted_sum(X, full), W @ X[rows])
    full[1, 4] = 0.5  # a used non-finite row makes its own output non-finite, only that one
    out = weighted_sum(X, full)
    torch.testing.assert_close(out[0], W[0] @ X[rows])
    assert not torch.isfinite(out[1]).all()


def test_row_primitives_in_half_precision() -> None:
    X = torch.randn(5, 3000, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ref = X.double()
    z = ref[0]
    torch.testing.assert_close(row_sq_distances(X, z.to(torch.bfloat16)), ((ref - z) ** 2).sum(1))
    torch.testing.assert_close(row_dots(X, z), ref @ z, rtol=1e-3, atol=1e-3)
    w = torch.full((5,), 0.2, dtype=torch.float64)
    torch.testing.assert_close(weighted_sum(X, w).double(), w @ ref, rtol=1e-5, atol=1e-5)


def test_pairwise_distances() -> None:
    g = torch.Generator().manual_seed(1)
    X = torch.randn(7, 300, generator=g)
    torch.testing.assert_close(
        pairwise_sq_distances(X), torch.cdist(X.double(), X.double()) ** 2, rtol=1e-5, atol=1e-4
    )
    X[3, 0] = math.nan
    D = pairwise_sq_distances(X)
    assert torch.isinf(D[3, [0, 1, 2, 4, 5, 6]]).all() and torch.isinf(D[:, 3][:3]).all()
    assert float(D[3, 3]) == 0.0
    order = torch.tensor([6, 5, 4, 3, 2, 1, 0])
    # (equal up to rounding: BLAS rounds a Gram entry differently at another position,
    # which is why the selection rules always compute in canonical order)
    torch.testing.assert_close(
        pairwise_sq_distances(X, order), D.flip(0).flip(1), rtol=1e-6, atol=0
    )
    assert torch.equal(D, D.T)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float32_far_from_origin_is_centred(dtype) -> None:
    g = torch.Generator().manual_seed(2)
    X = torch.randn(9, 2_000, generator=g, dtype=dtype)
    exact = torch.cdist(X.double(), X.double()) ** 2
    torch.testing.assert_close(pairwise_sq_distances(X + 300), exact, rtol=1e-4, atol=1e-3)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_worker_threads_survive_fork() -> None:
    """A forked child (e.g. a data-loader worker) gets a fresh thread pool, not a dead one."""
    X = torch.randn(11, 300_000, generator=torch.Generator().manual_seed(0))
    expected = Median(f=5)(X)  # starts the parent's pool
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        signal.alarm(60)  # a hang fails the test instead of blocking the run
        # compare with numpy: torch's own OpenMP pool is not fork-safe once the parent used it
        ok = np.array_equal(Median(f=5)(X).numpy(), expected.numpy())
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
