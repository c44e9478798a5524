"""The noise one client of a run adds per round, for the budget it charges itself.

:func:`run_client_noise` builds :class:`~sharefl.privacy.client_budget.ClientNoise` from a
run's ``[privacy]`` and ``[training]`` tables and the client's example count, with the
client's own share of the split the run uses; :func:`~sharefl.privacy.client_budget.
round_rdp` then charges it (docs/privacy.md, "What a client charges itself").
"""

from __future__ import annotations

import math

from sharefl.privacy.client_budget import ClientNoise, client_noise
from sharefl.simulator.config import RunConfig, SimulationConfigError
from sharefl.simulator.federated.share import cluster_noise_split, distributed_encoder


def run_client_noise(
    run: RunConfig,
    examples: int,
    *,
    noise_multiplier: float,
    dim: int | None = None,
    participants: int | None = None,
) -> ClientNoise:
    """One client's :class:`ClientNoise` in ``run``: ``examples`` its training examples,
    ``noise_multiplier`` the round's σ (``PrivacyPlan.sigma(round)``: configured or
    calibrated).

    Client level, its own share: σC/√(s − t) with ``privacy.noise_split = "cluster"``
    (:func:`~sharefl.simulator.federated.share.cluster_noise_split`, t the protocol's
    colluder bound unless set); one member's discrete share with a discrete
    ``privacy.distributed`` (needs ``dim``, the model's size); σC/√h with the participants
    split, h = ``participants`` or the honest participants expected per round.

    Raises :class:`SimulationConfigError` when privacy is off or ``dim`` is missing for a
    discrete share."""
    p = run.privacy
    if not p.enabled:
        raise SimulationConfigError("the run adds no noise: set privacy.enabled = true")
    if p.level != "client":
        return client_noise(p, run.training, examples=examples, noise_multiplier=noise_multiplier)
    if p.noise_split == "cluster" and p.distributed != "gaussian":
        if dim is None:
            raise SimulationConfigError(
                f'privacy.distributed = "{p.distributed}": pass dim (the model\'s size) to '
                "size the client's discrete share"
            )
        encoder = distributed_encoder(run, noise_multiplier, dim)
        assert encoder is not None  # a discrete mechanism at client level
        return client_noise(
            p,
            run.training,
            examples=examples,
            noise_multiplier=noise_multiplier,
            mechanism=encoder.released_mechanism(1),
        )
    split = cluster_noise_split(run, noise_multiplier)
    if split is not None:
        share = split.share_std
    else:
        c = run.clients
        h = participants or (c.per_round * c.honest / c.total if c.per_round else c.honest)
        share = noise_multiplier * p.clip / math.sqrt(max(1.0, h))
    return client_noise(
        p, run.training, examples=examples, noise_multiplier=noise_multiplier, share_std=share
    )
