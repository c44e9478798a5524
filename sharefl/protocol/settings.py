"""The one settings type of secure aggregation, its defaults and its validation.

Every entry point reads the rules of a round from :class:`SecureAggregationSettings`:

- the protocol (:class:`~sharefl.protocol.coordinator.RoundCoordinator`,
  :func:`~sharefl.protocol.coordinator.plan_round`) and the in-process driver
  (:func:`~sharefl.protocol.driver.secure_sum`, which also builds it from keywords);
- the ``[secure_aggregation]`` table of a simulation file
  (:class:`~sharefl.simulator.config.SecureAggregationConfig`) and of a deployment file
  (:class:`~sharefl.deploy.config.SecureAggregationSection`): both *are* this type (a
  subclass), plus only what their transport alone needs, so one table parses into it with
  one set of defaults and one validation;
- the Flower integration (:class:`~sharefl.integrations.flower.ShareflWorkflow` and
  ``ShareflStrategy``: this object, or the same keywords).

A loop or transport that cannot honour a key refuses it with a named error that says what
to change; none ignores one (``tests/test_settings_keys.py`` walks every field through every
entry point). The keys are documented once, in docs/architecture.md ("Secure aggregation
settings"); the docstring of :class:`SecureAggregationSettings` states each contract.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sharefl.protocol.errors import ConfigurationError

RING_BITS = (32, 64)
"""The ring widths b of Z_2^b the protocol sums in."""


class Planner(enum.StrEnum):
    """How the R clusterings of a round are drawn (a ``str`` enum: ``Planner("safe")``
    parses the word a configuration file uses, and a planner compares equal to it)."""

    RANDOM = "random"
    """Independent uniformly random partitions (R > 1 usually leaks: the audit refuses)."""
    SAFE = "safe"
    """R = 1: a random partition; R > 1: :func:`~sharefl.protocol.audit.
    sample_safe_reclusterings`, reclusterings that together leak nothing."""
    ISOLATE = "isolate"
    """:data:`SAFE`, with the suspects of the :class:`~sharefl.protocol.isolation.Suspicion`
    passed to :func:`~sharefl.protocol.coordinator.plan_round` spread over the clusters
    (R = 1) or the sampler's blocks (R > 1), to pin a client whose clusters are flagged
    round after round (:mod:`sharefl.protocol.isolation`). Without a suspicion it is
    :data:`SAFE`; only :func:`~sharefl.protocol.driver.secure_sum` (its ``suspicion``)
    keeps one across rounds, so the simulator, the gRPC server and the Flower workflow
    refuse it."""


class KeySetup(enum.StrEnum):
    """When clients set up their keys, which fixes a round's exchanges (a ``str`` enum: a
    file writes the value)."""

    PER_CLUSTER = "per-cluster"
    """Bonawitz et al.: fresh keys per cluster — advertise keys, share keys, masked input,
    unmask: four exchanges with each client, five signed (wire version 4)."""
    ONCE = "once"
    """Keys set up once per client and scope (:mod:`sharefl.protocol.keys`): the
    assignment carries them and the reply is the masked input with its shares; then unmask
    — two exchanges, three signed (wire version 5)."""

    @property
    def version(self) -> int:
        """The protocol version bound into every key context."""
        from sharefl.crypto.kdf import PROTOCOL_VERSION, TWO_EXCHANGE_VERSION

        return TWO_EXCHANGE_VERSION if self is KeySetup.ONCE else PROTOCOL_VERSION

    def exchanges(self, signed: bool) -> int:
        """Exchanges (server request, client reply) with each client per round: 4, or 5
        signed (per cluster); 2, or 3 signed (once). Signed mode needs one more because
        the survivor list exists only once the inputs are in, and each client must see it
        signed by t others before it reveals anything."""
        if self is KeySetup.ONCE:
            return 3 if signed else 2
        return 5 if signed else 4


@dataclass(frozen=True)
class SecureAggregationSettings:
    """The rules of every round: one typed place for what any transport configures.

    Build it directly, with :func:`settings_from` (an object or keywords), or from a
    ``[secure_aggregation]`` table (the configuration sections subclass it). Every field
    has one default, used by every entry point (``secure_sum``'s keyword form derives
    ``bits`` and ``clip`` from its inputs instead: see its docstring).

    Attributes:
        cluster_size: m, clients per cluster (SHARE). 1 means no secure aggregation at all
            (each input is its own sum, by design; the loops then sum in the clear and the
            other keys have nothing to act on); otherwise ``min_sum_size <= m``.
        reclusterings: R >= 1 clusterings of the same inputs per round.
        threshold: t of Shamir's secret sharing in every cluster (>= 1); ``None`` (or 0
            in a file): the clients' floor (:func:`~sharefl.protocol.client.
            threshold_floor`).
        raise_threshold_to_floor: a cluster whose floor exceeds ``threshold`` uses its
            floor (clusters vary in size: a plan of n clients in clusters of m has some of
            up to 2m − 1); ``False``: such a cluster is refused
            (:class:`~sharefl.protocol.errors.ConfigurationError` naming the range).
        bits: b, the ring Z_2^b every input and sum lives in (32 or 64).
        clip: the per-coordinate bound of *float* inputs, which fixes the fixed-point
            encoding (:func:`~sharefl.crypto.encoding.choose_encoding`); inputs that are
            already ring elements (integers mod 2^b: sign messages, distributed-DP ring
            words) are summed as they are and do not use it. ``None``: ring inputs only.
        signed: untrusted-server mode: signed key advertisements and the consistency
            check (Bonawitz et al., §4.3); needs identities and a directory.
        neighbour_degree: k >= 1: SecAgg+ masking on a random k-regular graph per
            cluster (Bell et al.); ``None`` (or 0 in a file): complete graph.
        min_sum_size: no individual update and no sum of fewer than this many clients
            may become recoverable from what a round releases (>= 2; the release audit,
            :mod:`sharefl.protocol.audit`).
        planner: how the clusterings are drawn (:class:`Planner`; a file writes its
            value, e.g. ``"safe"``).
        allow_leakage: run and release even when the audit finds a leak (reported only).
        colluders: c >= 0, the clients colluding with the server that the plan and every
            release must resist (no update may follow from the sums and c colluders'
            inputs). ``None``: the clients' default rule
            (:func:`~sharefl.protocol.client.default_colluders` under ``signed``), taken
            at its largest over the participants
            (:func:`~sharefl.protocol.coordinator.round_colluders`).
        atoms: draw every cluster as a union of fixed atoms of clients
            (:mod:`sharefl.protocol.atoms`), so that across any number of rounds the server
            learns nothing finer than atom sums. ``None``: the transport's default
            (:meth:`atoms_on`: on in every deployment — ``sharefl serve``/``launch``
            and Flower — off in simulations, which keep the papers' per-client
            reclustering).
        key_setup: when clients set up keys (:class:`KeySetup`; a file writes its
            value): ``"per-cluster"`` (Bonawitz et al.: four exchanges a round) or
            ``"once"`` (the two-exchange round: keys set up once per client, shares sent
            with the masked input, :mod:`sharefl.protocol.keys`; three exchanges in signed
            mode, whose consistency check needs its own).
        atom_size: the size new atoms are formed at; ``None`` (or 0 in a file): the
            smallest safe size (:func:`~sharefl.protocol.atoms.atom_floor`). Must be at
            least that floor.

    Raises :class:`SettingsError` (a :class:`ConfigurationError`) naming the first key
    whose value cannot run and what to change.
    """

    cluster_size: int = 3
    reclusterings: int = 1
    threshold: int | None = None
    raise_threshold_to_floor: bool = True
    bits: int = 32
    clip: float | None = 1.0
    signed: bool = False
    neighbour_degree: int | None = None
    min_sum_size: int = 3
    planner: Planner = Planner.SAFE
    allow_leakage: bool = False
    colluders: int | None = None
    atoms: bool | None = None
    atom_size: int | None = None
    key_setup: KeySetup = KeySetup.PER_CLUSTER

    def __post_init__(self) -> None:
        if isinstance(self.key_setup, str) and not isinstance(self.key_setup, KeySetup):
            words = ", ".join(f'"{p.value}"' for p in KeySetup)
            try:
                object.__setattr__(self, "key_setup", KeySetup(self.key_setup))
            except ValueError:
                raise SettingsError(
                    "key_setup", f"must be one of {words}, got {self.key_setup!r}"
                ) from None
        # Spellings a file uses for "not set" and for the planner, normalised once here so
        # that equal settings compare equal however they were written.
        if isinstance(self.planner, str) and not isinstance(self.planner, Planner):
            words = ", ".join(f'"{p.value}"' for p in Planner)
            try:
                object.__setattr__(self, "planner", Planner(self.planner))
            except ValueError:
                raise SettingsError(
                    "planner", f"must be one of {words}, got {self.planner!r}"
                ) from None
        if not isinstance(self.planner, Planner):
            raise SettingsError("planner", f"must be a Planner, got {self.planner!r}")
        for key in ("threshold", "neighbour_degree", "atom_size"):
            if getattr(self, key) == 0 and not isinstance(getattr(self, key), bool):
                object.__setattr__(self, key, None)
        _check_types(self)
        self._check_values()

    def _check_values(self) -> None:
        _require(self.cluster_size >= 1, "cluster_size", "must be >= 1 (1: no secure aggregation)")
        _require(self.reclusterings >= 1, "reclusterings", "must be >= 1")
        _require(
            self.threshold is None or self.threshold >= 1,
            "threshold",
            "must be >= 1 (omit it, or 0 in a file, for the clients' floor)",
        )
        _require(self.bits in RING_BITS, "bits", f"must be 32 or 64, got {self.bits}")
        _require(
            self.clip is None or (math.isfinite(self.clip) and self.clip > 0),
            "clip",
            f"must be a finite number > 0 (the per-coordinate bound of float inputs), "
            f"got {self.clip}",
        )
        _require(
            self.neighbour_degree is None or self.neighbour_degree >= 1,
            "neighbour_degree",
            "must be >= 1 (omit it, or 0 in a file, for complete masking graphs)",
        )
        _require(
            self.min_sum_size >= 2,
            "min_sum_size",
            f"must be >= 2 (1 would allow releasing single updates); got {self.min_sum_size}",
        )
        _require(
            not (1 < self.cluster_size < self.min_sum_size) or self.allow_leakage,
            "cluster_size",
            f"{self.cluster_size} is below min_sum_size {self.min_sum_size}: every cluster "
            "sum would reveal a sum of too few clients; use larger clusters, lower "
            "min_sum_size, or cluster_size = 1 (no secure aggregation)",
        )
        _require(
            self.colluders is None or self.colluders >= 0,
            "colluders",
            f"must be >= 0 (omit it for the clients' default), got {self.colluders}",
        )
        if self.atom_size is not None:
            floor = self.atom_floor
            _require(
                self.atom_size >= floor,
                "atom_size",
                f"{self.atom_size} is below the safe floor {floor} (min_sum_size "
                f"{self.min_sum_size} honest members after the colluders an atom resists); "
                "omit it for the floor",
            )

    @property
    def atom_floor(self) -> int:
        """The fewest members an atom of these settings may have
        (:func:`~sharefl.protocol.atoms.atom_floor`)."""
        from sharefl.protocol.atoms import atom_floor

        return atom_floor(self.min_sum_size, self.colluders, self.signed)

    def atoms_on(self, deployment: bool) -> bool:
        """Whether rounds draw atom plans: ``atoms`` when set, else ``deployment`` (on in
        every deployment, off in simulations); never without secure aggregation."""
        if not self.secure:
            return False
        return deployment if self.atoms is None else self.atoms

    @property
    def resolved_atom_size(self) -> int:
        """``atom_size`` or, unset, :attr:`atom_floor`."""
        return self.atom_size if self.atom_size is not None else self.atom_floor

    @property
    def version(self) -> int:
        """The wire version of :attr:`key_setup` (bound into every key context)."""
        return self.key_setup.version

    @property
    def secure(self) -> bool:
        """False for cluster_size 1: no secure aggregation by design."""
        return self.cluster_size > 1

    def as_settings(self) -> SecureAggregationSettings:
        """These settings as the plain type (a configuration section drops what only its
        transport uses); equal fields, so ``a.as_settings() == b.as_settings()`` compares
        the protocol's rules alone."""
        if type(self) is SecureAggregationSettings:
            return self
        return SecureAggregationSettings(**{key: getattr(self, key) for key in SETTINGS_KEYS})


class SettingsError(ConfigurationError):
    """A secure aggregation setting that cannot run; ``key`` names it and the message says
    what to change (it starts with the key)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key} {problem}")
        self.key = key


def _require(condition: bool, key: str, problem: str) -> None:
    if not condition:
        raise SettingsError(key, problem)


_TYPES: dict[str, tuple[type, ...]] = {
    "cluster_size": (int,),
    "reclusterings": (int,),
    "threshold": (int, type(None)),
    "raise_threshold_to_floor": (bool,),
    "bits": (int,),
    "clip": (int, float, type(None)),
    "signed": (bool,),
    "neighbour_degree": (int, type(None)),
    "min_sum_size": (int,),
    "allow_leakage": (bool,),
    "colluders": (int, type(None)),
    "atoms": (bool, type(None)),
    "atom_size": (int, type(None)),
    "key_setup": (KeySetup,),
}


def _check_types(settings: SecureAggregationSettings) -> None:
    """Each value of the type its key takes (bools are not integers, and integers are no
    switches): the Python API gets the errors a file gets from its parser."""
    for key, types in _TYPES.items():
        value = getattr(settings, key)
        wrong = not isinstance(value, types) or (bool not in types and isinstance(value, bool))
        if wrong:
            names = " or ".join("None" if t is type(None) else t.__name__ for t in types)
            raise SettingsError(key, f"must be {names}, got {value!r}")
    if isinstance(settings.clip, int):
        object.__setattr__(settings, "clip", float(settings.clip))


SETTINGS_KEYS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(SecureAggregationSettings)
)
"""Every key of :class:`SecureAggregationSettings`, in declaration order."""

DEFAULTS = SecureAggregationSettings()
"""The one default of every key."""


def settings_from(
    settings: SecureAggregationSettings | None = None, keywords: Mapping[str, Any] | None = None
) -> SecureAggregationSettings:
    """The settings of an entry point that takes either the object or its keywords.

    Returns ``settings`` (as the plain type) when given, else
    ``SecureAggregationSettings(**keywords)``. Raises :class:`ConfigurationError` for both
    at once (pass one), and for a keyword the type does not have (naming the known ones);
    :class:`SettingsError` for a value that cannot run.
    """
    keywords = dict(keywords or {})
    if settings is not None:
        if keywords:
            raise ConfigurationError(
                f"pass the SecureAggregationSettings or its keywords, not both: got settings "
                f"and {sorted(keywords)} (use dataclasses.replace(settings, ...) to change "
                "some keys)"
            )
        if not isinstance(settings, SecureAggregationSettings):
            raise ConfigurationError(
                f"settings must be a SecureAggregationSettings, got {type(settings).__name__}"
            )
        return settings.as_settings()
    unknown = sorted(set(keywords) - set(SETTINGS_KEYS))
    if unknown:
        raise ConfigurationError(
            f"unknown secure aggregation setting(s) {unknown}; known: {list(SETTINGS_KEYS)}"
        )
    return SecureAggregationSettings(**keywords)
