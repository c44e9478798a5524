"""Configuration of a deployment: one aggregation server and its clients over gRPC.

A TOML file with six tables; every key is optional except where noted::

    [server]
    address = "127.0.0.1:50051"
    clients = 8               # clients to wait for before the first round
    rounds = 2
    connect_timeout_s = 60.0  # how long to wait for the clients
    stage_timeout_s = 30.0    # a client that misses a stage deadline counts as dropped
    keepalive_s = 20.0        # HTTP/2 pings to each client; a silent one is dropped
    insecure = false          # true: allow plaintext / unsigned / no directory off loopback
    clients_per_round = 0     # k > 0: each round samples k of the connected clients (0: all)
    hello_timeout_s = 10.0    # a stream without a valid Hello by then is closed
    max_unauthenticated = 64  # streams without a Hello yet, at once; more: RESOURCE_EXHAUSTED
    peer_log_lines = 5        # log lines of peers' text per client and round, then a summary
    keep_aggregates = 3       # --out keeps the last k rounds' aggregates (0: none, -1: all)
    max_empty_rounds = 3      # stop (exit 8) after k rounds in a row release no sum (0: never)

    [model]
    dim = 1000                # length of the model / update vector
    learning_rate = 1.0       # model -= learning_rate * aggregate (updates are descent vectors)
    aggregator = "mean"       # "sum" or "mean" (per client) of the released cluster sums

    [secure_aggregation]      # the protocol's settings (SecureAggregationSettings: every key
    cluster_size = 3          # and its one default in docs/architecture.md); m >= 2 here
    clip = 1.0                # per-coordinate bound of the updates; signed needs [tls]
    exclude_after = 1         # rounds named a culprit before a client is excluded (0: never)
    reproducible_seed = 0     # TESTS ONLY: omit it, plans and graphs then come from the OS

    [aggregator]              # optional: a sharefl.robust rule over the released cluster sums
    name = "trimmed_mean"     # any simulation aggregator name; "" (default): model.aggregator
    options = { f = 1 }       # the rule's keywords; f counts corrupted *clusters*
    pre = []                  # pre-aggregators: "nnm", "bucketing"
    scale = "mean"            # the rule runs over cluster means ("mean") or sums ("total")

    [privacy]                 # optional: distributed DP the clients add in the ring
    distributed = "skellam"   # or "discrete_gaussian"; "" (default): none
    clip = 1.0                # l2 bound C of each client's update
    epsilon = 2.0             # σ calibrated to (epsilon, delta) over server.rounds ...
    delta = 1e-5
    noise_multiplier = 0.0    # ... or σ itself (set one of the two)
    bits = 16                 # b: the noisy sum is reduced mod 2^b
    rotation = "hadamard"     # randomised Hadamard before rounding ("none")
    min_survivors = 0         # s: the fewest members a released sum holds (0: protocol's)
    colluders = 1             # t < s members per sum that may add no noise (default: the
                              # protocol's bound, ⌈m/3⌉ − 1 signed, secure_aggregation.colluders)

    [tls]
    cert = "keys/server.pem"  # all three empty: plaintext (loopback testing only)
    key = "keys/server.key"
    client_ca = ""            # set: clients must present a certificate from this CA
    directory = "keys/directory.json"  # client id -> Ed25519 public key; empty: any identity

Unknown keys and bad values raise :class:`ConfigurationError` naming the key.

Secure by default (:func:`check_secure_deployment`): on an address other than loopback the
server refuses plaintext, unsigned mode, a missing identity directory and a
``reproducible_seed`` unless ``server.insecure = true``.
"""

from __future__ import annotations

import ipaddress
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sharefl.protocol.errors import ConfigurationError
from sharefl.protocol.settings import Planner, SecureAggregationSettings, SettingsError
from sharefl.toml_tables import build_dataclass

KEEP_ALL_AGGREGATES = -1
"""``server.keep_aggregates`` value that keeps every round's aggregate file."""
DEFAULT_KEEP_AGGREGATES = 3
"""How many of the latest rounds' aggregate files a results folder keeps by default: a
10^5-parameter model over 200 rounds then holds 3 × 400 kB of aggregates, not 80 MB."""


