"""Distributed DP inside secure-aggregation clusters that survives discretisation and the
modular sum: the client pipeline of the distributed discrete Gaussian (Kairouz, Liu and
Steinke, ICML 2021, arXiv:2102.06387, Algorithms 1–2) and of the Skellam mechanism
(Agarwal, Kairouz and Liu, NeurIPS 2021, arXiv:2110.04995, Algorithm 1), and the server's
decode.

Client (:meth:`DistributedEncoder.encode`), for an update x ∈ R^d:

1. **clip** to l2 norm C;
2. **rotate** (``Rotation.HADAMARD``): pad to D = 2^⌈log₂ d⌉ and apply R = H·diag(ξ)/√D,
   H the Walsh–Hadamard matrix, ξ ∈ {±1}^D drawn from the round's *public* seed (every
   member of a round uses the same ξ, the server too). R is orthogonal, so ‖Rx‖ = ‖x‖ ≤ C,
   and it spreads the norm evenly: each coordinate is sub-Gaussian with variance proxy
   C²/D (Kairouz et al., Lemma 10), which is what lets a few bits per coordinate hold
   the sum;
3. **scale** by 1/γ (γ: :meth:`DistributedEncoder.gamma`, one ring unit in update units);
4. **conditional randomised rounding**: every coordinate is rounded up with probability
   its fractional part (unbiased), and the whole rounding is redrawn until the integer
   vector's l2 norm is at most Δ₂ = ``rounded_sensitivity(C, γ, D, β).l2`` (Kairouz et al.
   Sec. 4.1; a draw passes with probability ≥ 1 − β). **Invariant R**: the vector that
   leaves the client has ‖z‖₂ ≤ Δ₂ and ‖z‖₁ ≤ min(Δ₂², √D·Δ₂) *whatever the float
   arithmetic before it did*, because the check is on the integers themselves (the sum of
   squares is compared with a float-error margin that can only make it stricter); so the
   sensitivity that the accounting uses is enforced, not assumed;
5. **noise** (honest members only): per coordinate a discrete Gaussian N_Z(0, σ_z²) or a
   symmetric Skellam Sk(μ, μ), exact samplers driven by an AES-CTR stream keyed from OS
   entropy (:mod:`sharefl.privacy.discrete_samplers`). The share is sized like
   :mod:`sharefl.privacy.cluster_noise`'s split: a released sum of at least s members, of
   whom at most t add no noise, carries variance ≥ (σC/γ)² in ring units;
6. **modular clipping**: the integers are reduced mod 2^b and masked by the protocol. A
   sum that leaves [−2^(b−1), 2^(b−1)) wraps around; γ is chosen so that k = ``k_stddevs``
   standard deviations of a sum of ``max_summands`` members fit (Kairouz et al. Sec. 4.2):
   with v the per-coordinate variance of one member (C²/D from the data, γ²/4 from the
   rounding, σ_l² = (σC)²/(s − t) from the noise), m members need k·√(m·v) ≤ γ·2^(b−1),
   i.e. γ = 2k·√(m·(C²/D + σ_l²)) / √(4^b − k²m), but no finer than σ_l/2^20 (wide rings
   would otherwise resolve the noise to no purpose). Wrap-around costs accuracy, never
   privacy (it is post-processing of the noisy sum).

Server (:meth:`DistributedEncoder.decode`): the ring sum mod 2^b is read in two's
complement, multiplied by γ, rotated back (R⁻¹ = diag(ξ)·H/√D) and cut to d coordinates.

Rings: the protocol's ring is Z_2^w, w = 32 or 64; a b-bit encoding (b ≤ w) is stored in
the low b bits of those words, and since 2^b divides 2^w the protocol's sum mod 2^w reduced
mod 2^b is the b-bit sum. **Invariant H** (what the server learns is the sum mod 2^b, no
more): the w − b high bits of every word a member sends are drawn uniformly from its
secret stream (:meth:`DistributedEncoder.to_ring`). Without them the sum mod 2^w of words
in [0, 2^b) would be the sum over the integers of the members' residues, and its bits
above b count, per coordinate, how many members' noisy values wrapped (roughly, how many
were negative): a function of the individual noisy values that the mechanism's privacy,
proved for their sum, does not cover. With them the sum's high bits are the carries plus
a uniform value mod 2^(w−b) that is independent of everything else as long as one member
is honest: a one-time pad, so the server's view is a function of the b-bit sum and noise
it could draw itself.

Accounting (:meth:`DistributedEncoder.released_mechanism`): a released sum of n honest
members is, in ring units, the DDG mechanism with n members (Kairouz et al., Theorem 1:
sums of discrete Gaussians are not discrete Gaussians, the bound pays τ) or the Skellam
mechanism Sk(nμ, nμ) (closed under sums; Agarwal et al., Theorem 3.5 RDP), with the
sensitivities of invariant R (:mod:`sharefl.privacy.distributed_accounting`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import cached_property

import numpy as np

from .discrete_samplers import DiscreteGaussian, skellam
from .distributed_accounting import (
    DEFAULT_ORDERS,
    DiscreteGaussianSum,
    DistributedDPLedger,
    SkellamSum,
    rdp_to_epsilon,
    released_cells,
    rounded_sensitivity,
)
from .errors import CalibrationError, PrivacyConfigError
from .secure_random import SecureRandom
from .vocabulary import Conversion, DistributedMechanism, Rotation

#: Conditional rounding's failure probability β: TF Federated's default e^(−1/2).
DEFAULT_BETA = math.exp(-0.5)
#: Standard deviations of a full sum that must fit the ring before it wraps.
DEFAULT_K_STDDEVS = 4.0
#: The most ring units one member's noise std may span: a finer γ adds resolution far
#: below the noise (rounding variance γ²/4 < 2⁻⁴⁰ of it) and only slows the sampler.
MAX_NOISE_UNITS = 2.0**20
#: Redraws of the conditional rounding before giving up (each passes w.p. ≥ 1 − β).
MAX_ROUNDING_TRIES = 1000


class RoundingError(PrivacyConfigError):
    """Conditional rounding found no rounding within the norm bound in
    :data:`MAX_ROUNDING_TRIES` draws: the update was not clipped to C (a bug) or β is
    tiny."""


@dataclass(frozen=True)
class DistributedDPConfig:
    """Distributed discrete noise of one cluster (module docstring).

    Attributes:
        mechanism: the noise (discrete Gaussian or Skellam; ``GAUSSIAN`` is not encoded
            here but by :mod:`sharefl.privacy.cluster_noise`).
        clip: C, the l2 bound on one update (update units).
        noise_multiplier: σ: a released sum carries noise of std ≥ σC per coordinate.
        min_survivors: s, the fewest members a released sum may hold.
        max_summands: m, the most members a sum may hold (the cluster size): sizes γ.
        colluders: t < s members per sum that add no noise.
        bits: b, the ring width of the encoding, 2 ≤ b ≤ 64.
        rotation: the rotation before quantisation.
        k_stddevs: k of the wrap-around bound.
        beta: β of the conditional rounding, in [0, 1) (0: no conditioning, Δ₂ = C/γ + √D).
    """

    mechanism: DistributedMechanism
    clip: float
    noise_multiplier: float
    min_survivors: int
    max_summands: int
    colluders: int = 0
    bits: int = 16
    rotation: Rotation = Rotation.HADAMARD
    k_stddevs: float = DEFAULT_K_STDDEVS
    beta: float = DEFAULT_BETA

    def __post_init__(self) -> None:
        object.__setattr__(self, "mechanism", DistributedMechanism(self.mechanism))
        object.__setattr__(self, "rotation", Rotation(self.rotation))
        if not self.mechanism.discrete:
            raise PrivacyConfigError(
                'DistributedDPConfig encodes discrete noise: "gaussian" is the float '
                "encoding of sharefl.privacy.cluster_noise"
            )
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise PrivacyConfigError(f"clip must be > 0, got {self.clip!r}")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0):
            raise PrivacyConfigError(f"noise_multiplier must be >= 0, got {self.noise_multiplier}")
        if not 0 <= self.colluders < self.min_survivors <= self.max_summands:
            raise PrivacyConfigError(
                "need 0 <= colluders < min_survivors <= max_summands, got "
                f"{self.colluders}, {self.min_survivors}, {self.max_summands}"
            )
        if not 2 <= self.bits <= 64:
            raise PrivacyConfigError(f"bits must be in [2, 64], got {self.bits}")
        if not (math.isfinite(self.k_stddevs) and self.k_stddevs > 0):
            raise PrivacyConfigError(f"k_stddevs must be > 0, got {self.k_stddevs}")
        if not 0 <= self.beta < 1:
            raise PrivacyConfigError(f"beta must be in [0, 1), got {self.beta}")
        if 4.0**self.bits <= self.k_stddevs**2 * self.max_summands:
            raise PrivacyConfigError(
                f"{self.bits} bits cannot hold {self.k_stddevs:g} standard deviations of a "
                f"sum of {self.max_summands}: raise bits or lower k_stddevs"
            )

    @property
    def member_noise_std(self) -> float:
        """σ_l = σC/√(s − t): one member's noise std in update units."""
        return self.noise_multiplier * self.clip / math.sqrt(self.min_survivors - self.colluders)


