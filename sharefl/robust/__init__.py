"""Byzantine-robust aggregation: aggregators, pre-aggregators and the papers' server rules.

Aggregators map the ``n`` rows of a floating tensor ``X`` (shape ``[n, d]``, one update per
row) to one vector ``[d]``; they are typed, frozen dataclasses configured by keyword, kept
on the input's device and dtype, and never modify their input::

    from sharefl.robust import Krum, Median, TrimmedMean
    update = TrimmedMean(f=2)(torch.stack(client_updates))

* coordinate-wise: :class:`Mean` (weighted), :class:`Median`, :class:`TrimmedMean`
  (ByzFL: ``TrMean``), :class:`MeaMed`;
* distance-based: :class:`Krum`, :class:`MultiKrum`, :class:`MDA`,
  :class:`GeometricMedian` (smoothed Weiszfeld, :func:`weiszfeld`),
  :class:`CenteredClipping` (stateful: :class:`CenteredClippingState`);
* pre-aggregators ``[n, d] -> [n', d]``: :class:`NNM`, :class:`Bucketing`,
  :class:`Clipping`, chained to an aggregator by :class:`Pipeline`;
* SHARE: :class:`HierarchicalAggregator` over secure cluster sums (scale convention
  :class:`ClusterScale`, Lemma 2 tolerance :func:`share_tolerance`, reclustering average)
  and :class:`ZenoPlusPlus`;
* the noise-aware two-stage filter of Xiang et al.: :class:`NoiseAwareFilter`;
* RSA / DP-RSA: :class:`RSAMaster` (the master's sign-sum step), :func:`rsa_sign`,
  :func:`rsa_worker_step`;
* decentralized neighbour rules: :class:`DecentralizedTrimmedMean`,
  :class:`SelfCenteredClipping`, :class:`IOS`, :func:`metropolis_hastings_weights`.

Every rule states its breakdown point and raises :class:`AggregationError` (a
``ValueError``) when ``n`` is too small for ``f``. This package depends on neither
:mod:`sharefl.protocol` nor :mod:`sharefl.simulator`.
"""

from sharefl.robust.base import AggregationError, Aggregator, PreAggregator
from sharefl.robust.clipping import CenteredClipping, CenteredClippingState, Clipping
from sharefl.robust.coordinate import MeaMed, Mean, Median, TrimmedMean
from sharefl.robust.decentralized import (
    IOS,
    DecentralizedTrimmedMean,
    SelfCenteredClipping,
    metropolis_hastings_weights,
)
from sharefl.robust.distance import MDA, Krum, MultiKrum, pairwise_sq_distances
from sharefl.robust.geometric import GeometricMedian, WeiszfeldResult, weiszfeld
from sharefl.robust.hierarchical import (
    ClusterScale,
    HierarchicalAggregator,
    prob_always_with_byzantine,
    share_tolerance,
)
from sharefl.robust.noise_filter import NoiseAwareFilter, NoiseFilterResult, NoiseFilterState
from sharefl.robust.preagg import NNM, Bucketing, Pipeline
from sharefl.robust.rsa import RSAMaster, rsa_sign, rsa_worker_step
from sharefl.robust.zeno import ZenoPlusPlus

TrMean = TrimmedMean
"""ByzFL's name for :class:`TrimmedMean`."""

__all__ = [
    "IOS",
    "MDA",
    "NNM",
    "AggregationError",
    "Aggregator",
    "Bucketing",
    "CenteredClipping",
    "CenteredClippingState",
    "Clipping",
    "ClusterScale",
    "DecentralizedTrimmedMean",
    "GeometricMedian",
    "HierarchicalAggregator",
    "Krum",
    "MeaMed",
    "Mean",
    "Median",
    "MultiKrum",
    "NoiseAwareFilter",
    "NoiseFilterResult",
    "NoiseFilterState",
    "Pipeline",
    "PreAggregator",
    "RSAMaster",
    "SelfCenteredClipping",
    "TrMean",
    "TrimmedMean",
    "WeiszfeldResult",
    "ZenoPlusPlus",
    "metropolis_hastings_weights",
    "pairwise_sq_distances",
    "prob_always_with_byzantine",
    "rsa_sign",
    "rsa_worker_step",
    "share_tolerance",
    "weiszfeld",
]
