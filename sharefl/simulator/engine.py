"""The federated loop of one simulated run (:class:`Simulation`).

Each round:

1. sample the participating clients (all, or ``clients.per_round`` of them);
2. the honest participants train together (:class:`~sharefl.simulator.training.
   VectorizedClients`): plain SGD, DP-SGD or seed000's normalised DP-SGD with momentum;
3. the Byzantine participants upload what their attack produces: poisoned training
   (label flipping) or an update attack from :mod:`sharefl.simulator.attacks` given the
   honest uploads (omniscient attacker); before ``attack.start_fraction`` of the rounds
   they copy random honest uploads (seed000's "time to be Byzantine");
4. aggregation: with secure aggregation (``cluster_size >= 2``) every upload is encoded
   and summed inside random clusters by the real protocol (in-process driver,
   :func:`~sharefl.protocol.driver.secure_sum`), or in the clear with identical ring sums
   when ``secure_aggregation.enabled = false``; the robust rule runs over the cluster
   means (SHARE, :class:`~sharefl.robust.HierarchicalAggregator`) and the reclusterings
   are averaged. Without clusters the rule (or seed000's noise-aware filter, which needs
   the individual uploads and the server's auxiliary data) runs over the uploads;
5. the server steps ``w ← w − η_s · (momentum of) aggregate``.

Privacy (``privacy.level``):

- ``"example"`` (DP-SGD): every honest client's accountant composes one Poisson-sampled
  Gaussian mechanism per local step with rate ``q = B / n_i`` (times ``per_round / N``
  when clients are sampled, the instance-level amplification seed003 uses);
- ``"client"`` (Fed-SDP): the honest clients train in the clear, then every upload is
  clipped to C and noised at the client (:meth:`Simulation.privatize_uploads`); one
  sampled Gaussian mechanism per round with ``q = per_round / N`` (1 when every client
  takes part). Participants are drawn without replacement but accounted as Poisson
  sampling, as seed003 (and TF-Privacy) do. seed003 reports Fed-SDP's ε over T + 1
  rounds (101 mechanisms: 0.854 at q = 0.1, σ = 6, δ = 1e-5, classic conversion); this
  engine accounts the T rounds that ran: 100 give 0.849.

``privacy.sample_rate > 0`` replaces the computed q in the accounting and calibration
(the paper's q, e.g. seed003's B·K_t/|D| = 0.01: 10⁴ steps at σ = 6, δ = 1e-5, classic
conversion give its ε = 0.823). σ is calibrated to reach ``privacy.epsilon`` after the
last round, and ε spent so far is reported at every evaluation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from sharefl.privacy.accountant import PrivacyAccountant
from sharefl.privacy.calibration import calibrate_noise
from sharefl.privacy.client_level import ClientDPConfig, privatize_update_
from sharefl.protocol.driver import secure_sum
from sharefl.robust import ClusterScale, HierarchicalAggregator, NoiseAwareFilter
from sharefl.simulator import components, share
from sharefl.simulator.attacks import AttackView, LabelFlipping
from sharefl.simulator.cluster_zeno import ClusterZeno, ValidationGradient
from sharefl.simulator.config import ConfigError, RunConfig, default_delta
from sharefl.simulator.datasets import Dataset, load_dataset
from sharefl.simulator.models import build_model
from sharefl.simulator.partition import partition
from sharefl.simulator.training import FlatModel, LocalTraining, VectorizedClients, sample_rate


@dataclass(frozen=True)
class RoundRecord:
    """One round's outcome; accuracy/loss only on evaluation rounds (else ``None``)."""

    round: int  # 1-based
    accuracy: float | None
    loss: float | None
    epsilon: float | None
    seconds: float  # wall time since the start of the run
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "accuracy": self.accuracy,
            "loss": self.loss,
            "epsilon": self.epsilon,
            "seconds": round(self.seconds, 3),
            **self.extra,
        }


@dataclass(frozen=True)
class PrivacyPlan:
    """σ, δ and the sampling rate of the accounted mechanisms (``steps_per_round`` of them
    per round: the local steps at example level, 1 at client level)."""

    noise_multiplier: float
    delta: float
    sample_rate: float
    steps_per_round: int
    target_epsilon: float | None
    level: str = "example"


