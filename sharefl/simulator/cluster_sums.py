"""One call of the secure-aggregation protocol over a round's uploads, with the run's
``[secure_aggregation]`` settings: shared by the federated server
(:class:`~sharefl.simulator.server.Server`) and SHARE's aggregation
(:mod:`sharefl.simulator.share`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from torch import Tensor

from sharefl.protocol.coordinator import RoundResult
from sharefl.protocol.driver import secure_sum
from sharefl.simulator.config import SecureAggregationConfig


def secure_cluster_sums(
    uploads: Tensor | Mapping[int, np.ndarray],
    ids: Sequence[int],
    settings: SecureAggregationConfig,
    rng: np.random.Generator,
    round_index: int,
    **plan: Any,
) -> RoundResult:
    """:func:`~sharefl.protocol.driver.secure_sum` of ``uploads`` (``[n, d]``, row i from
    client ``ids[i]``, encoded with ``settings.bits`` and ``settings.clip``; or client id →
    ring vector, uint32/uint64, summed as they are) in clusters of
    ``settings.cluster_size``, ``settings.reclusterings`` times, seeded from ``rng``;
    ``plan`` passes ``planner`` / ``clusterings`` through."""
    if isinstance(uploads, Mapping):
        inputs, bits = dict(uploads), None
    else:
        inputs = {cid: uploads[i].detach().cpu().numpy() for i, cid in enumerate(ids)}
        bits = settings.bits
    return secure_sum(
        inputs,
        cluster_size=settings.cluster_size,
        reclusterings=settings.reclusterings,
        seed=int(rng.integers(2**63)),
        bits=bits,
        clip=settings.clip,
        allow_leakage=settings.allow_leakage,
        round=round_index,
        protocol=settings.enabled,
        **plan,
    )
