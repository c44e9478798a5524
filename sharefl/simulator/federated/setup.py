"""The federated loop's setup, pure: partitions, model and privacy plan from its configuration.

:func:`build_setup` turns a :class:`~sharefl.simulator.config.RunConfig` into a
:class:`RunSetup` and does nothing else: no training, no global random state; the same
configuration (and datasets) give the same setup. The federated loop starts from it (the
data and device come from :mod:`sharefl.simulator.setup`, every loop's prologue).

:class:`PrivacyPlan` is the run's one source of σ: a constant, or the configured decay
schedule indexed by the round (:meth:`PrivacyPlan.sigma`). The clients' training noise and
the accountant both read it, so the σ that is composed is the σ that was added.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sharefl.privacy.calibration import calibrate_noise
from sharefl.privacy.schedules import NoiseSchedule
from sharefl.simulator import components
from sharefl.simulator.config import RunConfig, SimulationConfigError, default_delta
from sharefl.simulator.datasets import Dataset
from sharefl.simulator.federated.share import distributed_encoder
from sharefl.simulator.models import build_model
from sharefl.simulator.partition import partition
from sharefl.simulator.setup import load_train, resolve_device, run_data
from sharefl.simulator.training import FlatModel, sample_rate


@dataclass(frozen=True)
class PrivacyPlan:
    """σ, δ and the sampling rate of the accounted mechanisms (``steps_per_round`` of them
    per round: the local steps at example level, 1 at client level).

    ``noise_multiplier`` is σ (configured or calibrated to ``target_epsilon``); ``schedule``
    the configured decay from it (``None``: σ every round). :meth:`sigma` is what training
    adds and the accountant composes in a round.
    """

    noise_multiplier: float
    delta: float
    sample_rate: float
    steps_per_round: int
    target_epsilon: float | None
    level: str = "example"
    schedule: NoiseSchedule | None = field(default=None, compare=False)
    enabled: bool = True

    @property
    def client_level(self) -> bool:
        """Fed-SDP: the whole update is clipped and noised once per round."""
        return self.enabled and self.level == "client"

    def sigma(self, round_index: int) -> float:
        """σ of the 0-based round ``round_index``: the schedule's value, else σ; 0 when the
        run is not private."""
        if not self.enabled:
            return 0.0
        if self.schedule is None:
            return float(self.noise_multiplier)
        return self.schedule(round_index)


def describe_privacy(plan: PrivacyPlan) -> dict[str, Any]:
    """JSON-ready privacy parameters of a run."""
    return {
        "noise_multiplier": plan.noise_multiplier,
        "delta": plan.delta,
        "sample_rate": plan.sample_rate,
        "target_epsilon": plan.target_epsilon,
        "steps_per_round": plan.steps_per_round,
        "level": plan.level,
        "schedule": None if plan.schedule is None else type(plan.schedule).__name__,
    }


def auxiliary_indices(targets: np.ndarray, per_class: int, seed: int) -> np.ndarray:
    """The server's auxiliary examples: ``per_class`` random indices of every class
    (all of a smaller class), sorted; drawn from ``default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    picks = []
    for c in np.unique(targets):
        members = np.flatnonzero(targets == c)
        picks.append(rng.choice(members, min(per_class, len(members)), replace=False))
    return np.sort(np.concatenate(picks))


