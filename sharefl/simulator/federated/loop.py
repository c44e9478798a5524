"""The federated loop of one simulated run (:class:`Simulation`), a composition of the
simulator's parts: the run's setup (:mod:`~sharefl.simulator.federated.setup`: data, partitions,
model, privacy plan), the client populations (:mod:`~sharefl.simulator.federated.populations`), the
server (:mod:`~sharefl.simulator.federated.server`: rule, step, evaluation, accountant) and the
round loop (:class:`~sharefl.simulator.stepped.SteppedLoop`); records are
:class:`~sharefl.simulator.results.RoundRecord`.

Each round:

1. sample the participating clients (all, or ``clients.per_round`` of them);
2. the honest participants train together (:class:`~sharefl.simulator.training.
   VectorizedClients`): plain SGD, DP-SGD or the DP filter's normalised DP-SGD with momentum;
3. the Byzantine participants upload what their attack produces: poisoned training
   (label flipping) or an update attack from :mod:`sharefl.simulator.federated.attacks` given the
   honest uploads (omniscient attacker); before ``attack.start_fraction`` of the rounds
   they copy random honest uploads (the DP filter's "time to be Byzantine");
4. aggregation: with secure aggregation (``cluster_size >= 2``) every upload is encoded
   and summed inside random clusters by the real protocol (in-process driver,
   :func:`~sharefl.protocol.driver.secure_sum`), or in the clear with identical ring sums
   when ``secure_aggregation.enabled = false``; the robust rule runs over the cluster
   means (SHARE, :class:`~sharefl.robust.HierarchicalAggregator`) and the reclusterings
   are averaged. Without clusters the rule (or the DP filter's noise-aware filter, which needs
   the individual uploads and the server's auxiliary data) runs over the uploads;
5. the server steps ``w ← w − η_s · (momentum of) aggregate``.

Privacy (``privacy.level``):

- ``"example"`` (DP-SGD): every honest client's accountant composes one Poisson-sampled
  Gaussian mechanism per local step with rate ``q = B / n_i`` (times ``per_round / N``
  when clients are sampled, the instance-level amplification Fed-αCDP uses);
- ``"client"`` (Fed-SDP): the honest clients train in the clear, then every upload is
  clipped to C and noised at the client (:meth:`Simulation.privatize_uploads`); one
  sampled Gaussian mechanism per round with ``q = per_round / N`` (1 when every client
  takes part). Participants are drawn without replacement but accounted as Poisson
  sampling, as Fed-αCDP (and TF-Privacy) do. Fed-αCDP reports Fed-SDP's ε over T + 1
  rounds (101 mechanisms: 0.854 at q = 0.1, σ = 6, δ = 1e-5, classic conversion); this
  engine accounts the T rounds that ran: 100 give 0.849.

``privacy.sample_rate > 0`` replaces the computed q in the accounting and calibration
(the paper's q, e.g. Fed-αCDP's B·K_t/|D| = 0.01: 10⁴ steps at σ = 6, δ = 1e-5, classic
conversion give its ε = 0.823). σ is calibrated to reach ``privacy.epsilon`` after the
last round, and ε spent so far is reported at every evaluation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from sharefl.privacy.distributed import DistributedEncoder
from sharefl.rounds.released import Released
from sharefl.simulator.config import RunConfig
from sharefl.simulator.datasets import Dataset
from sharefl.simulator.federated.populations import ByzantineClients, HonestClients
from sharefl.simulator.federated.server import Ledger, Server
from sharefl.simulator.federated.setup import PrivacyPlan, RunSetup, build_setup
from sharefl.simulator.final_model import FinalModel
from sharefl.simulator.results import RoundRecord
from sharefl.simulator.stepped import SteppedLoop


class Simulation(SteppedLoop):
    """One run of :class:`~sharefl.simulator.config.RunConfig` in this process.

    Parts (public): ``setup`` (:class:`~sharefl.simulator.federated.setup.RunSetup`),
    ``honest_clients``, ``byzantine_clients``, ``server``, ``ledger`` (the accountant).
    State: ``round`` (rounds done), ``generator`` (torch randomness of training, attacks and
    the rule), ``rng`` (client sampling and cluster plans); the global model is
    :attr:`model_vector` (set with :meth:`set_model`).

    Args:
        run: the resolved configuration.
        device: overrides ``run.device``.
        train, test: preloaded datasets (default: loaded from the configuration).

    Raises:
        SimulationConfigError: the configuration does not fit together (e.g. the noise filter with
            clusters, a schedule without privacy).
    """

    algorithm = "federated"

    def __init__(
        self,
        run: RunConfig,
        *,
        device: str | None = None,
        train: Dataset | None = None,
        test: Dataset | None = None,
    ) -> None:
        where, train, test = self.begin(run, device, train, test)
        self.setup: RunSetup = build_setup(run, device=where, train=train, test=test)
        self.generator = torch.Generator(device=self.device).manual_seed(run.seed)
        self.rng = np.random.default_rng(run.seed)
        self.honest_ids = list(range(run.clients.honest))
        self.byzantine_ids = list(range(run.clients.honest, run.clients.total))
        self.honest_clients = HonestClients(self.setup)
        self.byzantine_clients = ByzantineClients(self.setup)
        self.ledger = Ledger(self.setup)
        self.server = Server(self.setup, self.generator)
        self.start_clock()

    # -- what every loop exposes (sharefl.simulator.loops.Loop and the outputs) -------------

    @property
    def device(self) -> torch.device:
        return self.setup.device

    @property
    def model(self):  # FlatModel
        return self.setup.model

    @property
    def test_set(self) -> Dataset:
        test = self.setup.test
        assert test is not None  # build_setup always loads it (a client process's has none)
        return test

    # -- public API of a run (what transports use) -------------------------------------

    @property
    def model_vector(self) -> Tensor:
        """The global model's flat parameters ``[d]`` on :attr:`device`."""
        return self.server.w

    @property
    def dim(self) -> int:
        """d, the number of model parameters."""
        return self.setup.model.dim

    def set_model(self, w: Tensor | np.ndarray) -> None:
        """Replace the global model (e.g. the model a deployment's server holds)."""
        self.server.w = torch.as_tensor(w, device=self.device).to(self.setup.initial.dtype)

    def set_round(self, round_index: int) -> None:
        """Set the number of rounds done (a deployment's server follows its own round)."""
        if round_index < 0:
            raise ValueError(f"round index must be >= 0, got {round_index}")
        self.round = round_index

    def use_generator(self, generator: torch.Generator) -> None:
        """Draw the clients' randomness (DP noise, batches, attacks) from ``generator``, e.g.
        an operating-system-seeded one in a real client process."""
        self.generator = generator

    def check_clusters(self, clusters: int) -> None:
        """Raise the rule's ``ValueError`` when it cannot aggregate ``clusters`` sums."""
        self.server.check_clusters(clusters)

    def replace_privacy_plan(self, plan: PrivacyPlan) -> None:
        """Use ``plan`` from now on, in training and accounting alike (e.g. a test that
        needs σ = 0, which the configuration refuses)."""
        self.honest_clients.plan = plan
        self.byzantine_clients.plan = plan
        self.ledger.plan = plan

    # -- one round ---------------------------------------------------------------------

    def participants(self) -> tuple[list[int], list[int]]:
        """(honest, Byzantine) client ids taking part in this round."""
        per_round = self.run.clients.per_round
        if not per_round:
            return self.honest_ids, self.byzantine_ids
        chosen = np.sort(self.rng.choice(self.run.clients.total, per_round, replace=False))
        h = self.run.clients.honest
        return [int(c) for c in chosen if c < h], [int(c) for c in chosen if c >= h]

    def sigma(self) -> float:
        """σ of this round, from the privacy plan (0 without privacy)."""
        return self.ledger.plan.sigma(self.round)

    def step(self) -> RoundRecord:
        """Run one round in this process (:meth:`server_round`); evaluate when due. Returns
        the round's record."""
        record, _ = self.server_round()
        return record

    def server_round(self, released: Released | None = None) -> tuple[RoundRecord, Tensor]:
        """One federated round: the one recipe of the in-process loop (:meth:`step`) and of
        a deployment's server (``sharefl launch``'s strategy,
        :class:`sharefl.simulation_bridge.SimulationStrategy`).

        1. The participants (:meth:`participants`: every client, or ``clients.per_round``
           of them drawn from :attr:`rng`; a deployment asks every client).
        2. Without ``released``, their uploads are made here (honest training, the
           Byzantine clients' attacks) and aggregated by the server
           (:meth:`~sharefl.simulator.federated.server.Server.aggregate`: with clusters,
           the protocol in process and then the released sums as below). With
           ``released`` (a deployment: the clients trained in their own processes and the
           protocol ran over the transport), the released sums are aggregated
           (:meth:`~sharefl.simulator.federated.server.Server.aggregate_released`).
           Either way the cluster ledgers charge the round's honest participants for the
           sums released (:meth:`~sharefl.simulator.federated.share.ShareAggregation.
           aggregate_released`).
        3. The honest clients' accountant composes one round when any honest client took
           part (:meth:`accountant_step`): the participants not in the Byzantine ids, the
           clients asked to train, whether or not their sums were released.
        4. The model step, and evaluation when due (:meth:`apply`).

        Returns the round's record and the aggregate the model stepped with.

        Raises:
            SimulationConfigError: ``released`` for a run without clusters."""
        honest, byzantine = self.participants()
        ids = honest + byzantine
        if released is None:
            uploads = self.honest_clients.train(honest, self.server.w, self.round, self.generator)
            if byzantine:
                uploads = torch.cat([uploads, self._byzantine_uploads(byzantine, uploads)])
            aggregate = self.server.aggregate(uploads, ids, self.round, self.rng)
        else:
            aggregate = self.server.aggregate_released(released, ids)
        if honest:
            self.accountant_step()
        return self.apply(aggregate), aggregate

    def privatize_uploads(self, uploads: Tensor) -> Tensor:
        """Fed-SDP at the clients, in place, at this round's σ
        (:meth:`~sharefl.simulator.federated.populations.HonestClients.privatize`)."""
        return self.honest_clients.privatize(uploads, self.round, self.generator)

    def accountant_step(self) -> None:
        """Account one round of an honest participant's local steps."""
        self.ledger.step(self.round)

    def apply(self, aggregate: Tensor) -> RoundRecord:
        """The server's step with this round's aggregate; evaluates when due."""
        self.server.step(aggregate)
        self.round += 1
        if not self.evaluation_due():
            return RoundRecord(self.round, None, None, None, self.elapsed())
        accuracy, loss = self.server.evaluate()
        return RoundRecord(self.round, accuracy, loss, self.epsilon(), self.elapsed())

    @property
    def ring_encoder(self) -> DistributedEncoder | None:
        """The discrete pipeline of a discrete ``privacy.distributed`` (σ as calibrated for
        this run), which a deployed client runs before masking (its own:
        :attr:`~sharefl.simulator.federated.client.ClientPart.ring_encoder`, equal);
        ``None`` otherwise."""
        share = self.server.share
        return None if share is None else share.distributed

    def _byzantine_uploads(self, ids: list[int], honest: Tensor) -> Tensor:
        return self.byzantine_clients.uploads(
            ids, honest, self.server.w, self.round, self.generator
        )

    # -- reporting ---------------------------------------------------------------------

    def privacy_summary(self) -> tuple[float | None, dict[str, Any]]:
        """(δ of the reported ε or ``None`` without privacy, the JSON-ready parameters)."""
        return self.ledger.summary()

    def epsilon(self) -> float | None:
        """ε spent so far by each honest client (``None`` without privacy); with the
        cluster noise split, the worst client's ε from the sums really released."""
        share = self.server.share
        if share is not None and share.ledger is not None and self.ledger.sigmas:
            return share.epsilon(self.ledger.plan.delta)
        return self.ledger.epsilon()

    def final_model(self) -> FinalModel:
        """The global model w after the rounds run so far, as the module's ``state_dict``
        (:class:`~sharefl.simulator.final_model.FinalModel`, the server's dtype)."""
        train = self.setup.train
        return FinalModel.from_flat(
            self.setup.model,
            self.model_vector,
            loop="federated",
            describes="the server's global model w",
            run=self.run,
            input_shape=tuple(train.inputs.shape[1:]),
            num_classes=train.num_classes,
            round=self.round,
        )

    @property
    def share(self):  # SHARE's aggregation (simulator/federated/share.py) or None
        return self.server.share

    def extra_summary(self) -> dict[str, Any]:
        """Results beyond accuracy and ε for ``summary.json`` (SHARE: the audit verdict,
        Zeno++ acceptance, per-client ε of the cluster noise split; adaptive clipping: the
        quantile bound C and unclipped fraction of every round)."""
        adaptive = self.honest_clients.clients.adaptive_summary()
        extra = {} if adaptive is None else {"adaptive_clipping": adaptive}
        if self.server.share is None:
            return extra
        delta = self.ledger.plan.delta if self.run.privacy.enabled else None
        return {**extra, "share": self.server.share.summary(delta)}
