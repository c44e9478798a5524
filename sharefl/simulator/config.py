"""One TOML file describes a simulation; lists expand into a grid of runs.

Layout (every key optional unless noted; defaults in the dataclasses below)::

    name = "quickstart"          # experiment name (output grouping)
    seed = [1, 2, 3]             # a list anywhere on a scalar key is a grid axis
    rounds = 300
    eval_every = 10
    label = "ε={privacy.epsilon}"  # how runs are named in reports ({dotted.key} fields)

    [data]        dataset, root, partition, partition_options, train_examples, ...
    [model]       name, options, init_seed
    [clients]     honest, byzantine, per_round
    [training]    batch_size, local_steps, learning_rate, upload, sampling
    [privacy]     epsilon or noise_multiplier, delta, clipping, clip, momentum, schedule,
                  level ("example" DP-SGD / "client" Fed-SDP), sample_rate, conversion
    [attack]      name, options, start_fraction
    [secure_aggregation]  the protocol's settings (docs/architecture.md), enabled, clustering
    [aggregator]  name, options, pre
    [server]      learning_rate, momentum
    [deployment]  address, stage_timeout_s, connect_timeout_s (for ``sharefl launch``)
    [algorithm]   name: the loop, "federated" (default), "dp_rsa" or "decentralized"
    [dp_rsa]      method, lr, penalty, epsilon, ... (the DP-RSA loop of Zhu and Ling,
                  :class:`DPRSAConfig`)
    [decentralized]  graph, rule, noise, clip, ... (the decentralized loop of Ye, Zhu and Ling,
                  :class:`DecentralizedConfig`)
    [paper]       "<label>" = accuracy reported by the paper for that label

    [[variant]]   # optional: each variant overrides keys of the base (deep merge)
    label = "no filter"
    aggregator = { options = { first_stage = false } }

The grid is the variants (or the base alone) times the cartesian product of every list
found on a scalar key (lists inside free ``options`` tables are passed through as lists;
vary those with variants). Each run gets a stable ``run_id`` (a hash of its resolved
configuration), so a finished run is recognised and skipped on re-run.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from sharefl.privacy.vocabulary import (
    ADAPTIVE_CLIPPINGS,
    CLIPPINGS,
    DISTRIBUTED_MECHANISMS,
    LEVELS,
    NOISE_SPLITS,
    ROTATIONS,
    SCHEDULES,
    Backend,
    Conversion,
)
from sharefl.protocol.client import default_colluders
from sharefl.protocol.errors import ConfigurationError
from sharefl.protocol.settings import Planner, SecureAggregationSettings
from sharefl.simulator.errors import SimulatorError
from sharefl.simulator.loop_keys import INSTEAD, readers, unread_keys
from sharefl.toml_tables import build_dataclass

_GREEK = str.maketrans(
    {"α": "alpha", "β": "beta", "γ": "gamma", "δ": "delta", "ε": "eps", "η": "eta", "σ": "sigma"}
)


class SimulationConfigError(SimulatorError, ValueError):
    """An invalid simulation configuration; the message names the key and what to change."""


ConfigError = SimulationConfigError
"""Deprecated alias of :class:`SimulationConfigError` (the name clashed with the protocol's
:class:`~sharefl.protocol.errors.ConfigurationError`); removed in 0.3."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise SimulationConfigError(message)


# The words a configuration may use where the library takes a Literal: the field is typed
# with it, and _require_one_of is the one check (type checkers then accept the field
# wherever the library's own Literal is expected, and flag a word it does not know).
Upload = Literal["gradient", "delta"]
Sampling = Literal["poisson", "shuffle", "replay"]


def _require_one_of(value: object, words: Any, key: str) -> None:
    """``value`` is one of the ``Literal`` type ``words``; else say which are allowed."""
    allowed = [f'"{w}"' for w in get_args(words)]
    choices = ", ".join(allowed[:-1]) + f" or {allowed[-1]}"
    _require(value in get_args(words), f"{key} must be {choices}")


@dataclass(frozen=True)
class DataConfig:
    dataset: str = "mnist"
    root: str = ""
    download: bool = True
    options: dict[str, Any] = field(default_factory=dict)  # passed to load_dataset
    partition: str = "iid"
    partition_options: dict[str, Any] = field(default_factory=dict)
    partition_seed: int = -1  # -1: the run's seed
    honest_only: bool = False  # split the data among the honest clients only (the DP filter)
    train_examples: int = 0  # 0: the whole training set (else a random subset)
    test_examples: int = 0
    auxiliary_per_class: int = 0  # the server's clean auxiliary set D_p (noise filter)
    input_mean: list[float] = field(default_factory=list)  # x ← (x − mean)/std per channel
    input_std: list[float] = field(default_factory=list)  # (empty: inputs stay in [0, 1])

    def __post_init__(self) -> None:
        for key in ("train_examples", "test_examples", "auxiliary_per_class"):
            _require(getattr(self, key) >= 0, f"data.{key} must be >= 0")
        _require(
            len(self.input_mean) == len(self.input_std),
            "data.input_mean and data.input_std need the same length (one value per channel)",
        )


@dataclass(frozen=True)
class ModelConfig:
    name: str = "dp_filter_cnn"
    options: dict[str, Any] = field(default_factory=dict)
    init_seed: int = 1234


@dataclass(frozen=True)
class ClientsConfig:
    honest: int = 10
    byzantine: int = 0
    per_round: int = 0  # clients sampled per round (0: all)

    def __post_init__(self) -> None:
        _require(self.honest >= 1, "clients.honest must be >= 1")
        _require(self.byzantine >= 0, "clients.byzantine must be >= 0")
        _require(self.per_round >= 0, "clients.per_round must be >= 0 (0: every client)")
        _require(self.per_round <= self.total, f"clients.per_round must be <= {self.total} clients")

    @property
    def total(self) -> int:
        return self.honest + self.byzantine