def padded_dim(dim: int, rotation: Rotation) -> int:
    """D: ``dim`` rounded up to a power of two for the Hadamard rotation, else ``dim``."""
    if dim < 1:
        raise PrivacyConfigError(f"dim must be >= 1, got {dim}")
    return 1 << (dim - 1).bit_length() if rotation is Rotation.HADAMARD else dim


def hadamard_(x: np.ndarray) -> np.ndarray:
    """The normalised Walsh–Hadamard transform H/√D of the last axis of ``x`` (float64,
    length D a power of two), in place; returns ``x``. H/√D is symmetric and orthogonal,
    so it is its own inverse.

    Radix-4 butterflies (two of the log₂ D stages per pass: (a, b, c, d) ↦ (a+b+c+d,
    a−b+c−d, a+b−c−d, a−b−c+d)) into preallocated scratch: half the passes over memory of
    the radix-2 form and no allocation per stage."""
    n = x.shape[-1]
    if n & (n - 1):
        raise PrivacyConfigError(f"the Hadamard transform needs a power-of-two length, got {n}")
    flat = x.reshape(-1, n)
    rows = flat.shape[0]
    h = 1
    if (n.bit_length() - 1) % 2:  # an odd number of stages: one radix-2 stage first
        pairs = flat.reshape(rows, -1, 2)
        low, high = pairs[:, :, 0], pairs[:, :, 1]
        diff = low - high
        low += high
        high[...] = diff
        h = 2
    scratch = np.empty((3, rows * (n // 4))) if n >= 4 else np.empty((3, 0))
    while h < n:
        quad = flat.reshape(rows, -1, 4, h)
        a, b, c, d = quad[:, :, 0, :], quad[:, :, 1, :], quad[:, :, 2, :], quad[:, :, 3, :]
        s1, d1, s2 = (buffer.reshape(a.shape) for buffer in scratch)
        np.add(a, b, out=s1)
        np.subtract(a, b, out=d1)
        np.add(c, d, out=s2)
        np.subtract(c, d, out=d)  # d holds c − d from here
        np.add(s1, s2, out=a)
        np.subtract(s1, s2, out=c)
        np.add(d1, d, out=b)
        np.subtract(d1, d, out=d)
        h *= 4
    x *= 1.0 / math.sqrt(n)
    return x


@functools.lru_cache(maxsize=4)
def rotation_signs(seed: bytes, length: int) -> np.ndarray:
    """ξ ∈ {±1}^length (float64, read-only) drawn from the round's public ``seed`` (48
    bytes); the last few rounds' are cached (every member of a round uses the same)."""
    words = SecureRandom.from_seed(seed).words((length + 63) // 64)
    bits = np.unpackbits(words.view(np.uint8))[:length]
    signs = 1.0 - 2.0 * bits.astype(np.float64)
    signs.flags.writeable = False
    return signs


@dataclass(frozen=True)
class DistributedEncoder:
    """The pipeline of one configuration for updates of ``dim`` coordinates."""

    config: DistributedDPConfig
    dim: int

    @cached_property
    def padded(self) -> int:
        """D, the length of the rotated vector."""
        return padded_dim(self.dim, self.config.rotation)

    @cached_property
    def gamma(self) -> float:
        """γ: one ring unit in update units (the wrap-around bound, module docstring)."""
        c = self.config
        spread = c.clip**2 / self.padded if c.rotation is Rotation.HADAMARD else c.clip**2
        m, k = c.max_summands, c.k_stddevs
        fits = (
            2
            * k
            * math.sqrt(m * (spread + c.member_noise_std**2))
            / math.sqrt(4.0**c.bits - k * k * m)
        )
        return max(fits, c.member_noise_std / MAX_NOISE_UNITS)

    @cached_property
    def sensitivity(self) -> tuple[float, float]:
        """(Δ₁, Δ₂) of one member's rounded vector in ring units (invariant R)."""
        s = rounded_sensitivity(self.config.clip, self.gamma, self.padded, self.config.beta)
        return float(s[0]), float(s[1])

    @cached_property
    def discrete_gaussian(self) -> DiscreteGaussian:
        """One member's N_Z(0, σ_z²), σ_z = σ_l/γ (σ_z² rounded up by the sampler)."""
        return DiscreteGaussian(Fraction((self.config.member_noise_std / self.gamma) ** 2))

    @cached_property
    def skellam_mu(self) -> float:
        """One member's Skellam parameter μ: Sk(μ, μ) has variance 2μ = (σ_l/γ)²."""
        return (self.config.member_noise_std / self.gamma) ** 2 / 2

    @property
    def ring_dtype(self) -> type[np.unsignedinteger]:
        """The protocol ring the b-bit encoding lives in: uint32 for b ≤ 32, else uint64."""
        return np.uint32 if self.config.bits <= 32 else np.uint64

    @property
    def ring_bits(self) -> int:
        """The width of :attr:`ring_dtype`'s words: 32 or 64."""
        return np.dtype(self.ring_dtype).itemsize * 8

    def rotate(self, update: np.ndarray, seed: bytes) -> np.ndarray:
        """R·(clipped update, zero-padded to D): float64 ``[D]``."""
        x = np.zeros(self.padded)
        x[: self.dim] = np.asarray(update, dtype=np.float64).reshape(-1)
        norm = float(np.linalg.norm(x))
        if norm > self.config.clip:
            x *= self.config.clip / norm
        if self.config.rotation is Rotation.HADAMARD:
            x *= rotation_signs(seed, self.padded)
            hadamard_(x)
        return x

    def round_conditionally(self, scaled: np.ndarray, rng: SecureRandom) -> np.ndarray:
        """Invariant R: an unbiased rounding of ``scaled`` (float64 ``[D]``, ring units)
        to int64 whose l2 norm is at most Δ₂, redrawn until it is. Raises
        :class:`RoundingError` after :data:`MAX_ROUNDING_TRIES` draws."""
        low = np.floor(scaled)
        frac = scaled - low  # exact, in [0, 1)
        base = low.astype(np.int64)
        limit = self.sensitivity[1] ** 2
        # A float64 dot product of D terms errs by at most D·2⁻⁵³/(1 − D·2⁻⁵³) of the exact
        # sum of squares (Higham, Accuracy and Stability, Thm 3.1): shrinking the bound by
        # 2·D·2⁻⁵² makes the check only stricter than the exact one.
        margin = 1.0 - 2.0 * len(scaled) * 2.0**-52
        # Round up with probability ⌊frac·2³²⌋/2³² (a 2⁻³² bias at most; frac·2³² < 2³²).
        frac *= 2.0**32
        threshold = frac.astype(np.uint32)
        for _ in range(MAX_ROUNDING_TRIES):
            draws = rng.words((len(scaled) + 1) // 2).view(np.uint32)[: len(scaled)]
            rounded = base + (draws < threshold)
            as_float = rounded.astype(np.float64)
            if float(np.dot(as_float, as_float)) <= limit * margin:
                return rounded
        raise RoundingError(
            f"no rounding of norm <= {self.sensitivity[1]:.6g} in {MAX_ROUNDING_TRIES} draws: "
            "the update exceeds the clip or beta is too small"
        )

    def noise(self, rng: SecureRandom) -> np.ndarray:
        """One member's noise share in ring units: int64 ``[D]``."""
        if self.config.noise_multiplier == 0:
            return np.zeros(self.padded, dtype=np.int64)
        if self.config.mechanism is DistributedMechanism.DISCRETE_GAUSSIAN:
            return self.discrete_gaussian.sample(self.padded, rng)
        return skellam(self.skellam_mu, self.padded, rng)

    def encode(
        self, update: np.ndarray, seed: bytes, rng: SecureRandom, *, noise: bool = True
    ) -> np.ndarray:
        """One member's input: ``update`` (``[dim]``) clipped, rotated with the round's
        public ``seed``, scaled, rounded (invariant R) and, when ``noise``, noised; reduced
        mod 2^b into :attr:`ring_dtype` ``[D]``. ``rng`` must be secret to the client
        (fresh :class:`SecureRandom`): it draws the noise."""
        if np.asarray(update).size != self.dim:
            raise PrivacyConfigError(
                f"the update has {np.asarray(update).size} values, not {self.dim}"
            )
        scaled = self.rotate(update, seed)
        scaled /= self.gamma
        z = self.round_conditionally(scaled, rng)
        if noise:
            z += self.noise(rng)
        return self.to_ring(z, rng)

    def to_ring(self, z: np.ndarray, rng: SecureRandom) -> np.ndarray:
        """Integers (int64) reduced mod 2^b into the low b bits of :attr:`ring_dtype`
        words whose high bits are uniform draws from ``rng`` (invariant H, module doc)."""
        bits = self.config.bits
        low = np.int64(-1) if bits == 64 else np.int64((1 << bits) - 1)
        words = (z & low).astype(np.uint64)
        width = self.ring_bits
        if bits < width:
            pad = rng.words(len(words)) if width == 64 else rng.words32(len(words))
            words |= pad.astype(np.uint64) & ~np.uint64(low)
        return words.astype(self.ring_dtype)

    def decode(self, ring_sum: np.ndarray, seed: bytes) -> np.ndarray:
        """The server's estimate of the sum of the members' (clipped) updates: the protocol's
        ring sum (:attr:`ring_dtype` ``[D]``) reduced mod 2^b, read in two's complement,
        scaled by γ, rotated back with the round's ``seed``; float64 ``[dim]``."""
        shift = np.uint64(64 - self.config.bits)
        # Keep the low b bits and sign-extend them: shift them to the top, shift back
        # arithmetically.
        top = np.asarray(ring_sum).astype(np.uint64) << shift
        x = (top.view(np.int64) >> shift.astype(np.int64)).astype(np.float64)
        x *= self.gamma
        if self.config.rotation is Rotation.HADAMARD:
            hadamard_(x)
            x *= rotation_signs(seed, self.padded)
        return x[: self.dim]

    def released_mechanism(self, members: int) -> DiscreteGaussianSum | SkellamSum:
        """What a released sum of ``members`` honest (noise-adding) members is, in ring
        units, for the accounting."""
        l1, l2 = self.sensitivity
        if self.config.mechanism is DistributedMechanism.DISCRETE_GAUSSIAN:
            return DiscreteGaussianSum(
                float(self.discrete_gaussian.sigma_squared), members, l1, l2, self.padded
            )
        return SkellamSum(members * self.skellam_mu, l1, l2)


def epsilon_after(
    encoder: DistributedEncoder,
    rounds: int,
    delta: float,
    *,
    members: int | None = None,
    conversion: Conversion = "improved",
) -> float:
    """ε(δ) of a client whose update is in one released sum of ``members`` noise-adding
    members (default s − t, the fewest a released sum carries) in each of ``rounds``
    rounds: the mechanism's RDP composed ``rounds`` times."""
    c = encoder.config
    n = c.min_survivors - c.colluders if members is None else members
    if c.noise_multiplier == 0:
        return math.inf
    curve = rounds * encoder.released_mechanism(n).rdp(np.asarray(DEFAULT_ORDERS))
    return rdp_to_epsilon(DEFAULT_ORDERS, curve, delta, conversion)


def calibrate_distributed(
    config: DistributedDPConfig,
    dim: int,
    target_epsilon: float,
    delta: float,
    rounds: int,
    *,
    conversion: Conversion = "improved",
    members: int | None = None,
    max_noise_multiplier: float = 1e4,
) -> DistributedEncoder:
    """The encoder of ``config`` with the smallest σ (to 0.1 %) whose :func:`epsilon_after`
    over ``rounds`` rounds, for a released sum (cell) of ``members`` noise-adding members
    (default s − t), is at most ``target_epsilon``: the discrete mechanism's own
    accounting (sensitivity inflated by the rounding, τ or Skellam's extra term), not the
    continuous Gaussian's. Raises :class:`CalibrationError` when even
    ``max_noise_multiplier`` overshoots."""
    if not (target_epsilon > 0 and rounds >= 1):
        raise PrivacyConfigError("calibration needs target_epsilon > 0 and rounds >= 1")

    def encoder_at(sigma: float) -> DistributedEncoder:
        return DistributedEncoder(replace(config, noise_multiplier=sigma), dim)

    def eps(sigma: float) -> float:
        try:
            return epsilon_after(
                encoder_at(sigma), rounds, delta, members=members, conversion=conversion
            )
        except PrivacyConfigError:
            # The sum bound needs every member's σ_z ≥ 1/2 (Kairouz et al., Theorem 1); a
            # σ below it has no bound here, so it counts as too little noise (the config
            # validated itself when built, so this is the only source of the error).
            return math.inf

    high = 1.0
    while eps(high) > target_epsilon:
        high *= 2
        if high > max_noise_multiplier:
            raise CalibrationError(
                f"even sigma = {max_noise_multiplier:g} gives more than epsilon = "
                f"{target_epsilon} over {rounds} rounds: raise bits or the target"
            )
    low = 0.0
    while high - low > 1e-3 * high:
        middle = (low + high) / 2
        if middle > 0 and eps(middle) <= target_epsilon:
            high = middle
        else:
            low = middle
    return encoder_at(high)


@dataclass
class ReleaseLedger:
    """A server's per-client ε for the sums it released, when it cannot tell honest members
    from the rest (a deployment, Flower): every client in a released sum is charged, per
    round, the mechanism of its cell (:func:`~sharefl.privacy.distributed_accounting.
    released_cells`) with max(1, n − ``colluders``) noise-adding members, n the cell's size:
    an honest client always adds its own share, and at most ``colluders`` of the others add
    none (the simulator, which knows who is honest, charges honest cells exactly)."""

    encoder: DistributedEncoder
    colluders: int = 0
    ledger: DistributedDPLedger = field(init=False)

    def __post_init__(self) -> None:
        self.ledger = DistributedDPLedger(self.encoder.config.mechanism.value)

    def record_round(self, released: Sequence[Sequence[int]]) -> None:
        """Charge one round's released sums (their members, every reclustering)."""
        members = sorted({c for r in released for c in r})
        for cell in released_cells(released, members):
            mechanism = self.encoder.released_mechanism(max(1, len(cell) - self.colluders))
            for c in cell:
                self.ledger.record(c, mechanism)
        self.ledger.end_round()

    def epsilon(self, delta: float) -> float | None:
        """The worst charged client's ε at ``delta`` (``None`` before any release)."""
        eps = self.ledger.epsilons(delta)
        return max(eps.values()) if eps else None