def resolve_device(name: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N``; :class:`ConfigError` if CUDA is asked for and absent."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda requested but torch.cuda.is_available() is False")
    return device


def load_data(run: RunConfig, device: torch.device) -> tuple[Dataset, Dataset]:
    """(train, test) datasets of the run, subsampled and standardised as configured, on
    ``device``."""
    cfg = run.data
    root = cfg.root or None
    train = load_dataset(cfg.dataset, "train", root=root, download=cfg.download, **cfg.options)
    test = load_dataset(cfg.dataset, "test", root=root, download=cfg.download, **cfg.options)
    rng = np.random.default_rng(run.seed + 7919)
    if cfg.train_examples and cfg.train_examples < len(train):
        train = train.subset(np.sort(rng.choice(len(train), cfg.train_examples, replace=False)))
    if cfg.test_examples and cfg.test_examples < len(test):
        test = test.subset(np.sort(rng.choice(len(test), cfg.test_examples, replace=False)))
    if cfg.input_mean:
        train = train.standardized(cfg.input_mean, cfg.input_std)
        test = test.standardized(cfg.input_mean, cfg.input_std)
    move = lambda d: Dataset(d.name, d.inputs.to(device), d.targets.to(device), d.num_classes)  # noqa: E731
    return move(train), move(test)


class SteppedLoop:
    """What every training loop shares: a wall clock started at construction
    (``self.started``) and running the remaining rounds of ``self.run`` one ``step()`` at
    a time."""

    run: RunConfig
    round: int
    started: float

    def step(self) -> RoundRecord:
        raise NotImplementedError

    def elapsed(self) -> float:
        """Seconds since the loop was built."""
        return time.perf_counter() - self.started

    def run_rounds(self, callback: Callable[[RoundRecord], None] | None = None) -> RoundRecord:
        """Run the remaining rounds; ``callback`` sees every record. Returns the last one."""
        record = None
        while self.round < self.run.rounds:
            record = self.step()
            if callback is not None:
                callback(record)
        assert record is not None
        return record