@dataclass(frozen=True)
class TrainingConfig:
    batch_size: int = 16
    local_steps: int = 1
    learning_rate: float = 0.1  # the clients' step size (local steps)
    upload: Upload = "gradient"  # one step, or the change after local_steps
    sampling: Sampling = "poisson"  # "replay": the DP filter's code
    # -- SHARE (Velicheti et al.) options; see sharefl.simulator.federated.share --
    momentum: float = 0.0  # local SGD momentum μ (SHARE: 0.9); needs upload = "delta"
    weighted: bool = False  # upload N·(n_i/n)·Δ_i (SHARE's (n_i/n)-weighted deltas)

    def __post_init__(self) -> None:
        _require(self.batch_size >= 1, "training.batch_size must be >= 1")
        _require(0 <= self.momentum < 1, "training.momentum must be in [0, 1)")
        _require(
            self.momentum == 0 or self.upload == "delta",
            'training.momentum is local SGD momentum: set training.upload = "delta"',
        )
        _require(self.local_steps >= 1, "training.local_steps must be >= 1")
        _require(self.learning_rate > 0, "training.learning_rate must be > 0")
        _require_one_of(self.upload, Upload, "training.upload")
        _require_one_of(self.sampling, Sampling, "training.sampling")
        _require(
            self.upload == "delta" or self.local_steps == 1,
            'training.upload = "gradient" needs local_steps = 1; use upload = "delta"',
        )


@dataclass(frozen=True)
class PrivacyConfig:
    """Differential privacy of the honest clients.

    ``level`` picks what is protected:

    - ``"example"``: per-example DP-SGD at every local step (clipping mode ``clipping``,
      bound ``clip``, noise σ_t·S/B); one sampled Gaussian mechanism per local step with
      q = B/|D_i| · per_round/total (Fed-αCDP's instance level);
    - ``"client"``: Fed-SDP (Fed-αCDP §4, after McMahan et al.). The clients train without
      per-example clipping or noise; each honest upload is clipped to l2 norm ``clip`` = C
      and gets its share N(0, σ_t²C²/h) of the noise, h = the round's honest participants,
      so the mean over K = h uploads carries std σ_t·C/K, exactly server-side Fed-SDP's
      aggregate. One sampled Gaussian mechanism per round with q = per_round/total (1 when
      everybody takes part); δ defaults to 1/N^1.1 for N clients. The guarantee is that of
      the *sum*: a single upload carries only σ/√h, so the mean is the only aggregator
      allowed (no clusters, no robust rule).

    ``sample_rate`` > 0 replaces the computed q in the accounting and the calibration (not
    in the training): the paper's accounting, e.g. Fed-αCDP's q₁ = B·K_t/|D| = 0.01 for
    MNIST, where the computed q of its replicated split would be 0.001.
    ``conversion = "classic"`` is the RDP → (ε, δ) bound of TF-Privacy's moments
    accountant, which Fed-αCDP's ε use.

    ``colluders`` is t of the cluster split (``noise_split = "cluster"``): the members of a
    released sum that may add no noise. Omitted (``None``), it is the protocol's colluder
    bound for the run's clusters (:func:`noise_colluders`: ``secure_aggregation.colluders``
    if set, else ⌈m/3⌉ − 1 in signed mode and 0 in unsigned mode), so that the shares, the
    calibration and the reported ε count only the noise of the members the protocol
    assumes honest; an explicit value (0 included) is used as given.
    """

    enabled: bool = False
    epsilon: float = 0.0  # > 0: σ calibrated by the accountant for this target
    delta: float = 0.0  # 0: 1 / |D_i|^1.1 (the DP filter's choice; 1 / N^1.1 at client level)
    noise_multiplier: float = 0.0  # used when epsilon = 0
    clipping: str = "flat"  # one of CLIPPINGS
    clip: float = 1.0
    # options of an adaptive mode (sharefl.privacy.adaptive_clipping): "quantile":
    # count_std (required), target_quantile, learning_rate, initial_norm (default clip);
    # "adaclip": beta1, beta2, h1, h2, initial_variance, max_norm (default 1, not clip)
    clipping_options: dict[str, Any] = field(default_factory=dict)
    momentum: float = 0.0  # the DP filter's per-example momentum β ("normalize")
    schedule: str = "constant"  # one of SCHEDULES
    schedule_options: dict[str, Any] = field(default_factory=dict)
    accountant: Backend = "rdp"
    conversion: Conversion = "improved"  # "classic": RDP only
    level: str = "example"  # "example" (DP-SGD) or "client" (Fed-SDP)
    sample_rate: float = 0.0  # > 0: q of the accounting (the paper's); 0: computed
    # -- client level inside SHARE's clusters (sharefl.privacy.cluster_noise) --
    noise_split: str = "participants"  # or "cluster": each cluster sum carries σ²C²
    min_survivors: int = 0  # s of the cluster split (0: the cluster's Shamir threshold)
    # t < s members per released sum that may add no noise (Byzantine, or colluding with
    # the server). None (omit the key): the protocol's colluder bound, resolved per run by
    # sharefl.simulator.federated.share.noise_colluders (secure_aggregation.colluders if
    # set, else default_colluders(cluster_size, signed): ⌈m/3⌉ − 1 signed, 0 unsigned).
    colluders: int | None = None
    # the noise of the cluster split (sharefl.privacy.distributed): "gaussian" (continuous,
    # float encoding), "discrete_gaussian" or "skellam" (integers mod 2^bits, rotated)
    distributed: str = "gaussian"
    bits: int = 16  # b of the discrete mechanisms' modular sum
    rotation: str = "hadamard"  # or "none"

    def __post_init__(self) -> None:
        _require(
            self.clipping in CLIPPINGS,
            f"privacy.clipping must be one of {', '.join(map(repr, CLIPPINGS))}",
        )
        _require(
            not self.clipping_options or self.clipping in ADAPTIVE_CLIPPINGS,
            f"privacy.clipping_options are the options of an adaptive mode "
            f"({', '.join(map(repr, ADAPTIVE_CLIPPINGS))}); privacy.clipping = "
            f"{self.clipping!r} has none",
        )
        _require(self.epsilon >= 0 and self.noise_multiplier >= 0, "privacy: ε, σ must be >= 0")
        _require(0 <= self.delta < 1, "privacy.delta must be in [0, 1) (0: 1/|D_i|^1.1)")
        _require(self.clip > 0, "privacy.clip must be > 0")
        _require(0 <= self.momentum < 1, "privacy.momentum must be in [0, 1)")
        _require(
            not self.enabled or self.epsilon > 0 or self.noise_multiplier > 0,
            "privacy.enabled needs privacy.epsilon (target) or privacy.noise_multiplier",
        )
        _require_one_of(self.accountant, Backend, "privacy.accountant")
        _require_one_of(self.conversion, Conversion, "privacy.conversion")
        _require(
            self.accountant == "rdp" or self.conversion == "improved",
            'privacy.conversion = "classic" is an RDP bound: set privacy.accountant = "rdp"',
        )
        _require(
            self.sample_rate == 0 or 0 < self.sample_rate <= 1,
            "privacy.sample_rate must be in (0, 1] (or 0: q computed from training.batch_size,"
            " the client's examples and clients.per_round)",
        )
        _require(
            self.schedule in SCHEDULES,
            f"privacy.schedule must be one of {', '.join(map(repr, SCHEDULES))}",
        )
        _require(
            self.level in LEVELS,
            'privacy.level must be "example" (per-example DP-SGD) or "client" (Fed-SDP)',
        )
        _require(
            self.noise_split in NOISE_SPLITS, f"privacy.noise_split must be one of {NOISE_SPLITS}"
        )
        _require(self.min_survivors >= 0, "privacy.min_survivors must be >= 0")
        _require(
            self.colluders is None
            or (isinstance(self.colluders, int) and not isinstance(self.colluders, bool)),
            f"privacy.colluders must be an integer (omit it for the protocol's colluder "
            f"bound), got {self.colluders!r}",
        )
        _require(
            self.colluders is None or self.colluders >= 0,
            "privacy.colluders must be >= 0 (omit it for the protocol's colluder bound)",
        )
        _require(
            self.distributed in DISTRIBUTED_MECHANISMS,
            f"privacy.distributed must be one of {DISTRIBUTED_MECHANISMS}",
        )
        _require(
            self.distributed == "gaussian" or self.noise_split == "cluster",
            f'privacy.distributed = "{self.distributed}" is noise split over a cluster: set '
            'privacy.noise_split = "cluster" (and privacy.level = "client")',
        )
        _require(
            isinstance(self.bits, int) and 2 <= self.bits <= 64,
            "privacy.bits must be an integer in [2, 64]",
        )
        _require(self.rotation in ROTATIONS, f"privacy.rotation must be one of {ROTATIONS}")
        _require(
            self.noise_split == "participants" or self.level == "client",
            'privacy.noise_split = "cluster" is client-level DP: set privacy.level = "client"',
        )
        if self.level == "client":
            _require(
                self.clipping == "flat",
                'privacy.level = "client" clips each whole update to privacy.clip: set '
                f'privacy.clipping = "flat" (got {self.clipping!r}, a per-example mode)',
            )
            _require(
                self.momentum == 0,
                "privacy.momentum is the DP filter's per-example momentum; privacy.level = "
                '"client" has none: set privacy.momentum = 0',
            )


