"""The distributed discrete pipeline (sharefl.privacy.distributed): rotation, conditional
rounding (invariant R), the noise each member adds, the b-bit modular sum and its decode,
each checked against an independent computation (scipy's Hadamard matrix, Python
integers, exact norms)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.linalg import hadamard

from sharefl.privacy.distributed import (
    DistributedDPConfig,
    DistributedEncoder,
    DistributedMechanism,
    Rotation,
    calibrate_distributed,
    epsilon_after,
    hadamard_,
    padded_dim,
    rotation_signs,
)
from sharefl.privacy.distributed_accounting import DEFAULT_ORDERS, rdp_to_epsilon
from sharefl.privacy.errors import CalibrationError, PrivacyConfigError
from sharefl.privacy.secure_random import SecureRandom

SEED = bytes(range(48))


def encoder(dim: int = 100, **overrides) -> DistributedEncoder:
    settings = {
        "mechanism": DistributedMechanism.SKELLAM,
        "clip": 1.0,
        "noise_multiplier": 1.0,
        "min_survivors": 3,
        "max_summands": 5,
        "bits": 16,
    }
    return DistributedEncoder(DistributedDPConfig(**(settings | overrides)), dim)


def ring_sum(vectors: list[np.ndarray]) -> np.ndarray:
    """What the protocol releases: the sum in the vectors' own ring (uint32/uint64 wrap)."""
    total = np.zeros_like(vectors[0])
    for v in vectors:
        total += v
    return total


@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_the_hadamard_transform_is_scipys_matrix_over_root_n_and_its_own_inverse(n):
    rng = np.random.default_rng(n)
    x = rng.normal(size=(3, n))
    expected = x @ hadamard(n).T / math.sqrt(n)
    got = hadamard_(x.copy())
    np.testing.assert_allclose(got, expected, atol=1e-12)
    np.testing.assert_allclose(hadamard_(got), x, atol=1e-12)


def test_padding_and_signs_are_public_and_deterministic():
    assert padded_dim(100, Rotation.HADAMARD) == 128
    assert padded_dim(128, Rotation.HADAMARD) == 128
    assert padded_dim(100, Rotation.NONE) == 100
    signs = rotation_signs(SEED, 1000)
    assert set(np.unique(signs)) == {-1.0, 1.0}
    np.testing.assert_array_equal(signs, rotation_signs(SEED, 1000))
    assert not np.array_equal(signs, rotation_signs(bytes(48), 1000))
    assert abs(signs.mean()) < 0.15


@pytest.mark.parametrize("mechanism", list(DistributedMechanism)[1:])
@pytest.mark.parametrize("rotation", list(Rotation))
def test_a_noiseless_sum_decodes_to_the_sum_of_the_clipped_updates(mechanism, rotation):
    """Oracle: the float sum of the members' updates clipped to C; the only error is the
    rounding, at most one ring unit per coordinate and member, γ·√(mD) in l2 norm."""
    enc = encoder(mechanism=mechanism, rotation=rotation, noise_multiplier=0.5)
    rng = np.random.default_rng(1)
    updates = [rng.normal(size=100) * s for s in (0.01, 0.1, 0.5, 3.0, 10.0)]
    secret = SecureRandom.from_seed(bytes(48))
    vectors = [enc.encode(u, SEED, secret, noise=False) for u in updates]
    assert all(v.dtype == np.uint32 and v.shape == (enc.padded,) for v in vectors)
    clipped = [u * min(1.0, 1.0 / np.linalg.norm(u)) for u in updates]
    error = np.linalg.norm(enc.decode(ring_sum(vectors), SEED) - np.sum(clipped, axis=0))
    assert error <= enc.gamma * math.sqrt(len(updates) * enc.padded)


def test_the_noise_of_s_members_has_the_target_std_in_update_units():
    """s members' noise decoded (with no update) has std σC per coordinate: rotation is
    orthogonal, so the ring's (σC/γ)² comes back as (σC)²."""
    for mechanism in list(DistributedMechanism)[1:]:
        enc = encoder(4096, mechanism=mechanism, noise_multiplier=2.0, bits=20)
        secret = SecureRandom.from_seed(bytes(47) + b"\x01")
        vectors = [enc.encode(np.zeros(4096), SEED, secret) for _ in range(3)]
        noise = enc.decode(ring_sum(vectors), SEED)
        assert noise.std() == pytest.approx(2.0, rel=0.05), mechanism


