"""The same simulation configuration across real processes over gRPC.

``sharefl launch experiments/quickstart.toml`` starts one server and
``clients.total`` client processes on loopback, all from the same file and seed: the server
builds the run's :class:`~sharefl.simulator.federated.loop.Simulation`, every client process
only its own client (:class:`~sharefl.simulator.federated.client.ClientPart`: the training
set partitioned as the run partitions it, its own examples kept, the model, σ); then

* a client process (:class:`SimulationTrainer`, the gRPC client's trainer) trains only its
  own client — honest DP training, or its Byzantine behaviour (label flipping, or an attack
  on its own update: an omniscient attack cannot run in a real deployment) — with its
  Gaussian DP noise drawn from an AES-256-CTR stream keyed from the operating system and
  its batch sampling from a torch generator seeded by it (:func:`secure_client_generator`),
  so neither the server nor another client can regenerate and subtract it; the data
  partition and the initial model still come from the file's seed, which every process
  shares;
* the server (:class:`SimulationStrategy`) receives the cluster sums the protocol
  releases and runs the simulator's own federated round on them
  (:meth:`Simulation.server_round`: the honest participants charged, the configured
  robust rule over cluster means or Zeno++, reclusterings averaged), steps the model and
  evaluates it,
  writing the same ``rounds.jsonl``/``summary.json`` as ``sharefl simulate``. The
  deployment's cluster plans come from the operating system too (no ``reproducible_seed``).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from sharefl.deploy.config import (
    DeploymentConfig,
    ModelSection,
    PrivacySection,
    SecureAggregationSection,
    ServerSection,
)
from sharefl.deploy.distributed import DistributedRingInputs
from sharefl.privacy.client_budget import round_rdp
from sharefl.privacy.secure_noise import SecureGenerator
from sharefl.protocol.budget import ORDERS, PrivacyCharge
from sharefl.protocol.errors import ConfigurationError
from sharefl.protocol.settings import SETTINGS_KEYS
from sharefl.rounds.released import Released
from sharefl.simulator.config import RunConfig, SimulationConfigError, load_runs
from sharefl.simulator.federated.client import ClientPart
from sharefl.simulator.federated.client_noise import run_client_noise
from sharefl.simulator.federated.loop import Simulation
from sharefl.simulator.preflight import check_run
from sharefl.simulator.results import RoundRecord, RunWriter, device_description, run_summary


def single_run(path: str | Path, seed: int | None = None) -> RunConfig:
    """The one run of a simulation file to deploy (a grid must be narrowed by ``seed``),
    checked before any data loads (:func:`~sharefl.simulator.preflight.check_run`): a run
    of another loop than the federated one is refused (only that loop has a deployment)."""
    runs = load_runs(path)
    if seed is not None:
        runs = [r for r in runs if r.seed == seed]
    if len(runs) != 1:
        raise SimulationConfigError(
            f"{path} describes {len(runs)} runs; a deployment runs exactly one "
            "(remove the lists, or pick a seed)"
        )
    loop = runs[0].algorithm.name
    if loop != "federated":
        raise SimulationConfigError(
            f'{path} runs the {loop} loop ([algorithm] name = "{loop}"); sharefl launch and '
            "serve deploy the federated loop only: run it with sharefl simulate"
        )
    check_run(runs[0])
    return runs[0]


def deployment_section(run: RunConfig) -> SecureAggregationSection:
    """The deployment's ``[secure_aggregation]`` of ``run``: every key of the run's settings
    as parsed (so the server's ``round_settings`` are the run's), checked before any data
    loads. What a deployment cannot run is refused, naming the key: ``cluster_size`` 1,
    ``enabled = false`` (a deployment always runs the protocol), ``clustering`` other than
    ``"random"`` (the server draws a plan for every new model and reuses it only while the
    model is unchanged), ``signed`` (the processes of a simulation file have no
    identities), ``planner = "isolate"`` (refused by the section) and ``privacy.clipping =
    "quantile"`` (its bound is the server's, updated from every client's noisy counts, which
    the deployment's messages do not carry).

    Raises :class:`SimulationConfigError` saying what to change."""
    if run.privacy.enabled and run.privacy.clipping == "quantile":
        raise SimulationConfigError(
            'privacy.clipping = "quantile" adapts one bound from every client\'s noisy counts '
            "each round, which a deployment's messages do not carry: run it with sharefl "
            "simulate, or deploy with a fixed clipping mode"
        )
    sa = run.secure_aggregation
    if sa.cluster_size < 2:
        raise SimulationConfigError("a deployment needs secure_aggregation.cluster_size >= 2")
    if not sa.enabled:
        raise SimulationConfigError(
            "secure_aggregation.enabled = false adds the sums in the clear, which only a "
            "simulation does: a deployment always runs the protocol (remove the key)"
        )
    if sa.clustering != "random":
        raise SimulationConfigError(
            f'secure_aggregation.clustering = "{sa.clustering}" is a simulation schedule; a '
            "deployment draws new clusters for every new model (and reuses them only while "
            'the model is unchanged): use clustering = "random" (the default)'
        )
    if sa.signed:
        raise SimulationConfigError(
            "secure_aggregation.signed needs each client's identity and a directory (sharefl "
            "keygen, then sharefl serve with [tls]); the processes of a simulation file have "
            "none: remove the key, or deploy with a deployment file"
        )
    try:
        return SecureAggregationSection(**{key: getattr(sa, key) for key in SETTINGS_KEYS})
    except ConfigurationError as exc:
        raise SimulationConfigError(str(exc)) from exc


def deployment_for(run: RunConfig, simulation: Simulation) -> DeploymentConfig:
    """The gRPC deployment of ``run`` (``simulation``: the server's, built from it): every
    client in every round, its clusters (:func:`deployment_section`); with a discrete
    ``privacy.distributed`` its ``[privacy]`` table, σ as the simulation calibrated it, so
    that the server's pipeline (:func:`~sharefl.deploy.distributed.deployment_encoder`) is
    the clients' own.

    Raises :class:`SimulationConfigError` saying what to change."""
    section = deployment_section(run)
    if run.clients.per_round:
        raise SimulationConfigError(
            "a deployment uses every client each round: set clients.per_round = 0"
        )
    ring = simulation.ring_encoder
    privacy = PrivacySection()
    if ring is not None:
        c = ring.config
        privacy = PrivacySection(
            distributed=c.mechanism.value,
            clip=c.clip,
            noise_multiplier=c.noise_multiplier,
            bits=c.bits,
            rotation=c.rotation.value,
            min_survivors=c.min_survivors,
            colluders=c.colluders,
        )
        if section.bits != privacy.ring_bits:
            raise SimulationConfigError(
                f"privacy.bits = {c.bits} is carried in {privacy.ring_bits}-bit words: "
                f"set secure_aggregation.bits = {privacy.ring_bits}"
            )
    try:
        return DeploymentConfig(
            server=ServerSection(
                address=run.deployment.address,
                clients=run.clients.total,
                rounds=run.rounds,
                connect_timeout_s=run.deployment.connect_timeout_s,
                stage_timeout_s=run.deployment.stage_timeout_s,
            ),
            model=ModelSection(dim=simulation.dim),
            secure_aggregation=section,
            privacy=privacy,
        )
    except ConfigurationError as exc:
        raise SimulationConfigError(str(exc)) from exc


class SimulationStrategy:
    """The gRPC server's :class:`~sharefl.deploy.strategy.ServerStrategy` for a run.

    Args:
        run: the run; ``out`` (optional) receives ``rounds.jsonl`` and ``summary.json``.
    """

    def __init__(self, run: RunConfig, out: str | Path | None = None) -> None:
        self.simulation = Simulation(run)
        self.run = run
        self.folder = None if out is None else Path(out)
        self.writer = None if self.folder is None else RunWriter(self.folder)
        self.records: list[RoundRecord] = []
        if self.writer is not None:
            self.writer.start(run.to_dict())
        self.started = time.perf_counter()

    @property
    def dim(self) -> int:
        return self.simulation.dim

    def check(self, clusters: int) -> None:
        """Raise ``ValueError`` when the run's rule cannot aggregate ``clusters`` sums."""
        self.simulation.check_clusters(clusters)

    def initial_model(self) -> np.ndarray:
        return self.simulation.model_vector.detach().cpu().numpy().astype(np.float32)

    def apply(
        self, model: np.ndarray, round_index: int, released: Released
    ) -> tuple[np.ndarray, np.ndarray | None, str]:
        """The loop's federated round over ``released``
        (:meth:`~sharefl.simulator.federated.loop.Simulation.server_round`, the in-process
        recipe, also when nothing was released: a zero aggregate, server momentum, the
        accountant, evaluation when due); ``(new model, the aggregate or None when nothing
        was released, a note with the test accuracy when evaluated)``."""
        sim = self.simulation
        sim.set_model(model)
        sim.set_round(round_index)
        record, aggregate = sim.server_round(released)
        note = ""
        if record.accuracy is not None:
            record = dataclasses.replace(record, seconds=time.perf_counter() - self.started)
            self.records.append(record)
            if self.writer is not None:
                self.writer.record(record)
            eps = "" if record.epsilon is None else f", ε {record.epsilon:.3g}"
            note = f", test accuracy {record.accuracy:.4f}{eps}"
            if record.round == self.run.rounds:
                self._write_summary(record)
        # the stepped model's own memory (a new array every round, never written in place)
        new = np.asarray(sim.model_vector.detach().cpu().numpy(), dtype=np.float32)
        return new, aggregate.detach().cpu().numpy() if released else None, note

    def _write_summary(self, last: RoundRecord) -> None:
        if self.writer is None:
            return
        run, sim = self.run, self.simulation
        summary = run_summary(
            sim,
            last,
            [r.accuracy for r in self.records if r.accuracy is not None],
            label=f"{run.label} (gRPC)" if run.label else "gRPC",
            device=device_description(sim.device) + f", {run.clients.total} client processes",
        )
        summary["paper"] = None
        self.writer.finish(summary)


def secure_client_generator(device: torch.device | str = "cpu") -> SecureGenerator:
    """What a real client process draws its randomness from: a
    :class:`~sharefl.privacy.secure_noise.SecureGenerator`, whose Gaussian DP noise
    (DP-SGD, client-level shares) comes from an AES-256-CTR stream keyed from
    ``os.urandom`` and whose torch state (batch sampling) is seeded with 64 bits from
    ``secrets``. Nothing of it derives from the configuration, so neither the server nor
    another client can regenerate the noise."""
    return SecureGenerator(device)


class SimulationTrainer:
    """The gRPC client's trainer for client ``client_id`` of a run (see module doc): its
    :class:`~sharefl.simulator.federated.client.ClientPart` (``self.client``), drawing from
    :func:`secure_client_generator` (``self.randomness``).

    Raises:
        SimulationConfigError: ``client_id`` outside the run."""

    def __init__(self, run: RunConfig, client_id: int) -> None:
        self.client = ClientPart(run, client_id)
        self.randomness = secure_client_generator(self.client.device)
        self.client.use_generator(self.randomness)
        self.client_id = client_id
        encoder = self.client.ring_encoder
        self.ring_inputs = (
            None
            if encoder is None
            else DistributedRingInputs(
                encoder,
                noise=client_id < run.clients.honest,
                single_clustering=run.secure_aggregation.reclusterings == 1,
            )
        )

    def privacy_charge(self, round: int) -> PrivacyCharge | None:
        """The Rényi DP of one round of the noise this client adds itself, at
        :data:`sharefl.protocol.budget.ORDERS` (``sharefl client --max-epsilon`` charges it
        to the client's own budget); ``None`` for a client that adds no noise."""
        client, run = self.client, self.client.run
        if not run.privacy.enabled or not client.honest:
            return None
        examples = len(client.setup.part(self.client_id))
        noise = run_client_noise(
            run, examples, noise_multiplier=client.setup.privacy.sigma(round), dim=client.dim
        )
        return PrivacyCharge(round_rdp(noise, orders=ORDERS))

    def __call__(self, model: np.ndarray, *, round: int, client_id: int) -> np.ndarray:
        """The upload of this trainer's client from ``model`` (float32 ``[d]``, read in
        place: no copy on the way in) as float32; the tensor's own memory is returned
        (no copy on the way out)."""
        client = self.client
        upload = client.update(torch.as_tensor(model, device=client.device), round)
        return np.asarray(upload.detach().cpu().numpy(), dtype=np.float32)