def noise_colluders(privacy: PrivacyConfig, secure_aggregation: SecureAggregationSettings) -> int:
    """t of the cluster split: ``privacy.colluders`` when set, else the protocol's colluder
    bound for the run's clusters: ``secure_aggregation.colluders`` when set, else
    :func:`~sharefl.protocol.client.default_colluders` of ``cluster_size`` in the run's mode
    (⌈m/3⌉ − 1 signed, 0 unsigned; 1 for signed clusters of 4). The protocol's audits
    resist that many colluders per cluster, so the noise is split and accounted as if that
    many members of every released sum added none."""
    if privacy.colluders is not None:
        return privacy.colluders
    if secure_aggregation.colluders is not None:
        return secure_aggregation.colluders
    return default_colluders(secure_aggregation.cluster_size, secure_aggregation.signed)


@dataclass(frozen=True)
class AttackConfig:
    name: str = "none"
    options: dict[str, Any] = field(default_factory=dict)
    start_fraction: float = 0.0  # TTBB: honest behaviour until this fraction of the rounds

    def __post_init__(self) -> None:
        _require(0 <= self.start_fraction < 1, "attack.start_fraction must be in [0, 1)")


@dataclass(frozen=True)
class SecureAggregationConfig(SecureAggregationSettings):
    """``[secure_aggregation]`` of a simulation: the protocol's one settings type
    (:class:`~sharefl.protocol.settings.SecureAggregationSettings`: its keys, defaults and
    checks, documented in docs/architecture.md) plus what only the simulator uses.

    Attributes:
        enabled: run the protocol (``true``), or add each cluster's encoded inputs in the
            clear (``false``: an ablation with identical ring sums, see
            :func:`~sharefl.protocol.driver.secure_sum`'s ``protocol``); needs the
            protocol for ``signed``.
        clustering: SHARE's schedule (:mod:`sharefl.simulator.federated.clustering_schedule`):
            ``"random"`` (new clusters every round), ``"fixed"`` (one clustering, drawn
            once, R = 1) or ``"fixed_plan"`` (round 1's R clusterings reused every round).

    What no simulation loop can honour is refused here, naming the key:
    ``planner = "isolate"`` (no loop keeps a history of flagged clusters). A key the run's
    loop does not read is refused by :func:`expand` (:mod:`sharefl.simulator.loop_keys`:
    the decentralized loop reads none of this table, the DP-RSA loop not ``clustering``);
    what a loop reads but cannot run, by :class:`RunConfig` and the loops.
    """

    enabled: bool = True
    clustering: str = "random"

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ConfigurationError as exc:  # SettingsError: the message starts with the key
            raise SimulationConfigError(f"secure_aggregation.{exc}") from exc
        _require(
            self.planner is not Planner.ISOLATE,
            'secure_aggregation.planner = "isolate" needs a history of flagged clusters '
            'across rounds, which the simulation loops do not keep: use "safe" or "random"',
        )
        _require(
            self.clustering in CLUSTERINGS,
            f"secure_aggregation.clustering must be one of {CLUSTERINGS}",
        )
        _require(
            self.clustering != "fixed" or self.reclusterings == 1,
            'secure_aggregation.clustering = "fixed" is one clustering used in every round '
            "(SHARE's Figure 9 baseline): set secure_aggregation.reclusterings = 1, or "
            'clustering = "fixed_plan" to reuse round 1\'s '
            f"{self.reclusterings} reclusterings in every round",
        )
        _require(
            self.enabled or not self.signed,
            "secure_aggregation.signed runs the protocol's signed mode: set "
            "secure_aggregation.enabled = true (sums in the clear have no signatures)",
        )