DEFAULT_MAX_EMPTY_ROUNDS = 3
"""``server.max_empty_rounds``: rounds in a row that release no cluster sum before the server
stops the run (:class:`~sharefl.deploy.errors.RunStalled`); such a run would otherwise go on
unchanged, e.g. a model whose reused plan withholds every sum after a client left."""


def check_keep_aggregates(value: int) -> int:
    """``value`` if it is a valid ``server.keep_aggregates``: -1 (every round's aggregate),
    0 (none) or k >= 1 (the last k). Raises :class:`ConfigurationError` otherwise."""
    _require(
        isinstance(value, int) and not isinstance(value, bool) and value >= KEEP_ALL_AGGREGATES,
        f"server.keep_aggregates must be an integer: k >= 1 keeps the aggregates of the last "
        f"k rounds, 0 keeps none, {KEEP_ALL_AGGREGATES} keeps every round's; got {value!r}",
    )
    return value


@dataclass(frozen=True)
class ServerSection:
    address: str = "127.0.0.1:50051"
    clients: int = 8
    rounds: int = 1
    connect_timeout_s: float = 60.0
    stage_timeout_s: float = 30.0
    keepalive_s: float = 20.0
    insecure: bool = False
    clients_per_round: int = 0
    hello_timeout_s: float = 10.0
    max_unauthenticated: int = 64
    peer_log_lines: int = 5
    keep_aggregates: int = DEFAULT_KEEP_AGGREGATES
    max_empty_rounds: int = DEFAULT_MAX_EMPTY_ROUNDS

    def __post_init__(self) -> None:
        _require(self.clients >= 2, "server.clients must be >= 2")
        _require(self.rounds >= 1, "server.rounds must be >= 1")
        _require(self.connect_timeout_s > 0, "server.connect_timeout_s must be > 0")
        _require(self.stage_timeout_s > 0, "server.stage_timeout_s must be > 0")
        _require(self.keepalive_s >= 1, "server.keepalive_s must be >= 1 (seconds)")
        _require(
            self.clients_per_round == 0 or 2 <= self.clients_per_round <= self.clients,
            "server.clients_per_round must be 0 (every client) or in [2, server.clients]",
        )
        _require(self.hello_timeout_s > 0, "server.hello_timeout_s must be > 0")
        _require(self.max_unauthenticated >= 1, "server.max_unauthenticated must be >= 1")
        _require(self.peer_log_lines >= 1, "server.peer_log_lines must be >= 1")
        check_keep_aggregates(self.keep_aggregates)
        _require(
            self.max_empty_rounds >= 0,
            "server.max_empty_rounds must be >= 0 (k: stop after k rounds in a row that "
            "released no cluster sum the aggregator could use; 0: never stop)",
        )

    @property
    def sampled(self) -> int:
        """How many clients a round samples (``clients`` when ``clients_per_round`` is 0)."""
        return self.clients_per_round or self.clients

    @property
    def loopback(self) -> bool:
        """Whether the address is a loopback one (127.0.0.0/8, ::1, localhost)."""
        return is_loopback(self.address)


@dataclass(frozen=True)
class ModelSection:
    dim: int = 1000
    learning_rate: float = 1.0
    aggregator: str = "mean"

    def __post_init__(self) -> None:
        _require(self.dim >= 1, "model.dim must be >= 1")
        _require(self.aggregator in ("sum", "mean"), 'model.aggregator must be "sum" or "mean"')
        _require(self.aggregator in ("sum", "mean"), 'model.aggregator must be "sum" or "mean"')


@dataclass(frozen=True)
class SecureAggregationSection(SecureAggregationSettings):
    """``[secure_aggregation]`` of a deployment: the protocol's one settings type
    (:class:`~sharefl.protocol.settings.SecureAggregationSettings`: its keys, defaults and
    checks, documented in docs/architecture.md) plus what only the gRPC server uses.

    Attributes:
        exclude_after: rounds a client is named a culprit before later rounds exclude it
            (:class:`~sharefl.protocol.coordinator.Exclusions`; 0: never).
        reproducible_seed: seeds cluster plans and SecAgg+ graphs (tests only; refused off
            loopback by :func:`check_secure_deployment`); ``None``: the operating system.

    What the server cannot honour is refused here, naming the key: ``cluster_size`` 1 (a
    deployment is secure aggregation) and ``planner = "isolate"`` (the server keeps no
    history of flagged clusters across rounds).
    """

    exclude_after: int = 1
    reproducible_seed: int | None = None

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except SettingsError as exc:
            raise ConfigurationError(f"secure_aggregation.{exc}") from exc
        _require(
            self.cluster_size >= 2,
            "secure_aggregation.cluster_size must be >= 2 (a deployment is secure aggregation)",
        )
        _require(
            self.planner is not Planner.ISOLATE,
            'secure_aggregation.planner = "isolate" needs a history of flagged clusters '
            'across rounds, which the gRPC server does not keep: use planner = "safe"',
        )
        _require(self.exclude_after >= 0, "secure_aggregation.exclude_after must be >= 0")


