"""sharefl.simulator.partition: coverage, determinism, label skew and errors of each scheme."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sharefl.simulator.partition import SCHEMES, PartitionError, partition


def balanced(per_class: int = 100, classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(classes), per_class))


def uneven(seed: int = 0) -> np.ndarray:
    """Classes of 50, 61, ..., 149 examples (1,000 in all), shuffled."""
    sizes = [50 + 11 * k for k in range(10)]
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(10), sizes))


def labels_per_client(y: np.ndarray, parts: list[np.ndarray]) -> list[int]:
    return [len(np.unique(y[p])) for p in parts]


def assert_disjoint_cover(parts: list[np.ndarray], n: int) -> None:
    joined = np.concatenate(parts)
    assert len(joined) == n
    assert np.array_equal(np.sort(joined), np.arange(n))


OPTIONS = {
    "iid": {},
    "dirichlet": {"alpha": 0.5},
    "shards": {"labels_per_client": 2},
    "dp_filter_weighted": {},
    "dp_rsa_shared_half": {},
    "fed_cdp_replicated_shards": {"shard_size": 50},
}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_deterministic_typed_and_seeded(scheme):
    y = uneven()
    a = partition(y, 20, scheme, seed=1, **OPTIONS[scheme])
    b = partition(torch.from_numpy(y), 20, scheme, seed=1, **OPTIONS[scheme])
    c = partition(y, 20, scheme, seed=2, **OPTIONS[scheme])
    assert len(a) == 20
    assert all(p.dtype == np.int64 and np.all(np.diff(p) >= 0) for p in a)
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    assert any(not np.array_equal(p, q) for p, q in zip(a, c, strict=True))


@pytest.mark.parametrize(
    "scheme", ["iid", "dirichlet", "shards", "dp_filter_weighted", "dp_rsa_shared_half"]
)
def test_disjoint_cover(scheme):
    y = uneven()
    assert_disjoint_cover(partition(y, 20, scheme, **OPTIONS[scheme]), len(y))


def test_iid_sizes():
    parts = partition(np.zeros(103, np.int64), 10)
    assert sorted(len(p) for p in parts) == [10] * 7 + [11] * 3


def test_dirichlet_skew_and_min_size():
    y = balanced()
    skewed = partition(y, 10, "dirichlet", alpha=0.05, min_size=5)
    flat = partition(y, 10, "dirichlet", alpha=1000.0)
    assert min(len(p) for p in skewed) >= 5
    assert np.mean(labels_per_client(y, skewed)) < 5
    assert labels_per_client(y, flat) == [10] * 10
    assert max(len(p) for p in flat) - min(len(p) for p in flat) < 40


def test_dirichlet_unreachable_min_size():
    with pytest.raises(PartitionError, match="min_size"):
        partition(balanced(), 10, "dirichlet", min_size=101)
    with pytest.raises(PartitionError, match="max_tries"):
        partition(balanced(), 50, "dirichlet", alpha=0.01, min_size=15, max_tries=3)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_shards_at_most_k_labels(k):
    y = uneven()
    parts = partition(y, 20, "shards", labels_per_client=k)
    assert max(labels_per_client(y, parts)) <= k
    assert_disjoint_cover(parts, len(y))


def test_shards_equal_classes_give_equal_shards():
    y = balanced(per_class=60)  # 600 examples, 100 clients × 2 shards of 3
    parts = partition(y, 100, "shards")
    assert {len(p) for p in parts} == {6}
    assert max(labels_per_client(y, parts)) <= 2


def test_seed000_chunks():
    y = uneven()
    parts = partition(y, 7, "dp_filter_weighted")
    size = math.ceil(len(y) / 7)
    assert [len(p) for p in parts] == [size] * 6 + [len(y) - 6 * size]
    assert_disjoint_cover(parts, len(y))
    # equal weights: every chunk holds about the same share of every class
    iid = partition(y, 5, "dp_filter_weighted", iid=True)
    counts = np.stack([np.bincount(y[p], minlength=10) for p in iid])
    assert np.all(np.abs(counts - np.bincount(y) / 5) <= 2)
    skew = np.stack([np.bincount(y[p], minlength=10) for p in parts])
    assert skew.std(axis=0).mean() > 3 * counts.std(axis=0).mean()


def test_seed002_matches_authors_split():
    # 30 workers, 10 digits of 60: half of each digit over all 30 (1 each), the other half
    # over workers 3c..3c+2 (10 each), as the code's 6,000-per-class split scaled down.
    y = balanced(per_class=60)
    parts = partition(y, 30, "dp_rsa_shared_half")
    assert_disjoint_cover(parts, len(y))
    for i, p in enumerate(parts):
        expected = np.ones(10, np.int64)
        expected[i // 3] += 10
        assert np.bincount(y[p], minlength=10).tolist() == expected.tolist()
    only_own = partition(y, 10, "dp_rsa_shared_half", shared_fraction=0.0)
    assert labels_per_client(y, only_own) == [1] * 10


def test_seed003_replicated_shards():
    y = balanced()  # 1,000 examples, shards of 50: 20 shards, 10 clients per replica
    parts = partition(y, 30, "fed_cdp_replicated_shards", shard_size=50)
    assert [len(p) for p in parts] == [100] * 30
    for r in range(3):
        assert_disjoint_cover(parts[10 * r : 10 * r + 10], len(y))
    assert max(labels_per_client(y, parts)) <= 2  # shards of 50 never straddle classes of 100
    # MNIST-like numbers: N=1000 clients of 2 × 250
    big = np.repeat(np.arange(10), 5000)
    many = partition(big, 1000, "fed_cdp_replicated_shards")
    assert len(many) == 1000 and {len(p) for p in many} == {500}
    assert max(labels_per_client(big, many)) <= 2


@pytest.mark.parametrize(
    ("args", "options", "match"),
    [
        ((balanced(), 0), {}, "num_clients"),
        ((balanced(), 2.5), {}, "num_clients"),
        ((balanced(), 1001), {}, "num_clients"),
        ((balanced(), 10, "kmeans"), {}, "unknown scheme"),
        ((balanced(), 10, "iid"), {"alpha": 1.0}, "alpha"),
        ((balanced(), 10, "dirichlet"), {"alpha": 0.0}, "alpha"),
        ((balanced(), 10, "dirichlet"), {"beta": 1.0}, "beta"),
        ((balanced(), 10, "shards"), {"labels_per_client": 0}, "labels_per_client"),
        ((balanced(), 4, "shards"), {"labels_per_client": 2}, "labels_per_client"),
        ((balanced(), 200, "dp_filter_weighted"), {}, "num_clients"),
        ((balanced(), 5, "dp_rsa_shared_half"), {}, "num_clients"),
        ((balanced(), 10, "dp_rsa_shared_half"), {"shared_fraction": 1.5}, "shared_fraction"),
        ((balanced(), 10, "fed_cdp_replicated_shards"), {"shard_size": 600}, "shard_size"),
        ((np.zeros((4, 2), np.int64), 2), {}, "1-D"),
        ((np.array([0.5, 1.0]), 2), {}, "integer"),
        ((np.array([-1, 1]), 2), {}, "non-negative"),
        ((np.array([], np.int64), 2), {}, "empty"),
    ],
)
def test_errors(args, options, match):
    with pytest.raises(PartitionError, match=match):
        partition(*args, **options)