@dataclass(frozen=True)
class AggregatorConfig:
    name: str = "mean"
    options: dict[str, Any] = field(default_factory=dict)
    pre: list[str] = field(default_factory=list)  # pre-aggregators: "nnm", "bucketing"


@dataclass(frozen=True)
class ServerConfig:
    learning_rate: float = 1.0
    momentum: float = 0.0
    # > 0: the DP filter's rule η = learning_rate · σ(ε_ref) / σ(ε), tuned once at ε_ref
    noise_reference_epsilon: float = 0.0

    def __post_init__(self) -> None:
        _require(self.learning_rate > 0, "server.learning_rate must be > 0")
        _require(0 <= self.momentum < 1, "server.momentum must be in [0, 1)")
        _require(self.noise_reference_epsilon >= 0, "server.noise_reference_epsilon >= 0")


@dataclass(frozen=True)
class LaunchConfig:
    """The ``[deployment]`` table of a simulation file: how ``sharefl launch`` runs this one
    simulation as local processes (the server section of the
    :class:`~sharefl.deploy.config.DeploymentConfig` it builds).

    Its defaults are for processes on one machine: the port is chosen by the operating
    system, and the waits are longer than a deployment's because every client
    process first loads the data set.
    """

    address: str = "127.0.0.1:0"  # port 0: a free port (launch)
    connect_timeout_s: float = 120.0
    stage_timeout_s: float = 60.0


ALGORITHMS = ("federated", "dp_rsa", "decentralized")
RSA_METHODS = ("rsa", "dp_rsa_f", "dp_rsa_g", "sgd", "signsgd", "sgd_gm")
SIGMA_RULES = ("coordinate", "scalar", "code")
WORKER_SIGNS = ("sent", "true")
RSA_INITS = ("independent", "perturbed", "same")


@dataclass(frozen=True)
class AlgorithmConfig:
    """Which training loop runs: ``[algorithm] name``, one of :data:`ALGORITHMS`.

    ``"federated"`` (default) is :class:`~sharefl.simulator.federated.loop.Simulation`,
    ``"dp_rsa"`` :class:`~sharefl.simulator.dp_rsa.loop.RSALoop` (its parameters:
    ``[dp_rsa]``, :class:`DPRSAConfig`), ``"decentralized"``
    :class:`~sharefl.simulator.decentralized.loop.DecentralizedLoop` (``[decentralized]``,
    :class:`DecentralizedConfig`).
    """

    name: str = "federated"

    def __post_init__(self) -> None:
        _require(self.name in ALGORITHMS, f"algorithm.name must be one of {ALGORITHMS}")


