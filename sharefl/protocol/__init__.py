"""Sans-IO secure aggregation inside random clusters (Bonawitz et al. double masking).

- :class:`ClientSession` / :class:`ServerSession`: the state machines; any transport
  (in-process, gRPC, another FL stack) moves their typed messages.
- :class:`RoundCoordinator`: every rule of one round (plan, audit, encoding, routing by
  authenticated sender, release check, decoding), driven by any transport.
- :class:`ClientRound`: a client's guard over a round against the committed
  :class:`RoundPlan` (one cluster per reclustering, sizes, degrees, no downgrade, no
  release that leaks).
- :class:`SecureAggregationSettings`: the rules of every round, one type for every entry
  point (:mod:`sharefl.protocol.settings`).
- :func:`secure_sum`: the in-process driver for simulation and tests.
- :func:`random_clustering`, :func:`audit`, :func:`sample_safe_reclusterings`: SHARE's
  clusters and the audit of what reclustering reveals.
"""

from sharefl.protocol.audit import LeakageReport, audit, sample_safe_reclusterings
from sharefl.protocol.client import ClientPolicy, ClientSession, ClientState, threshold_floor
from sharefl.protocol.client_round import ClientRound
from sharefl.protocol.clustering import Clustering, random_clustering, random_reclusterings
from sharefl.protocol.coordinator import (
    CorruptedCluster,
    Exclusions,
    ReclusteringResult,
    RoundCoordinator,
    RoundResult,
)
from sharefl.protocol.driver import STAGES, SecureSumResult, run_cluster, secure_sum
from sharefl.protocol.errors import (
    ClientRefusal,
    ConfigurationError,
    LeakageError,
    ProtocolError,
    RejectedMessage,
)
from sharefl.protocol.messages import ClusterAssignment
from sharefl.protocol.plan import RoundPlan
from sharefl.protocol.server import ClusterSum, FailedCluster, ServerSession, ServerState
from sharefl.protocol.settings import (
    Planner,
    SecureAggregationSettings,
    SettingsError,
    settings_from,
)

__all__ = [
    "STAGES",
    "ClientPolicy",
    "ClientRefusal",
    "ClientRound",
    "ClientSession",
    "ClientState",
    "ClusterAssignment",
    "ClusterSum",
    "Clustering",
    "ConfigurationError",
    "CorruptedCluster",
    "Exclusions",
    "FailedCluster",
    "LeakageError",
    "LeakageReport",
    "Planner",
    "ProtocolError",
    "ReclusteringResult",
    "RejectedMessage",
    "RoundCoordinator",
    "RoundPlan",
    "RoundResult",
    "SecureAggregationSettings",
    "SecureSumResult",
    "ServerSession",
    "ServerState",
    "SettingsError",
    "audit",
    "random_clustering",
    "random_reclusterings",
    "run_cluster",
    "sample_safe_reclusterings",
    "secure_sum",
    "settings_from",
    "threshold_floor",
]