def privacy_plan(run: RunConfig, smallest: int, dim: int) -> PrivacyPlan:
    """σ (configured or calibrated), its schedule, δ and q of ``run``; ``smallest`` is the
    fewest examples an honest client holds (example level: the worst-off client), ``dim``
    the model's size. A target ε is calibrated by the run's mechanism: the Gaussian's
    accountant, or a discrete ``privacy.distributed``'s own bound
    (:func:`~sharefl.simulator.federated.share.distributed_encoder`)."""
    p = run.privacy
    if not p.enabled:
        return PrivacyPlan(0.0, 0.0, 0.0, run.training.local_steps, None, enabled=False)
    clients = run.clients
    participation = clients.per_round / clients.total if clients.per_round else 1.0
    if p.level == "client":  # one mechanism per round over the set of clients
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
        sigma = calibrate_noise(p.epsilon, delta, q, steps, p.accountant, conversion=p.conversion)
        discrete = distributed_encoder(run, sigma, dim, target=(p.epsilon, delta))
        if discrete is not None:
            sigma = discrete.config.noise_multiplier
    built = components.build_schedule(p, sigma)
    schedule = built if isinstance(built, NoiseSchedule) else None
    return PrivacyPlan(sigma, delta, q, steps_per_round, target, p.level, schedule)


def server_learning_rate(run: RunConfig, plan: PrivacyPlan) -> float:
    """η_s, rescaled by σ(ε_ref)/σ(ε) under the DP filter's rule (Eq. 4: η ∝ 1/σ)."""
    s = run.server
    if not s.noise_reference_epsilon or plan.target_epsilon is None:
        return s.learning_rate
    reference = calibrate_noise(
        s.noise_reference_epsilon,
        plan.delta,
        plan.sample_rate,
        run.rounds * plan.steps_per_round,
        run.privacy.accountant,
        conversion=run.privacy.conversion,
    )
    return s.learning_rate * reference / plan.noise_multiplier


def upload_noise_std(run: RunConfig, plan: PrivacyPlan) -> float:
    """Std of the DP noise on one coordinate of an honest upload (what a Gaussian attack
    with ``std = "dp"`` imitates): σ/B for a DP-SGD gradient, σC/√h for a Fed-SDP update
    shared among the h honest clients expected per round."""
    sigma = plan.noise_multiplier
    if not plan.client_level:
        return sigma / run.training.batch_size
    clients = run.clients
    expected = clients.per_round * clients.honest / clients.total or clients.honest
    return sigma * run.privacy.clip / math.sqrt(max(1.0, expected))


@dataclass(frozen=True, eq=False)
class RunSetup:
    """What a run starts from (built by :func:`build_setup`), or what a deployed client
    process starts from (:func:`build_client_setup`: ``held`` set).

    Attributes:
        run: the configuration; device: where tensors live.
        train, test: the datasets on ``device``; with ``held``, ``train`` holds client
            ``held``'s examples only (in its partition's order) and ``test`` is ``None``.
        auxiliary: the server's auxiliary examples (``data.auxiliary_per_class``), taken out
            of the clients' pool, or ``None`` (always with ``held``).
        honest_parts, byzantine_parts: training-set indices of every honest / Byzantine
            client (client id = list index; Byzantine ids start after the honest ones):
            the run's partition, identical with ``held`` (its sizes set σ, the weights and
            how batches are drawn).
        model: the flat model; ``initial`` its parameters at ``model.init_seed``.
        privacy: the :class:`PrivacyPlan`.
        held: the client whose examples ``train`` holds alone (a client process), or
            ``None``: ``train`` is the whole training set.
    """

    run: RunConfig
    device: torch.device
    train: Dataset
    test: Dataset | None
    auxiliary: Dataset | None
    honest_parts: list[np.ndarray]
    byzantine_parts: list[np.ndarray]
    model: FlatModel
    initial: torch.Tensor
    privacy: PrivacyPlan
    held: int | None = None

    def part(self, client_id: int) -> np.ndarray:
        """The training-set indices of client ``client_id`` (honest ids first)."""
        honest = len(self.honest_parts)
        if client_id < honest:
            return self.honest_parts[client_id]
        return self.byzantine_parts[client_id - honest]