@dataclass(frozen=True)
class DPRSAConfig:
    """The parameters of the DP-RSA loop (Zhu and Ling, ``[algorithm] name = "dp_rsa"``): the
    ``[dp_rsa]`` table.

    ``method`` picks one of the paper's curves: ``rsa`` (no noise), ``dp_rsa_f``
    (Sign-Flipping), ``dp_rsa_g`` (Sign-Gaussian), or the gradient baselines ``sgd`` (mean),
    ``signsgd`` (mean of the gradients' signs) and ``sgd_gm`` (geometric median, Weiszfeld).
    Units: step sizes per iteration, M an l2 bound.

    Attributes:
        lr: α, constant step size (0.01).
        penalty: λ (0.01 on MNIST, 0.002 on CIFAR-10).
        regularization: w of the master's f_0(x) = w‖x‖² (0.002).
        baseline_regularization: give the gradient baselines f_0 too (the code: no).
        epsilon: per-round ε of DP-RSA(F)/(G) (Theorems 1, 2); required for those.
        delta: δ of the composed ε reported over the run.
        grad_bound: M of Theorem 2's Δu = 2αM (the code's 0.01).
        clip_gradients: enforce M by clipping each worker's gradient to l2 norm M.
        sigma_rule: Sign-Gaussian's σ: ``coordinate`` σ_i > max(2|u_i|/3, 4Δu/ε),
            ``scalar`` σ > max(max_i 2|u_i|/3, 4Δu/ε) (Theorem 2 as written, one σ per
            worker), ``code`` the authors' σ_i = max(2u_i/3, 4Δu/ε) with the signed u_i.
        worker_sign: the sign in the worker's own step: ``sent`` (the perturbed one, the
            analysis and the code) or ``true`` (eq. 5's noiseless sign).
        init: the workers' x_k^0: ``same`` as x_0^0 (default; sign(0) = +1 then matters),
            ``independent`` PyTorch initialisations (the MNIST code: measured here, they
            do not reach consensus in 5,000 iterations, x_0 stays at ~9% accuracy), or
            ``perturbed`` x_0 + 0.01·(U[0,1) − 0.5) (the CIFAR-10 code).
        gm_max_iter, gm_tol: the geometric median's Weiszfeld iterations and tolerance.
    """

    method: str = "dp_rsa_g"
    lr: float = 0.01
    penalty: float = 0.01
    regularization: float = 0.002
    baseline_regularization: bool = False
    epsilon: float = 0.0
    delta: float = 1e-5
    grad_bound: float = 0.01
    clip_gradients: bool = False
    sigma_rule: str = "coordinate"
    worker_sign: str = "sent"
    init: str = "same"
    gm_max_iter: int = 80
    gm_tol: float = 1e-5

    def __post_init__(self) -> None:
        _require(self.method in RSA_METHODS, f"dp_rsa.method must be one of {RSA_METHODS}")
        _require(self.lr > 0 and self.penalty > 0, "dp_rsa.lr and dp_rsa.penalty: > 0")
        _require(self.regularization >= 0, "dp_rsa.regularization must be >= 0")
        _require(self.epsilon >= 0, "dp_rsa.epsilon must be >= 0")
        _require(0 < self.delta < 1, "dp_rsa.delta must be in (0, 1)")
        _require(self.grad_bound > 0, "dp_rsa.grad_bound (M) must be > 0")
        _require(self.sigma_rule in SIGMA_RULES, f"dp_rsa.sigma_rule: one of {SIGMA_RULES}")
        _require(self.worker_sign in WORKER_SIGNS, f"dp_rsa.worker_sign: one of {WORKER_SIGNS}")
        _require(self.init in RSA_INITS, f"dp_rsa.init must be one of {RSA_INITS}")
        _require(self.gm_max_iter >= 1 and self.gm_tol >= 0, "dp_rsa.gm_*: bad value")

    def check_method(self) -> None:
        """The method's own needs, checked for a run of the dp_rsa loop only: DP-RSA(F)/(G)
        need ε > 0, and Theorem 2 holds for ε < 8."""
        if self.method in ("dp_rsa_f", "dp_rsa_g"):
            _require(self.epsilon > 0, f"dp_rsa.method = {self.method!r} needs epsilon > 0")
        if self.method == "dp_rsa_g":
            _require(self.epsilon < 8, "Theorem 2 (dp_rsa_g) holds for epsilon in (0, 8)")


DP_RSA_KEYS = frozenset(f.name for f in dataclasses.fields(DPRSAConfig))
"""The keys of ``[dp_rsa]``, which ``[algorithm]`` held before the table existed."""


def _refuse_moved_keys(table: dict[str, Any]) -> None:
    """One line saying how to move the DP-RSA loop's keys that a file of before ``[dp_rsa]``
    wrote under ``[algorithm]`` (in the base or a variant)."""
    algorithm = table.get("algorithm")
    moved = [k for k in algorithm if k in DP_RSA_KEYS] if isinstance(algorithm, dict) else []
    if moved:
        keys = ", ".join(moved)
        raise SimulationConfigError(
            f"[algorithm] holds the DP-RSA loop's keys {keys}, which moved to a [dp_rsa] table: "
            f"keep only name in [algorithm] and write {keys} under [dp_rsa] (a variant's "
            "algorithm = { method = ... } becomes dp_rsa = { method = ... }, a label's "
            "{algorithm.method} becomes {dp_rsa.method})"
        )


# --- decentralized loop (Ye, Zhu and Ling) ---------------------------------------------

DECENTRALIZED_RULES = ("mean", "trimmed_mean", "scc", "ios")
DECENTRALIZED_GRAPHS = ("erdos_renyi", "edges")
DECENTRALIZED_SPLITS = ("iid", "blocks", "by_label")
DECENTRALIZED_ADJACENCIES = ("add_remove", "replace_one")


