"""What one round costs a client, counting only the noise it adds itself.

A client that keeps its own privacy budget (refusing rounds past a ``max_epsilon``) cannot
verify the server's sampling of clients, the other members' noise shares, or how many of
them collude; what it knows is its own mechanism. :func:`round_rdp` is the Rényi DP of
one round of that mechanism alone:

- ``level="example"`` (DP-SGD): ``steps`` Poisson-subsampled Gaussian mechanisms with
  sample rate q = B/n (the client's own batch sampling; no amplification by the server's
  sampling of clients) and noise multiplier σ, composed (RDP adds up order by order);
- ``level="client"``: one Gaussian mechanism per round whose noise is the client's own
  share, of std ``share_std``, against the sensitivity of its clipped update, ``clip``:
  noise multiplier ``share_std / clip`` (σ/√(s − t) for the cluster split, whatever the
  other members add), or, for a discrete share, ``mechanism``'s own RDP (e.g.
  :meth:`~sharefl.privacy.distributed.DistributedEncoder.released_mechanism` with one
  member).

The subsampled Gaussian's RDP is dp-accounting's (through
:class:`~sharefl.privacy.accountant.PrivacyAccountant`); :func:`epsilon_from_rdp` is the
conversion of :func:`~sharefl.privacy.distributed_accounting.rdp_to_epsilon`. Rounds
compose by adding their curves; ε is read off the sum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .accountant import PrivacyAccountant, check_sample_rate
from .distributed_accounting import DEFAULT_ORDERS, RdpMechanism, rdp_to_epsilon
from .errors import PrivacyConfigError
from .vocabulary import Conversion, Level

__all__ = [
    "DEFAULT_ORDERS",
    "ClientNoise",
    "client_noise",
    "epsilon_from_rdp",
    "round_rdp",
]


@dataclass(frozen=True)
class ClientNoise:
    """The noise one client adds in one round.

    Attributes:
        level: ``"example"`` (DP-SGD at every local step) or ``"client"`` (one clipped,
            noised update per round).
        noise_multiplier: σ of DP-SGD (noise std / sensitivity of a step); at client level
            the configured σ of the released sum, kept for reference (the charge uses
            ``share_std``).
        sample_rate: q ∈ [0, 1] of the client's Poisson sampling of its examples (example
            level; 1 at client level).
        steps: mechanisms per round (the local steps at example level; 1 at client level).
        clip: C > 0, the l2 sensitivity of the client's update (client level).
        share_std: std of every coordinate of the client's own noise (client level,
            continuous Gaussian); ``None`` at example level or with ``mechanism``.
        mechanism: a discrete share's RDP mechanism (client level with
            ``privacy.distributed = "discrete_gaussian"`` or ``"skellam"``), in place of
            ``share_std``.

    Raises :class:`PrivacyConfigError` naming the field to change.
    """

    level: Level
    noise_multiplier: float
    sample_rate: float = 1.0
    steps: int = 1
    clip: float = 1.0
    share_std: float | None = None
    mechanism: RdpMechanism | None = None

    def __post_init__(self) -> None:
        if self.level not in ("example", "client"):
            raise PrivacyConfigError(f'level must be "example" or "client", got {self.level!r}')
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier >= 0):
            raise PrivacyConfigError(
                f"noise_multiplier must be finite and >= 0, got {self.noise_multiplier!r}"
            )
        check_sample_rate(self.sample_rate)
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise PrivacyConfigError(f"steps must be an integer >= 1, got {self.steps!r}")
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise PrivacyConfigError(f"clip must be finite and > 0, got {self.clip!r}")
        if self.level == "client":
            if (self.share_std is None) == (self.mechanism is None):
                raise PrivacyConfigError(
                    "client-level noise needs exactly one of share_std (the client's own "
                    "Gaussian share) and mechanism (its own discrete share)"
                )
            if self.share_std is not None and not (
                math.isfinite(self.share_std) and self.share_std >= 0
            ):
                raise PrivacyConfigError(f"share_std must be finite and >= 0, got {self.share_std}")
        elif self.share_std is not None or self.mechanism is not None:
            raise PrivacyConfigError(
                "share_std and mechanism are client-level noise: leave them unset with "
                'level="example" (DP-SGD is charged by noise_multiplier, sample_rate, steps)'
            )


def round_rdp(noise: ClientNoise, *, orders: Sequence[float] = DEFAULT_ORDERS) -> tuple[float, ...]:
    """The RDP of one round of ``noise`` at each of ``orders`` (all > 1), counting only the
    noise the client adds itself (module docstring): one value per order, ``inf`` where
    the client adds no noise, 0 where it samples nothing (q = 0).

    Raises :class:`PrivacyConfigError` for orders that are not all finite and > 1."""
    order_arr = np.asarray(orders, dtype=np.float64).reshape(-1)
    if order_arr.size == 0 or not np.all(np.isfinite(order_arr)) or not np.all(order_arr > 1):
        raise PrivacyConfigError("RDP orders must be a non-empty list of finite values > 1")
    if noise.level == "client":
        if noise.mechanism is not None:
            return tuple(float(v) for v in noise.steps * noise.mechanism.rdp(order_arr))
        assert noise.share_std is not None  # checked by ClientNoise
        sigma, rate = noise.share_std / noise.clip, 1.0
    else:
        sigma, rate = noise.noise_multiplier, noise.sample_rate
    if sigma == 0:
        return tuple(0.0 if rate == 0 else math.inf for _ in order_arr)
    accountant = PrivacyAccountant("rdp", orders=tuple(float(a) for a in order_arr))
    accountant.step(sigma, rate, noise.steps)
    return accountant.rdp_curve()[1]


def epsilon_from_rdp(
    rdp: Sequence[float],
    orders: Sequence[float],
    delta: float,
    *,
    conversion: Conversion = "improved",
) -> float:
    """ε(δ) of an RDP curve (e.g. the sum of a client's :func:`round_rdp` over its rounds):
    :func:`~sharefl.privacy.distributed_accounting.rdp_to_epsilon`, dp-accounting's
    ``compute_epsilon`` (``"improved"``) or Mironov's bound (``"classic"``); ``inf`` when
    the curve is infinite at every order. Raises :class:`PrivacyConfigError` for δ outside
    (0, 1) or one value per order missing."""
    curve = np.asarray(rdp, dtype=np.float64)
    if curve.size and np.all(np.isinf(curve)):
        return math.inf
    return rdp_to_epsilon(orders, curve, delta, conversion)


class PrivacyLike(Protocol):
    """The keys of a ``[privacy]`` table :func:`client_noise` reads (the simulator's
    :class:`~sharefl.simulator.config.PrivacyConfig` has them)."""

    @property
    def level(self) -> str: ...
    @property
    def noise_multiplier(self) -> float: ...
    @property
    def clip(self) -> float: ...


class TrainingLike(Protocol):
    """The keys of a ``[training]`` table :func:`client_noise` reads."""

    @property
    def batch_size(self) -> int: ...
    @property
    def local_steps(self) -> int: ...


def client_noise(
    privacy: PrivacyLike,
    training: TrainingLike,
    *,
    examples: int,
    noise_multiplier: float | None = None,
    share_std: float | None = None,
    mechanism: RdpMechanism | None = None,
) -> ClientNoise:
    """The :class:`ClientNoise` of one client with ``examples`` training examples under a
    ``[privacy]`` and a ``[training]`` table, as the simulator trains it.

    Example level: q = min(1, ``training.batch_size`` / ``examples``) (the client's own
    Poisson rate, without ``privacy.sample_rate``'s or the server's sampling of clients,
    which the client cannot check), ``training.local_steps`` steps, σ =
    ``noise_multiplier`` (the round's σ, e.g. calibrated to a target ε) or
    ``privacy.noise_multiplier``. Client level: the client's own ``share_std`` (or discrete
    ``mechanism``), which depends on the split (``sharefl.simulator.federated.client_noise``
    computes it from a run), against ``privacy.clip``.

    Raises :class:`PrivacyConfigError` when σ is 0 with a target ε (pass the calibrated
    σ), ``examples < 1``, or client level without ``share_std``/``mechanism``."""
    sigma = float(privacy.noise_multiplier if noise_multiplier is None else noise_multiplier)
    target: float = getattr(privacy, "epsilon", 0.0)
    if noise_multiplier is None and sigma == 0 and target > 0:
        raise PrivacyConfigError(
            "privacy.noise_multiplier is 0 because σ is calibrated to privacy.epsilon: pass "
            "the calibrated σ as noise_multiplier"
        )
    if privacy.level == "client":
        return ClientNoise(
            "client", sigma, clip=privacy.clip, share_std=share_std, mechanism=mechanism
        )
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
        raise PrivacyConfigError(f"examples must be an integer >= 1, got {examples!r}")
    return ClientNoise(
        "example",
        sigma,
        sample_rate=min(1.0, training.batch_size / examples),
        steps=training.local_steps,
        clip=privacy.clip,
    )
