"""Distributed DP in a deployment: each client encodes its own update into ring words with
its noise share (:mod:`sharefl.privacy.distributed`), the server decodes and accounts the
released cluster sums. Both sides build the same pipeline from their own copy of the
deployment file's ``[privacy]`` table (:class:`~sharefl.deploy.config.PrivacySection`).

Who decides what: σ, b, the clip and the rotation come from the *client's* file, never
from the server; the server proposes no float encoding for such a run and the client
refuses an assignment that does (:class:`~sharefl.deploy.client.RingInputs`). The only
value the server chooses that a client uses is the rotation's seed, and it is derived
from the RoundStart (:func:`~sharefl.deploy.wire.round_seed`), public and harmless.

Accounting at the server: :class:`~sharefl.privacy.distributed.ReleaseLedger` with
t = ``privacy.colluders`` (the server does not know who is honest).

The privacy modules are imported when a ``[privacy]`` table is used (they need the
``[sim]`` extra's numerics), so a deployment without one runs with ``[grpc]`` alone.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sharefl.deploy.config import DeploymentConfig, PrivacySection, SecureAggregationSection
from sharefl.protocol.client import ClientPolicy, default_colluders, min_released_members
from sharefl.protocol.errors import ConfigurationError

if TYPE_CHECKING:
    from sharefl.privacy.distributed import DistributedEncoder


def deployment_encoder(config: DeploymentConfig) -> DistributedEncoder | None:
    """The pipeline of ``config.privacy`` for updates of ``model.dim`` values (``None``
    without one): s = ``privacy.min_survivors`` or the fewest members a released sum can
    hold (:func:`~sharefl.protocol.client.min_released_members` with the threshold of the
    run's mode), m = the cluster size, σ given or calibrated to (ε, δ) over
    ``server.rounds`` for the smallest cell (s − t members with one clustering, one
    member with reclusterings). Raises the privacy layer's ``PrivacyConfigError`` /
    ``CalibrationError`` (``ValueError``) saying what to change."""
    if not config.privacy.enabled:
        return None
    return _encoder(
        config.privacy, config.secure_aggregation, config.model.dim, config.server.rounds
    )


@functools.lru_cache(maxsize=4)
def noise_colluders(p: PrivacySection, sa: SecureAggregationSection) -> int:
    """The members per released sum assumed to add no noise: ``privacy.colluders`` when
    set, else ``secure_aggregation.colluders``, else the protocol's colluder bound for the
    cluster size and mode (:func:`~sharefl.protocol.client.default_colluders`: the
    reported ε then counts only the noise of members the protocol assumes honest)."""
    if p.colluders is not None:
        return p.colluders
    if sa.colluders is not None:
        return sa.colluders
    return default_colluders(sa.cluster_size, sa.signed)


def _encoder(
    p: PrivacySection, sa: SecureAggregationSection, dim: int, rounds: int
) -> DistributedEncoder:
    """:func:`deployment_encoder` from the parts of the file it reads (frozen, hashable), so
    the server's start-up check and its run calibrate σ once."""
    from sharefl.privacy.distributed import (
        DistributedDPConfig,
        DistributedEncoder,
        calibrate_distributed,
    )

    m = sa.cluster_size
    survivors = p.min_survivors or min_released_members(
        m, sa.min_sum_size, default_colluders(m, sa.signed)
    )
    colluders = noise_colluders(p, sa)
    if colluders >= survivors:
        raise ConfigurationError(
            f"privacy.colluders resolves to {colluders} (the protocol's colluder bound unless "
            f"set), which leaves no honest noise in sums of {survivors}: use larger clusters "
            "or set privacy.min_survivors"
        )
    dp = DistributedDPConfig(
        mechanism=p.distributed,  # type: ignore[arg-type]  # the enum's value, checked there
        clip=p.clip,
        noise_multiplier=p.noise_multiplier or 1.0,
        min_survivors=survivors,
        max_summands=m,
        colluders=colluders,
        bits=p.bits,
        rotation=p.rotation,  # type: ignore[arg-type]
    )
    if p.noise_multiplier:
        return DistributedEncoder(dp, dim)
    members = None if sa.reclusterings == 1 else 1
    return calibrate_distributed(dp, dim, p.epsilon, p.delta, rounds, members=members)


def input_length(config: DeploymentConfig, encoder: DistributedEncoder | None) -> int:
    """Ring elements per client input: the padded length of ``encoder`` or ``model.dim``."""
    return config.model.dim if encoder is None else encoder.padded


@dataclass(frozen=True)
class DistributedRingInputs:
    """A client's :class:`~sharefl.deploy.client.RingInputs` of the discrete pipeline: clip,
    rotate with the round's public seed, scale, round (invariant R), add its noise share
    (when ``noise``: Byzantine clients of a simulation add none) drawn from a fresh
    :class:`~sharefl.privacy.secure_random.SecureRandom` keyed from OS entropy, reduce mod
    2^b with secret high bits (invariant H)."""

    encoder: DistributedEncoder
    noise: bool = True
    single_clustering: bool = True
    """σ was calibrated for cells of s − t members, which only one clustering per round
    guarantees: the client then refuses plans with more (R > 1 was calibrated for cells of
    one member, any R)."""

    def tighten(self, policy: ClientPolicy) -> ClientPolicy:
        """No cluster and no recoverable sum of fewer than s members (the noise shares
        are sized for s − t of them), and one clustering when the calibration assumed it."""
        single = 1 if self.single_clustering else None
        return policy.requiring(self.encoder.config.min_survivors, max_reclusterings=single)

    @property
    def length(self) -> int:
        return self.encoder.padded

    @property
    def bits(self) -> int:
        return self.encoder.ring_bits

    def encode(self, update: np.ndarray, seed: bytes) -> np.ndarray:
        from sharefl.privacy.secure_random import SecureRandom

        return self.encoder.encode(update, seed, SecureRandom(), noise=self.noise)


@dataclass(frozen=True)
class NoisyTrainer:
    """A user's trainer with the ring inputs of a deployment's ``[privacy]`` table: the
    trainer returns its float update as always; the client then encodes it with its noise
    (``sharefl client --deployment FILE``)."""

    trainer: Any
    ring_inputs: DistributedRingInputs

    def __call__(self, model: np.ndarray, *, round: int, client_id: int) -> np.ndarray:
        return np.asarray(self.trainer(model, round=round, client_id=client_id))