@dataclass(frozen=True)
class DecentralizedConfig:
    """The decentralized loop of Ye, Zhu and Ling (``[algorithm] name = "decentralized"``,
    :class:`~sharefl.simulator.decentralized.loop.DecentralizedLoop`). Agents are
    ``clients.honest + clients.byzantine``; the attack is ``[attack]``.

    Attributes:
        graph: ``erdos_renyi`` (G(N, p) from ``random.Random(graph_seed)``, redrawn until
            connected, Byzantine agents drawn after it: the authors' code) or ``edges``.
        edge_probability, graph_seed: p and the seed of ``erdos_renyi`` (0.7, 300).
        edges, byzantine_agents: the ``edges`` graph, ``[[a, b], …]``, and its Byzantine
            agents (as many as ``clients.byzantine``).
        rule: the aggregation of every honest agent: ``mean`` (DSGD, Metropolis-Hastings
            weights), ``trimmed_mean``, ``scc``, ``ios`` (q_n = |B_n|).
        noise: C, the broadcast noise std C·α_k (0: no noise).
        clip: M, the per-example gradient clipping norm.
        lr: α_0 of α_k = lr / √(k + 1).
        weight_decay: λ of the λ‖x‖²/2 term (added to the clipped mean gradient).
        scc_tau: SCC's τ (0.1 i.i.d., 0.3 non-i.i.d. in the code).
        init_scale: x_n^0 = init_scale · N(0, I), a generator per agent (model.init_seed + n).
        split: ``iid`` (a random even split over the honest agents), ``blocks``
            (contiguous blocks in dataset order, the code) or ``by_label`` (agent i holds
            the labels ≡ i mod |R|: digit i on MNIST with 10 honest agents).

        With ``attack.name = "none"`` the Byzantine agents and their links are deleted (the
        paper's no-attack setting): the honest agents run on the remaining graph.
        delta, adjacency: δ and the neighbouring-dataset notion of the reported ε.
        dtype: ``float64`` (the code) or ``float32``.
    """

    graph: str = "erdos_renyi"
    edge_probability: float = 0.7
    graph_seed: int = 300
    edges: list[list[int]] = field(default_factory=list)
    byzantine_agents: list[int] = field(default_factory=list)
    rule: str = "ios"
    noise: float = 0.0
    clip: float = 10.0
    lr: float = 0.9
    weight_decay: float = 0.01
    scc_tau: float = 0.1
    init_scale: float = 6.0
    split: str = "iid"
    delta: float = 1e-4
    adjacency: str = "add_remove"
    dtype: str = "float64"

    def __post_init__(self) -> None:
        _require(self.graph in DECENTRALIZED_GRAPHS, f"decentralized.graph: {DECENTRALIZED_GRAPHS}")
        _require(0 < self.edge_probability < 1, "decentralized.edge_probability in (0, 1)")
        _require(self.rule in DECENTRALIZED_RULES, f"decentralized.rule: {DECENTRALIZED_RULES}")
        _require(self.noise >= 0, "decentralized.noise (C) must be >= 0")
        _require(self.clip > 0, "decentralized.clip (M) must be > 0")
        _require(self.lr > 0 and self.scc_tau > 0, "decentralized.lr and scc_tau must be > 0")
        _require(self.weight_decay >= 0 and self.init_scale >= 0, "decentralized: bad value")
        _require(self.split in DECENTRALIZED_SPLITS, f"decentralized.split: {DECENTRALIZED_SPLITS}")
        _require(0 < self.delta < 1, "decentralized.delta must be in (0, 1)")
        _require(
            self.adjacency in DECENTRALIZED_ADJACENCIES,
            f"decentralized.adjacency: {DECENTRALIZED_ADJACENCIES}",
        )
        _require(self.dtype in ("float64", "float32"), "decentralized.dtype: float64 or float32")