@dataclass(frozen=True)
class AggregatorSection:
    """A robust rule over the released cluster sums (built by the CLI layer, which knows the
    rules by name); an empty ``name`` keeps ``model.aggregator``'s plain sum or mean."""

    name: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    pre: list[str] = field(default_factory=list)
    scale: str = "mean"

    def __post_init__(self) -> None:
        _require(self.scale in ("mean", "total"), 'aggregator.scale must be "mean" or "total"')
        _require(
            bool(self.name) or (not self.options and not self.pre),
            "aggregator.options/pre need aggregator.name",
        )


DISCRETE_MECHANISMS = ("discrete_gaussian", "skellam")


@dataclass(frozen=True)
class PrivacySection:
    """Distributed DP that every client adds to its own update inside the ring before
    masking (:mod:`sharefl.privacy.distributed`), so that each released cluster sum
    carries the noise; the server proposes no float encoding and decodes the sums
    (:mod:`sharefl.deploy.distributed`). ``distributed = ""``: none. σ is
    ``noise_multiplier``, or calibrated to (``epsilon``, ``delta``) over
    ``server.rounds`` by the mechanism's own accounting, for the smallest cell a client
    can be charged in a round (s − t members with one clustering, one with more)."""

    distributed: str = ""
    clip: float = 1.0
    noise_multiplier: float = 0.0
    epsilon: float = 0.0
    delta: float = 1e-5
    bits: int = 16
    rotation: str = "hadamard"
    min_survivors: int = 0
    colluders: int | None = None

    def __post_init__(self) -> None:
        _require(
            self.distributed in ("", *DISCRETE_MECHANISMS),
            'privacy.distributed must be "discrete_gaussian" or "skellam" ("": no noise; '
            'the float "gaussian" split runs from simulation files)',
        )
        if not self.enabled:
            return
        _require(
            (self.noise_multiplier > 0) != (self.epsilon > 0),
            "privacy: set exactly one of noise_multiplier (σ) and epsilon (σ calibrated)",
        )
        _require(self.clip > 0, "privacy.clip (the l2 bound of an update) must be > 0")
        _require(0 < self.delta < 1, "privacy.delta must be in (0, 1)")
        _require(2 <= self.bits <= 64, "privacy.bits must be in [2, 64]")
        _require(self.rotation in ("hadamard", "none"), 'privacy.rotation: "hadamard" or "none"')
        _require(self.min_survivors >= 0, "privacy.min_survivors must be >= 0 (0: default)")
        _require(
            self.colluders is None or self.colluders >= 0,
            "privacy.colluders must be >= 0 (omit it for the protocol's colluder bound)",
        )

    @property
    def enabled(self) -> bool:
        return bool(self.distributed)

    @property
    def ring_bits(self) -> int:
        """The protocol ring whose words carry ``bits``: 32 or 64."""
        return 32 if self.bits <= 32 else 64


@dataclass(frozen=True)
class TLSSection:
    cert: str = ""
    key: str = ""
    client_ca: str = ""
    directory: str = ""

    def __post_init__(self) -> None:
        _require(bool(self.cert) == bool(self.key), "tls.cert and tls.key go together")
        _require(not self.client_ca or bool(self.cert), "tls.client_ca needs tls.cert/key")

    @property
    def enabled(self) -> bool:
        return bool(self.cert)