class Simulation(SteppedLoop):
    """One run of :class:`~sharefl.simulator.config.RunConfig` in this process.

    Args:
        run: the resolved configuration.
        device: overrides ``run.device``.
        train, test: preloaded datasets (default: loaded from the configuration).

    Raises:
        ConfigError: the configuration does not fit together (e.g. the noise filter with
            clusters, a schedule without privacy).
    """

    def __init__(
        self,
        run: RunConfig,
        *,
        device: str | None = None,
        train: Dataset | None = None,
        test: Dataset | None = None,
    ) -> None:
        if run.algorithm.name != "federated":
            raise ConfigError(
                f"Simulation runs the federated loop; [algorithm] name = "
                f"{run.algorithm.name!r} is built by sharefl.simulator.loops.build_loop"
            )
        self.run = run
        self.device = resolve_device(device or run.device)
        if train is None or test is None:
            train, test = load_data(run, self.device)
        self.train_set, self.test_set = train, test
        self.generator = torch.Generator(device=self.device).manual_seed(run.seed)
        self.rng = np.random.default_rng(run.seed)
        clients = run.clients
        self.honest_ids = list(range(clients.honest))
        self.byzantine_ids = list(range(clients.honest, clients.total))

        pool = np.arange(len(train))
        self.auxiliary: Dataset | None = None
        if run.data.auxiliary_per_class:
            aux_idx = self._auxiliary_indices(train.targets.cpu().numpy())
            self.auxiliary = train.subset(aux_idx)
            pool = np.setdiff1d(pool, aux_idx)
        split_among = clients.honest if run.data.honest_only else clients.total
        seed = run.seed if run.data.partition_seed < 0 else run.data.partition_seed
        parts = partition(
            train.targets[pool].cpu().numpy(),
            split_among,
            run.data.partition,
            seed=seed,
            **run.data.partition_options,
        )
        parts = [pool[p] for p in parts]
        honest_parts = parts[: clients.honest]
        byzantine_parts = parts[clients.honest :] if not run.data.honest_only else []
        if run.data.honest_only:  # Byzantine workers draw from the whole training set
            byzantine_parts = [pool] * clients.byzantine
        self.client_sizes = [len(p) for p in honest_parts + byzantine_parts]

        module = build_model(
            run.model.name,
            num_classes=train.num_classes,
            input_shape=tuple(train.inputs.shape[1:]),
            seed=run.model.init_seed,
            **run.model.options,
        ).to(self.device)
        self.model = FlatModel(module)
        self.w = self.model.initial().to(self.device)
        self.velocity = torch.zeros_like(self.w)

        self.client_level = run.privacy.enabled and run.privacy.level == "client"
        self.privacy = self._privacy_plan(min(len(p) for p in honest_parts))
        self.learning_rate = self._server_learning_rate()
        self.clipping = components.build_clipping(run.privacy)
        self.schedule = (
            components.build_schedule(run.privacy, self.privacy.noise_multiplier)
            if run.privacy.enabled
            else 0.0
        )
        self.accountant = (
            PrivacyAccountant(run.privacy.accountant, conversion=run.privacy.conversion)
            if run.privacy.enabled
            else None
        )
        training = self._local_training(run.training.batch_size, None)
        self.honest = VectorizedClients(
            self.model, train.inputs, train.targets, honest_parts, training
        )
        self.attack = components.build_attack(
            run.attack.name, run.attack.options, noise_std=self._upload_noise_std()
        )
        self.byzantine: VectorizedClients | None = None
        if clients.byzantine and (self.attack.label_flipping or self._needs_own()):
            b = self.attack.batch_size or run.training.batch_size
            self.byzantine = VectorizedClients(
                self.model,
                train.inputs,
                train.targets,
                byzantine_parts,
                self._local_training(b, run.training.batch_size),
                label_map=LabelFlipping(train.num_classes) if self.attack.label_flipping else None,
            )
        uses_momentum = isinstance(self.clipping, components.Normalization) and (
            run.privacy.momentum > 0
        )
        self.momentum = (
            torch.zeros(clients.honest, self.model.dim, device=self.device)
            if uses_momentum
            else None
        )
        self._build_aggregation()
        self.started = time.perf_counter()
        self.round = 0

    # -- setup -------------------------------------------------------------------------

    def _auxiliary_indices(self, targets: np.ndarray) -> np.ndarray:
        per_class = self.run.data.auxiliary_per_class
        picks = []
        for c in np.unique(targets):
            members = np.flatnonzero(targets == c)
            picks.append(self.rng.choice(members, min(per_class, len(members)), replace=False))
        return np.sort(np.concatenate(picks))

    def _privacy_plan(self, smallest: int) -> PrivacyPlan:
        """σ (configured or calibrated), δ and q of the run; ``smallest`` is the fewest
        examples an honest client holds (example level: the worst-off client)."""
        p, run = self.run.privacy, self.run
        if not p.enabled:
            return PrivacyPlan(0.0, 0.0, 0.0, run.training.local_steps, None)
        clients = run.clients
        participation = clients.per_round / clients.total if clients.per_round else 1.0
        if self.client_level:  # one mechanism per round over the set of clients
            q, steps_per_round = participation, 1
            delta = p.delta or default_delta(clients.total)
        else:
            q = sample_rate(run.training.batch_size, smallest) * participation
            steps_per_round = run.training.local_steps
            delta = p.delta or default_delta(smallest)
        q = p.sample_rate or q  # the paper's accounting, when configured
        steps = run.rounds * steps_per_round
        sigma = p.noise_multiplier
        target = None
        if p.epsilon > 0:
            target = p.epsilon
            sigma = calibrate_noise(
                p.epsilon, delta, q, steps, p.accountant, conversion=p.conversion
            )
        return PrivacyPlan(sigma, delta, q, steps_per_round, target, p.level)

    def _upload_noise_std(self) -> float:
        """Std of the DP noise on one coordinate of an honest upload (what a Gaussian attack
        with ``std = "dp"`` imitates): σ/B for a DP-SGD gradient, σC/√h for a Fed-SDP
        update shared among the h honest clients expected per round."""
        sigma = self.privacy.noise_multiplier
        if not self.client_level:
            return sigma / self.run.training.batch_size
        clients = self.run.clients
        expected = clients.per_round * clients.honest / clients.total or clients.honest
        return sigma * self.run.privacy.clip / math.sqrt(max(1.0, expected))

    def _server_learning_rate(self) -> float:
        """η_s, rescaled by σ(ε_ref)/σ(ε) under seed000's rule (Eq. 4: η ∝ 1/σ)."""
        s, p = self.run.server, self.privacy
        if not s.noise_reference_epsilon or p.target_epsilon is None:
            return s.learning_rate
        cfg = self.run.privacy
        steps = self.run.rounds * p.steps_per_round
        reference = calibrate_noise(
            s.noise_reference_epsilon,
            p.delta,
            p.sample_rate,
            steps,
            cfg.accountant,
            conversion=cfg.conversion,
        )
        return s.learning_rate * reference / p.noise_multiplier

    def _local_training(self, batch_size: int, denominator: int | None) -> LocalTraining:
        t = self.run.training
        return LocalTraining(
            batch_size=batch_size,
            local_steps=t.local_steps,
            learning_rate=t.learning_rate,
            upload="gradient" if t.upload == "gradient" else "delta",
            sampling=t.sampling,  # validated by TrainingConfig
            clipping=self.clipping,
            noise=0.0 if self.client_level else self.privacy.noise_multiplier,
            denominator=denominator,
            momentum=t.momentum,
        )

    def _needs_own(self) -> bool:
        attack = self.attack.update_attack
        return attack is not None and attack.knowledge.value == "own"

    def _build_aggregation(self) -> None:
        run, agg = self.run, self.run.aggregator
        self.clustered = run.secure_aggregation.cluster_size >= 2
        self.noise_filter: NoiseAwareFilter | None = None
        self.rule = None
        self.share: share.ShareAggregation | None = None  # SHARE hook (simulator/share.py)
        self.cluster_noise = share.cluster_noise_split(run, self.privacy.noise_multiplier)
        if agg.name == "noise_filter":
            if self.clustered:
                raise ConfigError(
                    "the noise filter needs individual uploads: set secure_aggregation."
                    "cluster_size = 1 (its auxiliary-data scores cannot run on cluster sums)"
                )
            if self.auxiliary is None or not run.privacy.enabled:
                raise ConfigError("the noise filter needs data.auxiliary_per_class and privacy")
            self.noise_filter = components.build_noise_filter(
                agg.options,
                noise_multiplier=self.privacy.noise_multiplier,
                batch_size=run.training.batch_size,
                honest=run.clients.honest,
                total=run.clients.total,
            )
            return
        # -- SHARE (seed001) hook: Zeno++, clusterings, audit, cluster DP
        zeno = self._build_zeno() if agg.name == "zeno" else None
        if zeno is None:
            rule = components.build_rule(agg.name, agg.options, agg.pre, self.generator)
            self.rule = (
                HierarchicalAggregator(rule=rule, scale=ClusterScale.MEAN)
                if (self.clustered)
                else rule
            )
        if self.clustered or zeno is not None or run.training.weighted:
            self.share = share.ShareAggregation.build(
                run,
                rule=self.rule,
                zeno=zeno,
                client_sizes=self.client_sizes,
                noise_split=self.cluster_noise,
            )

    def _build_zeno(self) -> ClusterZeno:
        """Zeno++ with its validation set: the server's clean data (data.auxiliary_*)."""
        if self.auxiliary is None:
            raise ConfigError(
                "aggregator zeno needs the server's validation set: set "
                "data.auxiliary_per_class (SHARE: a class-balanced 5 %, e.g. 300 on MNIST)"
            )
        aux = self.auxiliary
        return ClusterZeno.from_options(
            self.run.aggregator.options,
            lr=self.run.server.learning_rate,
            validation_factory=lambda n_s: ValidationGradient(
                self.model, aux.inputs, aux.targets, n_s, self.generator
            ),
        )

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
        """σ of this round (constant or the schedule's value at the round index)."""
        s = self.schedule
        return float(s) if isinstance(s, float | int) else s(self.round)

    def step(self) -> RoundRecord:
        """Run one round; evaluate when due. Returns the round's record."""
        honest, byzantine = self.participants()
        uploads = self._train_honest(honest, self.w)
        if byzantine:
            uploads = torch.cat(
                [uploads, self._byzantine_uploads(byzantine, uploads, self.sigma())]
            )
        return self.apply(self._aggregate(uploads, honest + byzantine))

    def _train_honest(self, ids: list[int], w: Tensor) -> Tensor:
        """Uploads ``[len(ids), d]`` of honest clients ``ids`` (privatised at client level);
        keeps seed000's momentum state and the accountant up to date."""
        momentum = None if self.momentum is None else self.momentum[ids]
        uploads = self.honest.train(w, ids, self.generator, momentum=momentum, sigma=self.sigma())
        if self.momentum is not None and momentum is not None:
            self.momentum[ids] = momentum
        if self.client_level and ids:
            uploads = self.privatize_uploads(uploads)
        if ids:
            self.accountant_step()
        return uploads

    def privatize_uploads(self, uploads: Tensor) -> Tensor:
        """Fed-SDP at the clients, in place: every row of ``uploads`` (``[h, d]``, the
        round's h honest uploads) is clipped to l2 norm C = ``privacy.clip`` and gets its
        share N(0, σ_t²C²/h I) of the noise (:func:`~sharefl.privacy.client_level.
        privatize_update_`). Their sum carries N(0, σ_t²C² I), so with K = h participants
        the mean has std σ_t·C/K per coordinate: the same aggregate as server-side Fed-SDP
        (clip at the server, add N(0, σ_t²C²) to the sum). Returns ``uploads``."""
        scratch = torch.empty_like(uploads[0])
        if self.cluster_noise is not None:  # SHARE: each cluster sum carries the noise
            for row in uploads:
                self.cluster_noise.privatize_(row, self.generator, scratch=scratch)
            return uploads
        config = ClientDPConfig(
            clip_norm=self.run.privacy.clip,
            noise_multiplier=self.sigma(),
            cluster_size=len(uploads),
        )
        for row in uploads:
            privatize_update_(row, config, self.generator, scratch=scratch)
        return uploads

    def accountant_step(self) -> None:
        """Account one round of an honest participant's local steps."""
        if self.accountant is not None:
            self.accountant.step(
                self.sigma(), self.privacy.sample_rate, self.privacy.steps_per_round
            )

    def apply(self, aggregate: Tensor) -> RoundRecord:
        """The server's step with this round's aggregate; evaluates when due."""
        run = self.run
        if run.server.momentum:
            self.velocity.mul_(run.server.momentum).add_(aggregate)
            aggregate = self.velocity
        self.w = self.w - self.learning_rate * aggregate.to(self.w)
        self.round += 1
        due = self.round % run.eval_every == 0 or self.round == run.rounds
        accuracy = loss = None
        if due:
            accuracy, loss = self.model.evaluate(
                self.w, self.test_set.inputs, self.test_set.targets
            )
        return RoundRecord(
            self.round, accuracy, loss, self.epsilon() if due else None, self.elapsed()
        )

    def client_update(self, client_id: int, w: Tensor) -> Tensor:
        """One client's upload ``[d]`` from the global ``w`` (a client process over gRPC):
        honest training, or label-flipping / own-data attacks for Byzantine ids."""
        if client_id < self.run.clients.honest:
            return self._train_honest([client_id], w)[0]
        if self.byzantine is None:
            raise ConfigError(
                f"attack {self.attack.name!r} needs other clients' uploads; over gRPC only "
                "label_flipping and attacks on the client's own update are possible"
            )
        local = client_id - self.run.clients.honest
        own = self.byzantine.train(w, [local], self.generator, sigma=self.sigma())
        if self.attack.update_attack is None:
            return own[0]
        view = AttackView(num_byzantine=1, own=own, round=self.round, num_rounds=self.run.rounds)
        return self.attack.update_attack(view, self.generator)[0]

    def cluster_aggregate(self, released: list[list[tuple[np.ndarray, int]]]) -> Tensor:
        """The robust aggregate of released cluster sums: per reclustering, a list of
        (decoded sum, cluster size); the rule runs over cluster means, reclusterings are
        averaged."""
        if not isinstance(self.rule, HierarchicalAggregator):
            raise ConfigError("cluster sums need secure_aggregation.cluster_size >= 2")
        rounds = [torch.as_tensor(np.stack([s for s, _ in sums])) for sums in released]
        sizes = [[size for _, size in sums] for sums in released]
        return self.rule.average(rounds, sizes).to(self.w.dtype).to(self.device)

    def _byzantine_uploads(self, ids: list[int], honest: Tensor, sigma: float) -> Tensor:
        run = self.run
        local = [i - run.clients.honest for i in ids]
        if self.round < run.attack.start_fraction * run.rounds or self.attack.name == "none":
            if self.attack.name == "none" and self.byzantine is not None:
                return self.byzantine.train(self.w, local, self.generator, sigma=sigma)
            picks = torch.randint(
                len(honest), (len(ids),), generator=self.generator, device=self.device
            )
            return honest[picks].clone()
        own = None
        if self.byzantine is not None:
            own = self.byzantine.train(self.w, local, self.generator, sigma=sigma)
        if self.attack.label_flipping:
            assert own is not None
            return own
        view = AttackView(
            num_byzantine=len(ids),
            own=own,
            honest=honest,
            round=self.round,
            num_rounds=run.rounds,
        )
        assert self.attack.update_attack is not None
        return self.attack.update_attack(view, self.generator)

    def _aggregate(self, uploads: Tensor, ids: list[int]) -> Tensor:
        if self.noise_filter is not None:
            return self.noise_filter(uploads, self._auxiliary_gradient)
        if self.share is not None and (self.clustered or self.share.zeno is not None):
            return self.share.aggregate(  # SHARE hook (simulator/share.py)
                uploads,
                ids,
                byzantine=set(self.byzantine_ids),
                w=self.w,
                rng=self.rng,
                round=self.round,
            )
        if self.share is not None:
            uploads = self.share.weigh(uploads, ids)
        if not self.clustered:
            assert self.rule is not None
            return self.rule(uploads)
        sa = self.run.secure_aggregation
        inputs = {cid: uploads[i].detach().cpu().numpy() for i, cid in enumerate(ids)}
        result = secure_sum(
            inputs,
            cluster_size=sa.cluster_size,
            reclusterings=sa.reclusterings,
            seed=int(self.rng.integers(2**63)),
            bits=sa.bits,
            clip=sa.clip,
            allow_leakage=sa.allow_leakage,
            round=self.round,
            protocol=sa.enabled,
        )
        released = [
            [(s.sum, len(s.members)) for s in r.clusters]
            for r in result.reclusterings
            if r.clusters
        ]
        if not released:  # every cluster failed: no update this round
            return torch.zeros_like(self.w)
        return self.cluster_aggregate(released)

    def _auxiliary_gradient(self) -> Tensor:
        """The server's clean gradient on its auxiliary data at the current model."""
        assert self.auxiliary is not None
        with torch.enable_grad():  # the filter calls this under no_grad
            w = self.w.detach().clone().requires_grad_(True)
            out = self.model(w, self.auxiliary.inputs)
            loss = nn.functional.cross_entropy(out, self.auxiliary.targets)
            (g,) = torch.autograd.grad(loss, w)
        return g

    # -- reporting ---------------------------------------------------------------------

    def privacy_summary(self) -> tuple[float | None, dict[str, Any]]:
        """(δ of the reported ε or ``None`` without privacy, the JSON-ready parameters)."""
        delta = self.privacy.delta if self.run.privacy.enabled else None
        return delta, describe_privacy(self.privacy)

    def epsilon(self) -> float | None:
        """ε spent so far by each honest client (``None`` without privacy)."""
        if self.accountant is None or self.accountant.steps == 0:
            return None
        if self.share is not None and self.share.ledger is not None:  # SHARE: per client
            return self.share.epsilon(self.privacy.delta)
        return self.accountant.get_epsilon(self.privacy.delta)

    def extra_summary(self) -> dict[str, Any]:
        """Results beyond accuracy and ε for ``summary.json`` (SHARE: the audit verdict,
        Zeno++ acceptance, per-client ε of the cluster noise split)."""
        if self.share is None:
            return {}
        delta = self.privacy.delta if self.run.privacy.enabled else None
        return {"share": self.share.summary(delta)}


def describe_privacy(plan: PrivacyPlan) -> dict[str, Any]:
    """JSON-ready privacy parameters of a run."""
    return {
        "noise_multiplier": plan.noise_multiplier,
        "delta": plan.delta,
        "sample_rate": plan.sample_rate,
        "target_epsilon": plan.target_epsilon,
        "steps_per_round": plan.steps_per_round,
        "level": plan.level,
    }