@given(
    scale=st.floats(1e-3, 1e3),
    dim=st.integers(1, 300),
    bits=st.integers(8, 40),
    beta=st.sampled_from([0.0, 1e-3, math.exp(-0.5)]),
    seed=st.binary(min_size=48, max_size=48),
)
def test_invariant_r_every_rounded_vector_is_within_the_sensitivity(scale, dim, bits, beta, seed):
    """Whatever the update (any norm, clipped first), the integers that leave the client
    have l2 norm ≤ Δ₂ and l1 norm ≤ Δ₁, computed exactly in Python integers."""
    enc = encoder(dim, bits=bits, beta=beta)
    secret = SecureRandom.from_seed(seed)
    update = np.random.default_rng(int.from_bytes(seed[:8])).normal(size=dim) * scale
    scaled = enc.rotate(update, SEED) / enc.gamma
    z = enc.round_conditionally(scaled, secret)
    assert np.all(np.abs(z - scaled) < 1)
    l1, l2 = enc.sensitivity
    ints = [int(v) for v in z]
    assert sum(v * v for v in ints) <= l2 * l2
    assert sum(abs(v) for v in ints) <= l1


@given(bits=st.integers(2, 64), values=st.lists(st.integers(-(2**70), 2**70), min_size=1))
def test_decode_reads_the_low_b_bits_in_twos_complement(bits, values):
    """Oracle: Python's integers mod 2^b mapped to [−2^(b−1), 2^(b−1))."""
    enc = encoder(
        len(values),
        bits=bits,
        rotation=Rotation.NONE,
        min_survivors=1,
        max_summands=1,
        k_stddevs=1.0,
    )
    ring = np.array([v % 2**64 for v in values], dtype=np.uint64).astype(enc.ring_dtype)
    modulus = 2**bits
    expected = [((v + modulus // 2) % modulus) - modulus // 2 for v in values]
    if enc.ring_dtype == np.uint32:  # the words only hold the ring's 32 bits
        expected = [(((v % 2**32) + modulus // 2) % modulus) - modulus // 2 for v in values]
    np.testing.assert_allclose(enc.decode(ring, SEED) / enc.gamma, expected, rtol=1e-12)


def test_to_ring_keeps_the_low_b_bits_so_the_ring_sum_is_the_b_bit_sum():
    for bits in (12, 32, 48, 64):
        enc = encoder(4, bits=bits, rotation=Rotation.NONE)
        members = [np.array([3, -5, 2 ** (bits - 2), -(2 ** (bits - 2))], dtype=np.int64)] * 3
        total = ring_sum([enc.to_ring(z, SecureRandom()) for z in members])
        expected = [
            ((3 * int(v) + 2 ** (bits - 1)) % 2**bits) - 2 ** (bits - 1) for v in members[0]
        ]
        np.testing.assert_allclose(enc.decode(total, SEED) / enc.gamma, expected, rtol=1e-12)


@pytest.mark.parametrize("bits", [12, 20, 48])
def test_the_server_sees_the_b_bit_sum_and_uniform_high_bits_never_the_carries(bits):
    """Invariant H, against the server's exact view: two clusters whose members' b-bit sums
    agree but whose residues carry differently (three members at -1: the residues sum to
    3·2^b - 3; one at -3: to 2^b - 3) give ring sums whose bits above b are uniform in
    both, with one honest member among colluders who send their bare residues. Without
    the random high bits those bits would be the carry count, 2 against 0."""
    enc = encoder(4, bits=bits, rotation=Rotation.NONE)
    width = np.dtype(enc.ring_dtype).itemsize * 8
    n = 20_000
    for honest, others in ((-1, [-1, -1]), (-3, [0, 0])):
        words = enc.to_ring(np.full(n, honest, dtype=np.int64), SecureRandom())
        bare = [np.full(n, v & ((1 << bits) - 1), dtype=enc.ring_dtype) for v in others]
        view = ring_sum([words, *bare]).astype(np.uint64)
        assert np.all(view & np.uint64((1 << bits) - 1) == (2**bits - 3))  # the b-bit sum
        top4 = (view >> np.uint64(width - 4)) & np.uint64(15)
        counts = np.bincount(top4.astype(np.int64), minlength=16)
        chi2 = float(((counts - n / 16) ** 2 / (n / 16)).sum())
        assert chi2 < 50.0, (honest, counts)  # 15 d.o.f.: P(χ² > 50) ≈ 1e-5


def test_gamma_keeps_k_standard_deviations_of_a_full_sum_inside_the_ring():
    """A full cluster (m members with noise, updates at the clip) wraps in fewer than
    the Gaussian tail's share of coordinates at k = 4 (≈ 6e-5), with a margin."""
    enc = encoder(4096, bits=12, max_summands=5, noise_multiplier=1.0)
    secret = SecureRandom.from_seed(bytes(range(1, 49)))
    rng = np.random.default_rng(0)
    updates = [rng.normal(size=4096) for _ in range(5)]
    integers = []
    for u in updates:
        scaled = enc.rotate(u, SEED) / enc.gamma
        integers.append(enc.round_conditionally(scaled, secret) + enc.noise(secret))
    exact = np.sum(integers, axis=0)
    wrapped = np.abs(exact) >= 2**11
    assert wrapped.mean() < 1e-3


def test_bad_configurations_name_what_to_change():
    with pytest.raises(PrivacyConfigError, match="cluster_noise"):
        encoder(mechanism="gaussian")
    with pytest.raises(PrivacyConfigError, match="raise bits"):
        encoder(bits=2, max_summands=5)
    with pytest.raises(PrivacyConfigError, match="colluders"):
        encoder(min_survivors=6, max_summands=5)
    with pytest.raises(PrivacyConfigError, match="bits"):
        encoder(bits=65)
    with pytest.raises(ValueError):
        encoder(rotation="dct")
    with pytest.raises(PrivacyConfigError, match="values"):
        encoder(10).encode(np.zeros(11), SEED, SecureRandom())


def test_the_released_mechanism_is_the_sum_of_the_members_shares():
    dg = encoder(mechanism=DistributedMechanism.DISCRETE_GAUSSIAN)
    sk = encoder(mechanism=DistributedMechanism.SKELLAM)
    assert sk.released_mechanism(4).mu_total == pytest.approx(4 * sk.skellam_mu)
    released = dg.released_mechanism(3)
    assert released.members == 3
    assert released.sigma_squared_per_member >= (dg.config.member_noise_std / dg.gamma) ** 2


@pytest.mark.parametrize("mechanism", list(DistributedMechanism)[1:])
def test_calibration_reaches_the_target_by_the_mechanisms_own_bound(mechanism):
    """Oracle: the composed RDP bound of the calibrated encoder's released sum, converted
    independently; the σ found is within 0.1 % of the least that reaches the target."""
    config = encoder(7850, mechanism=mechanism, bits=16).config
    calibrated = calibrate_distributed(config, 7850, 2.0, 1e-4, 20)
    eps = epsilon_after(calibrated, 20, 1e-4)
    assert 1.99 <= eps <= 2.0
    sigma = calibrated.config.noise_multiplier
    below = DistributedEncoder(replace(config, noise_multiplier=sigma * 0.995), 7850)
    assert epsilon_after(below, 20, 1e-4) > 2.0
    curve = 20 * calibrated.released_mechanism(3).rdp(np.asarray(DEFAULT_ORDERS))
    assert rdp_to_epsilon(DEFAULT_ORDERS, curve, 1e-4) == pytest.approx(eps)


def test_a_ring_too_narrow_for_the_target_is_a_calibration_error_that_says_so():
    """At 12 bits γ grows with σ to keep the sum in the ring, so the rounding's √D/2 of
    the sensitivity meets a noise that stops growing: ε cannot fall below ≈ 1.46 here."""
    config = encoder(7850, bits=12, min_survivors=3, max_summands=3).config
    with pytest.raises(CalibrationError, match="raise bits"):
        calibrate_distributed(config, 7850, 1.0, 1e-4, 20)
    assert epsilon_after(calibrate_distributed(config, 7850, 2.0, 1e-4, 20), 20, 1e-4) <= 2.0
