"""End-to-end properties of the in-process secure aggregation (driver + state machines)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharefl.protocol import Planner, secure_sum
from sharefl.protocol.client import threshold_floor
from sharefl.protocol.clustering import Clustering
from sharefl.protocol.errors import ConfigurationError, LeakageError, StageError

STAGE_ORDER = ("advertise", "share", "mask", "unmask")


def _inputs(rng: np.random.Generator, n: int, length: int, bits: int) -> dict[int, np.ndarray]:
    dtype = np.uint32 if bits == 32 else np.uint64
    return {
        cid: rng.integers(0, np.iinfo(dtype).max, size=length, dtype=dtype, endpoint=True)
        for cid in range(n)
    }


def _expected_survivors(members, t, drops):
    """Who is left after each stage, and whether the cluster must succeed."""
    alive = set(members)
    counts = []
    for stage in STAGE_ORDER:
        alive -= set(drops.get(stage, ()))
        counts.append(len(alive))
    u3 = set(members)
    for stage in STAGE_ORDER[:3]:
        u3 -= set(drops.get(stage, ()))
    return u3, all(c >= t for c in counts)


@st.composite
def scenarios(draw):
    n = draw(st.integers(2, 60))
    m = draw(st.integers(1, n))
    length = draw(st.one_of(st.integers(0, 64), st.integers(0, 10_000)))
    bits = draw(st.sampled_from([32, 64]))
    seed = draw(st.integers(0, 2**32 - 1))
    # Each client drops at most once, at a random stage (or never).
    stage_of = draw(
        st.lists(st.sampled_from([None, None, None, *STAGE_ORDER]), min_size=n, max_size=n)
    )
    drops: dict[str, list[int]] = {}
    for cid, stage in enumerate(stage_of):
        if stage is not None:
            drops.setdefault(stage, []).append(cid)
    extra_t = draw(st.integers(0, 3))
    return n, m, length, bits, seed, drops, extra_t


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenarios())
def test_every_released_sum_is_exact_and_failures_are_reported(scenario):
    n, m, length, bits, seed, drops, extra_t = scenario
    inputs = _inputs(np.random.default_rng(seed), n, length, bits)
    clusters = max(1, n // m)
    smallest, largest = n // clusters, -(-n // clusters)
    t = None
    if smallest > 1:
        t = min(threshold_floor(largest) + extra_t, smallest)
    result = secure_sum(
        inputs, cluster_size=m, threshold=t, dropouts=drops, seed=seed, min_sum_size=2
    )
    dtype = np.uint32 if bits == 32 else np.uint64
    accounted = set()
    released = {c.cluster: c for c in result.clusters}
    failed = {f.cluster: f for f in result.failed}
    for index, members in enumerate(result.reclusterings[0].clustering.clusters):
        accounted.add(index)
        if len(members) == 1:
            (cid,) = members
            dropped = any(cid in ids for ids in drops.values())
            assert (index in failed) == dropped
            if not dropped:
                np.testing.assert_array_equal(released[index].sum, inputs[cid])
            continue
        cluster_t = t if t is not None else threshold_floor(len(members))
        survivors, should_succeed = _expected_survivors(members, cluster_t, drops)
        if should_succeed:
            got = released[index]
            assert set(got.members) == survivors
            expected = np.zeros(length, dtype=dtype)
            for cid in survivors:
                expected += inputs[cid]  # wraps mod 2^b, as the protocol's sum
            np.testing.assert_array_equal(got.sum, expected)
            assert got.sum.dtype == dtype
        else:
            assert index not in released
            assert failed[index].members == tuple(members)
    assert accounted == set(released) | set(failed)
    assert not set(released) & set(failed)


def test_reclusterings_each_sum_the_same_inputs():
    inputs = _inputs(np.random.default_rng(1), 12, 100, 32)
    result = secure_sum(inputs, cluster_size=6, reclusterings=2, seed=3)
    total = sum(inputs.values())
    for rec in result.reclusterings:
        np.testing.assert_array_equal(sum(c.sum for c in rec.clusters), total)
    assert result.all_clusters == [c for r in result.reclusterings for c in r.clusters]


def test_float_inputs_are_encoded_and_decoded_within_the_bound():
    rng = np.random.default_rng(5)
    inputs = {cid: rng.normal(0, 0.3, size=257).astype(np.float32) for cid in range(9)}
    result = secure_sum(inputs, cluster_size=3, clip=1.0, seed=2)
    bound = result.encoding.sum_error_bound(3)
    for cluster in result.clusters:
        exact = sum(np.clip(inputs[c].astype(np.float64), -1, 1) for c in cluster.members)
        assert np.max(np.abs(cluster.sum - exact)) <= bound
        assert cluster.ring_sum.dtype == np.uint32


def test_float_inputs_need_a_clip():
    with pytest.raises(ConfigurationError, match="clip"):
        secure_sum({0: np.zeros(3), 1: np.zeros(3)}, cluster_size=2)


def test_signed_mode_with_dropouts_at_every_stage():
    # 12 holders, signed: t >= 8 resists ceil(12/3) - 1 = 3 colluders (split-view bound).
    inputs = _inputs(np.random.default_rng(2), 12, 50, 32)
    drops = {"share": [1], "mask": [2], "consistency": [3], "unmask": [4]}
    result = secure_sum(inputs, cluster_size=12, threshold=8, dropouts=drops, signed=True)
    (cluster,) = result.clusters
    # 3 dropped at the consistency stage: its masked input is in the sum.
    assert set(cluster.members) == set(range(12)) - {1, 2}
    np.testing.assert_array_equal(cluster.sum, sum(inputs[c] for c in cluster.members))


def test_secagg_plus_sparse_graph_with_dropouts():
    inputs = _inputs(np.random.default_rng(4), 20, 300, 32)
    drops = {"mask": [0, 7], "unmask": [3]}
    result = secure_sum(
        inputs, cluster_size=20, threshold=4, neighbour_degree=6, dropouts=drops, seed=9
    )
    (cluster,) = result.clusters
    assert set(cluster.members) == set(range(20)) - {0, 7}
    np.testing.assert_array_equal(cluster.sum, sum(inputs[c] for c in cluster.members))


def test_paper_default_reclustering_is_refused_as_leaking_unless_planned_safely():
    inputs = _inputs(np.random.default_rng(0), 60, 4, 32)
    with pytest.raises(LeakageError, match="LEAKS"):
        secure_sum(inputs, cluster_size=3, reclusterings=10, seed=0, planner=Planner.RANDOM)
    result = secure_sum(
        inputs,
        cluster_size=3,
        reclusterings=10,
        seed=0,
        planner=Planner.RANDOM,
        allow_leakage=True,
    )
    assert len(result.planned_audit.recoverable_clients) == 60
    assert result.realised_audit.leaks  # allowed, and reported
    safe = secure_sum(inputs, cluster_size=3, reclusterings=10, seed=0)  # the safe planner
    assert not safe.planned_audit.leaks and not safe.realised_audit.leaks
    total = sum(inputs.values())
    for rec in safe.reclusterings:
        assert not rec.failed
        np.testing.assert_array_equal(sum(c.sum for c in rec.clusters), total)


def test_a_sum_shrunk_below_the_minimum_by_a_dropout_is_withheld():
    inputs = _inputs(np.random.default_rng(0), 6, 4, 32)
    result = secure_sum(inputs, cluster_size=3, threshold=2, dropouts={"mask": [0]}, seed=1)
    assert not result.planned_audit.leaks and not result.realised_audit.leaks
    (withheld,) = result.reclusterings[0].withheld
    assert 0 in withheld.members and "sums" in withheld.reason
    (released,) = result.clusters
    assert 0 not in released.members
    np.testing.assert_array_equal(released.sum, sum(inputs[c] for c in released.members))


def test_a_dropout_between_reclusterings_cannot_expose_an_update():
    """{0,1,2} is released in reclustering 0; in reclustering 1 client 0 drops from the
    same cluster, so {1,2} would give x_0 by subtraction: the coordinator withholds it."""
    inputs = _inputs(np.random.default_rng(3), 6, 8, 32)
    fixed = Clustering(((0, 1, 2), (3, 4, 5)))
    result = secure_sum(
        inputs,
        cluster_size=3,
        reclusterings=2,
        clusterings=[fixed, fixed],
        threshold=2,
        min_sum_size=2,
        dropouts=[{}, {"mask": [0]}],
        seed=1,
    )
    first, second = result.reclusterings
    assert {c.members for c in first.clusters} == {(0, 1, 2), (3, 4, 5)}
    (withheld,) = second.withheld
    assert withheld.members == (0, 1, 2) and "updates of [0]" in withheld.reason
    assert [c.members for c in second.clusters] == [(3, 4, 5)]
    assert not result.realised_audit.leaks


def test_an_out_of_range_input_flags_its_cluster_as_corrupted():
    rng = np.random.default_rng(7)
    inputs = {cid: rng.uniform(-1, 1, 64).astype(np.float32) for cid in range(9)}
    plan = Clustering(((0, 1, 2), (3, 4, 5), (6, 7, 8)))
    huge = np.full(64, 2**31 - 1, dtype=np.uint32)
    result = secure_sum(
        inputs, cluster_size=3, clip=1.0, clusterings=[plan], byzantine_inputs={4: huge}, seed=4
    )
    (corrupted,) = result.reclusterings[0].corrupted
    assert corrupted.members == (3, 4, 5) and "exceeds" in corrupted.reason
    bound = result.encoding.sum_error_bound(3)
    assert [c.members for c in result.clusters] == [(0, 1, 2), (6, 7, 8)]
    for cluster in result.clusters:
        exact = sum(inputs[c].astype(np.float64) for c in cluster.members)
        assert np.max(np.abs(cluster.sum - exact)) <= bound


def test_a_cluster_sum_names_its_ring_and_its_decoded_sum():
    """ring_sum is always the Z_2^b sum; decoded is the float sum only for float inputs."""
    rng = np.random.default_rng(7)
    ints = {cid: rng.integers(0, 2**32, size=6, dtype=np.uint32) for cid in range(4)}
    ring = secure_sum(ints, cluster_size=4, seed=1).clusters[0]
    assert ring.decoded is None
    np.testing.assert_array_equal(ring.sum, ring.ring_sum)
    with pytest.raises(StageError, match="use ring_sum"):
        _ = ring.float_sum

    floats = {cid: rng.uniform(-1, 1, size=6) for cid in range(4)}
    cluster = secure_sum(floats, cluster_size=4, clip=1.0, seed=1).clusters[0]
    assert cluster.decoded is not None and cluster.decoded.dtype == np.float64
    assert cluster.ring_sum.dtype in (np.uint32, np.uint64)
    np.testing.assert_array_equal(cluster.float_sum, cluster.decoded)
    np.testing.assert_allclose(cluster.decoded, sum(floats.values()), atol=1e-3)


def test_a_round_with_reclusterings_has_no_single_cluster_list():
    inputs = {cid: np.full(3, cid, dtype=np.uint32) for cid in range(8)}
    one = secure_sum(inputs, cluster_size=4, seed=2)
    assert one.clusters == one.reclusterings[0].clusters == one.all_clusters
    several = secure_sum(inputs, cluster_size=4, reclusterings=2, seed=2, allow_leakage=True)
    with pytest.raises(StageError, match="2 reclusterings"):
        _ = several.clusters
    with pytest.raises(StageError, match="2 reclusterings"):
        _ = several.failed
    assert several.all_clusters == [c for r in several.reclusterings for c in r.clusters]
    for rec in several.reclusterings:
        np.testing.assert_array_equal(sum(c.ring_sum for c in rec.clusters), sum(inputs.values()))


@pytest.mark.parametrize(
    "bad",
    [-1, 2**64, True, False, 2.0, "3", np.float64(4.0), np.bool_(True)],
    ids=["negative", "2^64", "True", "False", "float", "str", "numpy-float", "numpy-bool"],
)
def test_secure_sum_refuses_client_ids_that_are_not_u64_integers(bad):
    """Ids are u64 wherever they are bound (key derivation, plan digest, wire): anything
    else is refused before the round starts, and the message names the bad id."""
    inputs = {bad: np.zeros(2, np.uint32), 10: np.zeros(2, np.uint32)}
    inputs |= {11: np.zeros(2, np.uint32), 12: np.zeros(2, np.uint32)}
    with pytest.raises(ConfigurationError, match="client ids must be integers") as info:
        secure_sum(inputs, cluster_size=3, seed=0)
    assert repr(bad) in str(info.value)


def test_secure_sum_names_every_bad_id_and_accepts_the_u64_extremes():
    with pytest.raises(ConfigurationError, match=r"-5, 1\.5"):
        secure_sum({-5: np.zeros(1, np.uint32), 1.5: np.zeros(1, np.uint32)}, cluster_size=2)
    ids = [0, np.int64(7), 2**64 - 1]  # numpy integers and the largest u64 are ids
    result = secure_sum({cid: np.ones(2, np.uint32) for cid in ids}, cluster_size=3, seed=0)
    (cluster,) = result.clusters
    assert cluster.members == (0, 7, 2**64 - 1)
    assert cluster.ring_sum.tolist() == [3, 3]