@dataclass(frozen=True)
class RunConfig:
    """One fully resolved run (an element of the grid)."""

    name: str = "run"
    seed: int = 0
    rounds: int = 100
    eval_every: int = 10
    label: str = ""
    device: str = "cpu"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    clients: ClientsConfig = field(default_factory=ClientsConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)
    secure_aggregation: SecureAggregationConfig = field(default_factory=SecureAggregationConfig)
    aggregator: AggregatorConfig = field(default_factory=AggregatorConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    deployment: LaunchConfig = field(default_factory=LaunchConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    dp_rsa: DPRSAConfig = field(default_factory=DPRSAConfig)
    decentralized: DecentralizedConfig = field(default_factory=DecentralizedConfig)
    paper: float | None = None  # the paper's accuracy for this run's label

    def __post_init__(self) -> None:
        _require(self.rounds >= 1, "rounds must be >= 1")
        _require(self.eval_every >= 1, "eval_every must be >= 1")
        _require(
            self.attack.name == "none" or self.clients.byzantine > 0,
            f"attack {self.attack.name!r} needs clients.byzantine > 0",
        )
        if self.privacy.enabled and self.privacy.level == "client":
            _check_client_level(self)
        if self.algorithm.name == "dp_rsa":
            self.dp_rsa.check_method()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def noise_colluders(self) -> int:
        """t of the cluster noise split: :func:`noise_colluders` of this run."""
        return noise_colluders(self.privacy, self.secure_aggregation)

    @property
    def partition_seed(self) -> int:
        """The seed of the data partition: ``data.partition_seed``, or the run's seed when
        that is -1."""
        return self.seed if self.data.partition_seed < 0 else self.data.partition_seed

    @property
    def run_id(self) -> str:
        """The run's folder name: a readable prefix (name and label, the name cut first so
        that the label telling a file's runs apart survives; at most
        :data:`RUN_ID_PREFIX_CHARS` characters), then :attr:`run_key`. Greek letters are
        spelled out so that "Fed-αCDP" and "Fed-CDP" get different prefixes."""
        return f"{_readable_prefix(self.name, self.label)}-{self.run_key}"

    @property
    def earlier_run_id(self) -> str:
        """The folder name earlier versions of sharefl gave this run: name and label
        together cut at 60 characters, so a long name hid the label.
        :func:`~sharefl.simulator.runner.run_folder` finds runs finished under it."""
        readable = _slug(f"{self.name}-{self.label}")[:60]
        return f"{readable}-{self.run_key}"

    @property
    def run_key(self) -> str:
        """What identifies the run: ``s<seed>-<hash>``, the first 10 hex digits of the
        SHA-256 of the resolved configuration. Two ids with the same key
        (:func:`run_key_of`) name one run.

        The paper's value is left out of the hash: correcting it must not re-run a finished
        experiment; so are default ``[algorithm]`` and ``[dp_rsa]`` sections (ids from before
        they existed; ``[dp_rsa]``'s keys are hashed as ``[algorithm]``'s, where they were).
        """
        settings = {k: v for k, v in self.to_dict().items() if k != "paper"}
        # ids of runs from before [dp_rsa]: its keys hashed inside [algorithm], and both left
        # out at their defaults (ids of runs from before [algorithm])
        dp_rsa = settings.pop("dp_rsa")
        if self.algorithm == AlgorithmConfig() and self.dp_rsa == DPRSAConfig():
            del settings["algorithm"]
        else:
            settings["algorithm"] = {**settings["algorithm"], **dp_rsa}
        # privacy.colluders = None is the protocol's bound (:func:`noise_colluders`): the id
        # holds the count the cluster split uses (left out where it is the former default 0,
        # and where no split uses it).
        p = self.privacy
        split = p.enabled and p.level == "client" and p.noise_split == "cluster"
        settings["privacy"]["colluders"] = self.noise_colluders if split else p.colluders or 0
        for section, key in _SHARE_KEYS:  # ids of runs from before SHARE's options
            if settings[section][key] == getattr(_SHARE_DEFAULTS_BEFORE[section], key):
                del settings[section][key]
        share = settings["secure_aggregation"]
        for key in ("atoms", "atom_size"):  # ids of runs from before atoms: unset, left out
            if share.get(key) is None:
                share.pop(key, None)
        if share.get("key_setup") == "per-cluster":  # ids of runs from before the choice
            share.pop("key_setup")
        if not settings["privacy"]["clipping_options"]:  # ids from before the adaptive modes
            del settings["privacy"]["clipping_options"]
        if share.get("clustering") == "fixed_plan":  # recorded as "fixed" before the split
            share["clustering"] = "fixed"
        if self.decentralized == DecentralizedConfig():  # likewise
            del settings["decentralized"]
        blob = json.dumps(settings, sort_keys=True, default=str).encode()
        return f"s{self.seed}-{hashlib.sha256(blob).hexdigest()[:10]}"


RUN_ID_PREFIX_CHARS = 120
"""The longest readable prefix of a run id (:attr:`RunConfig.run_id`): with the key, a
folder name stays far below the 255 bytes file systems allow."""


def _slug(text: str) -> str:
    """``text`` with Greek letters spelled out and every run of other characters than
    ASCII letters and digits made one ``-``."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text.translate(_GREEK)).strip("-")


def _readable_prefix(name: str, label: str) -> str:
    """``name-label`` as a slug of at most :data:`RUN_ID_PREFIX_CHARS` characters, the
    name cut first (to no less than 20 characters), then the label."""
    tail = _slug(label)[: RUN_ID_PREFIX_CHARS - 21] if label else ""
    head = _slug(name)[: RUN_ID_PREFIX_CHARS - len(tail) - 1 if tail else RUN_ID_PREFIX_CHARS]
    return "-".join(part for part in (head.strip("-"), tail.strip("-")) if part)


def run_key_of(run_id: str) -> str:
    """The :attr:`RunConfig.run_key` part of a run id (of any version): its last two
    ``-``-separated fields."""
    return "-".join(run_id.rsplit("-", 2)[-2:])


CLUSTERINGS = ("random", "fixed", "fixed_plan")
"""``secure_aggregation.clustering``
(:mod:`sharefl.simulator.federated.clustering_schedule`). Before ``"fixed_plan"`` existed,
``"fixed"`` reused round 1's R clusterings; runs of that kind are now ``"fixed_plan"`` and
keep their ids (:attr:`RunConfig.run_id`), while ``"fixed"`` with R = 1 was and is one
clustering."""

_SHARE_DEFAULTS: dict[str, Any] = {
    "training": TrainingConfig(),
    "privacy": PrivacyConfig(),
    "secure_aggregation": SecureAggregationConfig(),
}
_SHARE_DEFAULTS_BEFORE: dict[str, Any] = {
    **_SHARE_DEFAULTS,
    "privacy": dataclasses.replace(PrivacyConfig(), colluders=0),
}
"""The defaults when runs were recorded: privacy.colluders was 0 until it became the
protocol's colluder bound (``None``)."""
_SHARE_KEYS = (
    ("training", "momentum"),
    ("training", "weighted"),
    ("privacy", "noise_split"),
    ("privacy", "min_survivors"),
    ("privacy", "colluders"),
    ("privacy", "distributed"),
    ("privacy", "bits"),
    ("privacy", "rotation"),
    ("secure_aggregation", "clustering"),
    ("secure_aggregation", "planner"),
    ("secure_aggregation", "threshold"),
    ("secure_aggregation", "raise_threshold_to_floor"),
    ("secure_aggregation", "signed"),
    ("secure_aggregation", "neighbour_degree"),
    ("secure_aggregation", "min_sum_size"),
    ("secure_aggregation", "colluders"),
)
"""Keys added after runs were recorded (SHARE's, then distributed DP's, then the protocol
settings a simulation file gained when ``[secure_aggregation]`` became the protocol's one
settings type): left out of :attr:`RunConfig.run_id` at their defaults."""


def _check_client_level(run: RunConfig) -> None:
    """Fed-SDP splits the noise among the round's honest participants, so only the plain
    mean of the uploads carries N(0, σ²C²/K²): refuse whatever looks at single uploads or
    at partial sums (clusters carry too little noise)."""
    if run.privacy.noise_split == "cluster":  # every cluster sum carries the whole noise
        _require(
            run.secure_aggregation.cluster_size >= 2,
            'privacy.noise_split = "cluster" needs clusters: secure_aggregation.cluster_size >= 2',
        )
        _require(
            run.clients.per_round == 0,
            'privacy.noise_split = "cluster" is accounted under full participation: set '
            "clients.per_round = 0",
        )
        _require(
            run.privacy.schedule == "constant",
            'privacy.noise_split = "cluster" splits a constant σ: set privacy.schedule = '
            '"constant"',
        )
        return
    agg = run.aggregator
    _require(
        agg.name == "mean" and not agg.pre,
        'privacy.level = "client" splits the noise among the participants, so only the '
        f'mean of all uploads is private: set aggregator.name = "mean" (got {agg.name!r}) '
        "and no aggregator.pre",
    )
    _require(
        run.secure_aggregation.cluster_size == 1,
        'privacy.level = "client" adds σC/√K per client, so a cluster sum of m < K clients '
        "would carry too little noise: set secure_aggregation.cluster_size = 1",
    )


_SECTIONS = {f.name: f for f in dataclasses.fields(RunConfig)}


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _axes(
    table: dict[str, Any], prefix: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], list]]:
    """The grid axes: (path, values) of every list on a key whose field is a scalar."""
    axes = []
    for key, value in table.items():
        path = (*prefix, key)
        if isinstance(value, dict) and not _is_free_table(path):
            axes += _axes(value, path)
        elif isinstance(value, list) and not _is_list_field(path):
            _require(len(value) > 0, f"{'.'.join(path)} is an empty list")
            axes.append((path, value))
    return axes