def build_setup(
    run: RunConfig,
    *,
    device: str | torch.device | None = None,
    train: Dataset | None = None,
    test: Dataset | None = None,
) -> RunSetup:
    """The setup of ``run`` (datasets loaded unless both are given). Deterministic: the
    auxiliary set and partitions come from the configuration's seeds only.

    Raises:
        SimulationConfigError: an unknown model, partition or device, a privacy setting
            that does not fit (from :func:`privacy_plan`).
    """
    where, train, test = run_data(run, device, train, test)
    aux_idx, honest_parts, byzantine_parts = client_parts(run, train)
    model = flat_model(run, train, where)
    return RunSetup(
        run=run,
        device=where,
        train=train,
        test=test,
        auxiliary=None if aux_idx is None else train.subset(aux_idx),
        honest_parts=honest_parts,
        byzantine_parts=byzantine_parts,
        model=model,
        initial=model.initial().to(where),
        privacy=privacy_plan(run, min(len(p) for p in honest_parts), model.dim),
    )


def build_client_setup(
    run: RunConfig, client_id: int, *, device: str | torch.device | None = None
) -> RunSetup:
    """What client ``client_id`` of ``run`` starts from in a process of its own (a
    deployment's client): the training set alone (:func:`~sharefl.simulator.setup.
    load_train`), the run's partition of it (:func:`client_parts`, the same as
    :func:`build_setup`'s), of which ``train`` keeps this client's examples only; the model
    and the privacy plan as :func:`build_setup` makes them. No test set, no auxiliary set.

    Raises:
        SimulationConfigError: as :func:`build_setup`, or ``client_id`` outside the run.
    """
    if not 0 <= client_id < run.clients.total:
        raise SimulationConfigError(f"client id {client_id} is not in 0..{run.clients.total - 1}")
    where = resolve_device(device or run.device)
    train = load_train(run, where)
    _, honest_parts, byzantine_parts = client_parts(run, train)
    model = flat_model(run, train, where)
    setup = RunSetup(
        run=run,
        device=where,
        train=train,
        test=None,
        auxiliary=None,
        honest_parts=honest_parts,
        byzantine_parts=byzantine_parts,
        model=model,
        initial=model.initial().to(where),
        privacy=privacy_plan(run, min(len(p) for p in honest_parts), model.dim),
        held=client_id,
    )
    return dataclasses.replace(setup, train=train.subset(setup.part(client_id)))


def client_parts(
    run: RunConfig, train: Dataset
) -> tuple[np.ndarray | None, list[np.ndarray], list[np.ndarray]]:
    """(the server's auxiliary indices or ``None``, the honest clients' parts, the
    Byzantine clients' parts) of ``train``: the auxiliary set (``data.auxiliary_per_class``)
    is taken out of the pool first, then the pool is partitioned
    (``run.partition_seed``); with ``data.honest_only`` the Byzantine clients draw from
    the whole pool. Indices into ``train``."""
    clients = run.clients
    pool = np.arange(len(train))
    aux_idx = None
    if run.data.auxiliary_per_class:
        aux_idx = auxiliary_indices(
            train.targets.cpu().numpy(), run.data.auxiliary_per_class, run.seed
        )
        pool = np.setdiff1d(pool, aux_idx)
    split_among = clients.honest if run.data.honest_only else clients.total
    parts = partition(
        train.targets[pool].cpu().numpy(),
        split_among,
        run.data.partition,
        seed=run.partition_seed,
        **run.data.partition_options,
    )
    parts = [pool[p] for p in parts]
    honest_parts = parts[: clients.honest]
    byzantine_parts = parts[clients.honest :]
    if run.data.honest_only:  # Byzantine workers draw from the whole training set
        byzantine_parts = [pool] * clients.byzantine
    return aux_idx, honest_parts, byzantine_parts


def flat_model(run: RunConfig, train: Dataset, device: torch.device) -> FlatModel:
    """The run's model for ``train``'s inputs and classes, initialised from
    ``model.init_seed``, on ``device``."""
    module = build_model(
        run.model.name,
        num_classes=train.num_classes,
        input_shape=tuple(train.inputs.shape[1:]),
        seed=run.model.init_seed,
        **run.model.options,
    ).to(device)
    return FlatModel(module)