@dataclass(frozen=True)
class DeploymentConfig:
    """A whole deployment; build with :func:`load_config` or directly."""

    server: ServerSection = field(default_factory=ServerSection)
    model: ModelSection = field(default_factory=ModelSection)
    secure_aggregation: SecureAggregationSection = field(default_factory=SecureAggregationSection)
    tls: TLSSection = field(default_factory=TLSSection)
    aggregator: AggregatorSection = field(default_factory=AggregatorSection)
    privacy: PrivacySection = field(default_factory=PrivacySection)

    def __post_init__(self) -> None:
        if self.privacy.enabled:
            _require(
                self.secure_aggregation.bits == self.privacy.ring_bits,
                f"privacy.bits = {self.privacy.bits} is carried in {self.privacy.ring_bits}-bit "
                f"words: set secure_aggregation.bits = {self.privacy.ring_bits}",
            )
        _require(
            not self.secure_aggregation.signed or bool(self.tls.directory),
            "secure_aggregation.signed needs tls.directory (the clients' identity keys)",
        )
        sa = self.secure_aggregation
        _require(
            self.server.clients_per_round == 0
            or self.server.clients_per_round >= max(sa.cluster_size, sa.min_sum_size),
            f"server.clients_per_round ({self.server.clients_per_round}) must be >= "
            f"secure_aggregation.cluster_size ({sa.cluster_size}) and min_sum_size "
            f"({sa.min_sum_size}): a round needs at least one full cluster",
        )


def is_loopback(address: str) -> bool:
    """Whether ``host:port`` (or ``[v6]:port``) names this machine's loopback interface."""
    host = address.rsplit(":", 1)[0].strip("[]") if ":" in address else address
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def insecure_settings(config: DeploymentConfig) -> list[str]:
    """What in ``config`` is unsafe outside loopback testing (empty: nothing)."""
    problems = []
    if not config.tls.enabled:
        problems.append("plaintext (set tls.cert and tls.key)")
    if not config.secure_aggregation.signed:
        problems.append("unsigned mode (set secure_aggregation.signed = true)")
    if not config.tls.directory:
        problems.append("no identity directory (set tls.directory; any client could take any id)")
    if config.secure_aggregation.reproducible_seed is not None:
        problems.append(
            "a reproducible_seed (the server could predict every cluster: remove it so plans "
            "come from the operating system)"
        )
    return problems


def check_secure_deployment(config: DeploymentConfig) -> list[str]:
    """Refuse an insecure deployment off loopback; returns what is insecure (to warn about).

    Raises :class:`ConfigurationError` when ``server.address`` is not loopback, something of
    :func:`insecure_settings` applies and ``server.insecure`` is not set.
    """
    problems = insecure_settings(config)
    if problems and not config.server.loopback and not config.server.insecure:
        raise ConfigurationError(
            f"refusing to serve on {config.server.address} with "
            + "; ".join(problems)
            + ". Fix these, or set server.insecure = true to run insecurely anyway."
        )
    return problems


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigurationError(message)


def _section(cls: type, table: Any, name: str, base: Path) -> Any:
    def relative_paths(section: type, key: str, value: Any) -> Any:
        if section is TLSSection and value:
            return str((base / value).resolve())  # paths relative to the config file
        return value

    return build_dataclass(cls, table, name, ConfigurationError, leaf=relative_paths)


def load_config(path: str | Path) -> DeploymentConfig:
    """Read a deployment TOML file; raises :class:`ConfigurationError` on any problem."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"cannot read config {path}: {exc}") from exc
    classes = {
        "server": ServerSection,
        "model": ModelSection,
        "secure_aggregation": SecureAggregationSection,
        "tls": TLSSection,
        "aggregator": AggregatorSection,
        "privacy": PrivacySection,
    }
    if "seed" in data.get("secure_aggregation", {}):
        raise ConfigurationError(
            "secure_aggregation.seed was removed: deployments draw cluster plans and SecAgg+ "
            "graphs from the operating system. Delete it; only a test may set "
            "secure_aggregation.reproducible_seed (refused off loopback)."
        )
    unknown = sorted(set(data) - set(classes))
    if unknown:
        raise ConfigurationError(f"unknown table(s) {unknown}; known: {sorted(classes)}")
    return DeploymentConfig(
        **{
            name: _section(cls, data.get(name, {}), name, path.parent)
            for name, cls in classes.items()
        }
    )