def _field_hint(path: tuple[str, ...]) -> Any:
    cls: Any = RunConfig
    hint: Any = None
    for part in path:
        if not dataclasses.is_dataclass(cls):
            return None
        hints = get_type_hints(cls)
        if part not in hints:
            return None
        hint = hints[part]
        cls = hint
    return hint


def _is_free_table(path: tuple[str, ...]) -> bool:
    return get_origin(_field_hint(path)) is dict


def _is_list_field(path: tuple[str, ...]) -> bool:
    return get_origin(_field_hint(path)) is list


def _set(table: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        table = table[part]
    table[path[-1]] = value


def _lookup(table: dict[str, Any], dotted: str) -> Any:
    value: Any = table
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            section, _, key = dotted.partition(".")
            moved = section == "algorithm" and key in DP_RSA_KEYS
            hint = f" (the DP-RSA keys moved to [dp_rsa]: {{dp_rsa.{key}}})" if moved else ""
            raise SimulationConfigError(f"label refers to unknown key {{{dotted}}}{hint}")
        value = value[part]
    return value


def _format_label(template: str, resolved: dict[str, Any], axes: list[str]) -> str:
    if template:
        return re.sub(
            r"\{([A-Za-z0-9_.]+)\}", lambda m: _fmt(_lookup(resolved, m.group(1))), template
        )
    parts = [f"{a}={_fmt(_lookup(resolved, a))}" for a in axes if a != "seed"]
    return ", ".join(parts) or str(resolved.get("name", "run"))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _refuse_unread(resolved: dict[str, Any]) -> None:
    """Refuse a key the run's loop does not read (:mod:`sharefl.simulator.loop_keys`),
    naming it, the loop and the loops that do read it."""
    algorithm = resolved.get("algorithm", {})
    loop = algorithm.get("name", "federated") if isinstance(algorithm, dict) else "federated"
    unread = unread_keys(resolved, str(loop))
    if not unread:
        return
    table, _, key = unread[0].partition(".")
    written = json.dumps(resolved[table][key], default=str)
    others = readers(unread[0])
    plural = "s read" if len(others) > 1 else " reads"
    where = f" (the {' and '.join(others)} loop{plural} it)" if others else ""
    instead = INSTEAD.get((str(loop), table))
    more = f"; also {', '.join(unread[1:])}" if unread[1:] else ""
    raise SimulationConfigError(
        f"{unread[0]} = {written} is not read by the {loop} loop ([algorithm] name = "
        f'"{loop}"): remove it{where}' + (f"; {instead}" if instead else "") + more
    )


def expand(data: dict[str, Any]) -> list[RunConfig]:
    """The runs of a parsed configuration (see the module docstring)."""
    data = copy.deepcopy(data)
    variants = data.pop("variant", [{}])
    paper = data.pop("paper", {})
    _require(
        isinstance(variants, list) and bool(variants), "[[variant]] must be an array of tables"
    )
    _require(isinstance(paper, dict), "[paper] must be a table of label = accuracy")
    runs: list[RunConfig] = []
    for v_index, variant in enumerate(variants):
        _require(isinstance(variant, dict), f"variant {v_index} must be a table")
        merged = _merge(data, variant)
        unknown = sorted(set(merged) - set(_SECTIONS))
        _require(not unknown, f"unknown key(s) {unknown}; known: {sorted(_SECTIONS)}")
        _refuse_moved_keys(merged)
        axes = _axes(merged)
        names = [".".join(p) for p, _ in axes]
        for combo in itertools.product(*(values for _, values in axes)):
            resolved = copy.deepcopy(merged)
            for (path, _), value in zip(axes, combo, strict=True):
                _set(resolved, path, value)
            resolved["label"] = _format_label(resolved.get("label", ""), resolved, names)
            if resolved.get("paper") is None and resolved["label"] in paper:
                resolved["paper"] = paper[resolved["label"]]
            _refuse_unread(resolved)
            runs.append(build_dataclass(RunConfig, resolved, "", SimulationConfigError))
    ids = [r.run_id for r in runs]
    _require(len(set(ids)) == len(ids), "the grid has duplicate runs; remove repeated values")
    return runs


def load_runs(path: str | Path, overrides: dict[str, Any] | None = None) -> list[RunConfig]:
    """Read a simulation TOML file and expand its grid, with ``overrides`` (tables merged
    key by key, e.g. the command line's ``{"rounds": 20}``) applied to its base; raises
    :class:`SimulationConfigError`. The file is checked as written first, so a bad value
    that an override replaces is still an error naming the file and its key."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SimulationConfigError(f"cannot read {path}: {exc}") from exc
    if not overrides:
        return expand(data)
    try:
        expand(data)
    except SimulationConfigError as exc:
        raise SimulationConfigError(f"{path}: {exc}") from exc
    return expand(_merge(data, overrides))


def is_simulation_config(path: str | Path) -> bool:
    """True if the TOML file is a simulation (has a [data] or [clients] table)."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return False
    return "data" in data or "clients" in data


def default_delta(examples: int) -> float:
    """The DP filter's δ = 1 / n^1.1 for a client holding ``n`` examples."""
    return 1.0 / math.pow(max(2, examples), 1.1)
