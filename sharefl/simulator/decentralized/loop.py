"""The decentralized loop of Ye, Zhu and Ling (Algorithm 1), vectorised over agents.

State: the honest agents' models X ``[|R|, d]`` (flat parameters, float64 by default). One
iteration k, with α_k = lr/√(k + 1):

1. every honest agent n draws a batch of B of its examples (uniform, without replacement
   within an epoch: :class:`~sharefl.simulator.worker_models.EpochSampler`) and computes
   its B per-example gradients, each clipped to norm M, averaged: ḡ_n — for all agents at
   once (:mod:`.gradients`: one ``vmap(vmap(grad))`` pass, or its closed form for softmax
   regression);
2. it broadcasts x̃_n = x_n − α_k (ḡ_n + λ x_n) + e_n, e_n ∼ N(0, (C α_k)² I): **one draw
   per sender**, the same x̃_n for every neighbour and for its own aggregation (the paper;
   the authors' code drew one per receiver);
3. each Byzantine neighbour b of n sends a message computed from what n sees
   (:mod:`.attacks`);
4. every honest agent aggregates its own x̃_n and its neighbours' messages with the rule:
   ``mean`` (DSGD with the Metropolis-Hastings weights w' of the full graph),
   ``trimmed_mean``, ``scc`` (τ), ``ios``; q_n = |B_n|. :meth:`DecentralizedLoop.step`
   computes the rules on the distinct messages (:mod:`.distinct`: a Gram matrix instead of
   an ``[R, N, d]`` copy; equal to the straight path up to float64 rounding, trimmed mean
   bit for bit); the straight path — :meth:`~DecentralizedLoop.received` and the batched
   rules of :mod:`sharefl.robust.decentralized` — stays as
   :meth:`~DecentralizedLoop.aggregate` (:class:`~.reference.StraightLoop` runs it).

Evaluation (every ``eval_every`` iterations and at the end): accuracy and cross-entropy of
the average honest model x̄ = mean_n x_n on the test set (the record's accuracy and loss),
and the consensus error H = (1/|R|) Σ_n ‖x_n − x̄‖² (Eq. 3) as ``consensus_error``, listed
in :attr:`DecentralizedLoop.plot_metrics` with the loss so that ``sharefl report`` plots
both beside the accuracy. ε is the
RDP accountant's, the largest over the honest agents (:mod:`.accounting`).

With ``attack.name = "none"`` the Byzantine agents and their links are deleted (the paper's
no-attack setting).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sharefl.robust.decentralized import (
    batched_ios,
    batched_self_centered_clipping,
    batched_trimmed_mean,
    batched_weighted_mean,
    metropolis_hastings_weights,
)
from sharefl.simulator.config import RunConfig, SimulationConfigError
from sharefl.simulator.datasets import Dataset
from sharefl.simulator.decentralized.accounting import AgentPrivacy
from sharefl.simulator.decentralized.attacks import ReceiverView, build_attack
from sharefl.simulator.decentralized.distinct import SlotLayout, aggregator
from sharefl.simulator.decentralized.gradients import clipped_mean_gradients
from sharefl.simulator.decentralized.graph import AgentGraph, erdos_renyi_graph, graph_from_edges
from sharefl.simulator.final_model import FinalModel
from sharefl.simulator.models import build_model
from sharefl.simulator.partition import partition
from sharefl.simulator.results import RoundRecord
from sharefl.simulator.stepped import SteppedLoop
from sharefl.simulator.training import FlatModel
from sharefl.simulator.worker_models import EpochSampler


def build_graph(run: RunConfig) -> AgentGraph:
    """The run's full graph (Byzantine agents included), as ``[decentralized]`` says.

    Raises:
        SimulationConfigError: an ``edges`` graph whose Byzantine agents do not number
            ``clients.byzantine``.
    """
    cfg, clients = run.decentralized, run.clients
    if cfg.graph == "erdos_renyi":
        return erdos_renyi_graph(
            clients.total, cfg.edge_probability, clients.byzantine, seed=cfg.graph_seed
        )
    if len(cfg.byzantine_agents) != clients.byzantine:
        raise SimulationConfigError(
            f"decentralized.byzantine_agents lists {len(cfg.byzantine_agents)} agents; "
            f"clients.byzantine is {clients.byzantine}: make them agree"
        )
    return graph_from_edges(clients.total, cfg.edges, cfg.byzantine_agents)


def split_examples(targets: Tensor, agents: int, scheme: str, seed: int) -> list[np.ndarray]:
    """Each honest agent's training indices: ``iid`` (random even split), ``blocks``
    (contiguous, dataset order) or ``by_label`` (agent i: labels ≡ i mod ``agents``)."""
    y = targets.cpu().numpy()
    if scheme == "iid":
        return partition(y, agents, "iid", seed=seed)
    if scheme == "blocks":
        return [np.asarray(p) for p in np.array_split(np.arange(len(y)), agents)]
    parts = [np.flatnonzero(y % agents == i) for i in range(agents)]
    if any(len(p) == 0 for p in parts):
        raise SimulationConfigError(
            f"split by_label leaves an agent without examples ({agents} agents)"
        )
    return parts


class DecentralizedLoop(SteppedLoop):
    """One run of ``[algorithm] name = "decentralized"`` in this process.

    Args:
        run: the resolved configuration (``run.decentralized`` holds the loop's parameters).
        device: overrides ``run.device``.
        train, test: preloaded datasets (default: loaded from the configuration).

    Raises:
        SimulationConfigError: another algorithm, an attack the loop does not know, q_n
            too large for a rule (trimmed mean needs |N_n| ≥ 2|B_n|).
    """

    algorithm = "decentralized"

    plot_metrics: tuple[str, ...] = ("loss", "consensus_error")

    def __init__(
        self,
        run: RunConfig,
        *,
        device: str | None = None,
        train: Dataset | None = None,
        test: Dataset | None = None,
    ) -> None:
        self.device, train, test = self.begin(run, device, train, test)
        self.train_set, self.test_set = train, test
        self.cfg = cfg = run.decentralized
        self.dtype = getattr(torch, cfg.dtype)
        self.test_inputs = test.inputs.to(self.dtype)
        # every batch is gathered from this copy in the loop's dtype (the conversion is
        # exact, so gathering then converting gives the same numbers, slower)
        self.train_inputs = train.inputs.to(self.dtype)
        self.generator = torch.Generator(device=self.device).manual_seed(run.seed)

        self.full_graph = build_graph(run)
        attacked = run.attack.name != "none"
        self.attack = build_attack(run.attack.name, run.attack.options)
        self.graph = self.full_graph if attacked else self.full_graph.without_byzantine()
        self._neighbourhoods()

        self.parts = split_examples(train.targets, len(self.honest), cfg.split, run.partition_seed)
        shape = tuple(train.inputs.shape[1:])
        module = build_model(
            run.model.name,
            num_classes=train.num_classes,
            input_shape=shape,
            seed=run.model.init_seed,
            **run.model.options,
        ).to(device=self.device, dtype=self.dtype)
        self.model = FlatModel(module)
        self.sampler = EpochSampler(self.parts, run.training.batch_size, self.device)
        self._clipped_mean = clipped_mean_gradients(self.model, module)
        self.x = self._initial_models()
        per_receiver = 0
        if self.attack is not None:
            per_receiver = self.attack.messages_per_receiver(len(self.graph.byzantine))
        self.layout = SlotLayout.build(
            self.mask, self.weights, self.q, self.honest_slots, self.byzantine_slots, per_receiver
        )
        self._mix = aggregator(cfg.rule, self.layout, cfg.scc_tau)
        self.start_clock()

    # -- setup -------------------------------------------------------------------------

    def _neighbourhoods(self) -> None:
        """Receiver-side matrices over the honest agents R (rows) and all agents (slots)."""
        g = self.graph
        self.honest = g.honest
        honest, byz = torch.tensor(g.honest), torch.tensor(g.byzantine, dtype=torch.long)
        A = g.adjacency.to(self.device)
        Wp = metropolis_hastings_weights(g.adjacency).to(self.device, self.dtype)
        self.mask = A[honest]  # [R, N]
        self.weights = torch.where(self.mask, Wp[honest], 0.0)
        self.q = A[honest][:, byz].sum(dim=1)  # q_n = |B_n|
        self.honest_slots, self.byzantine_slots = honest.to(self.device), byz.to(self.device)
        self.view = ReceiverView(
            honest_neighbours=A[honest][:, honest],
            honest_weights=Wp[honest][:, honest],
            byzantine_weight=Wp[honest][:, byz].sum(dim=1),
            byzantine_neighbours=A[honest][:, byz],
        )
        if self.cfg.rule == "trimmed_mean" and bool((self.mask.sum(dim=1) < 2 * self.q).any()):
            raise SimulationConfigError(
                "trimmed mean needs every agent to have >= 2|B_n| neighbours"
            )

    def _initial_models(self) -> Tensor:
        """x_n^0 = init_scale · N(0, I), a generator per agent (seeded init_seed + n)."""
        rows = []
        for n in self.honest:
            gen = torch.Generator(device=self.device).manual_seed(self.run.model.init_seed + n)
            rows.append(
                torch.randn(self.model.dim, generator=gen, device=self.device, dtype=self.dtype)
            )
        return self.cfg.init_scale * torch.stack(rows)

    # -- one iteration -------------------------------------------------------------------

    def step_size(self, k: int) -> float:
        """α_k = lr / √(k + 1), k = 0, 1, …"""
        return self.cfg.lr / math.sqrt(k + 1)

    def clipped_gradients(self, x: Tensor) -> Tensor:
        """``[R, d]``: each agent's mean of B per-example gradients clipped to M, on its
        next batch (:mod:`.gradients`)."""
        rows = self.sampler.next(self.generator)
        inputs = self.train_inputs[rows]
        return self._clipped_mean(x, inputs, self.train_set.targets[rows], self.cfg.clip)

    def broadcast(self, x: Tensor, alpha: float) -> Tensor:
        """x̃ ``[R, d]``: one noisy model per sender."""
        step = self.clipped_gradients(x) + self.cfg.weight_decay * x
        sent = x - alpha * step
        if self.cfg.noise > 0:
            noise = torch.randn(sent.shape, generator=self.generator, device=self.device)
            sent = sent + (self.cfg.noise * alpha) * noise.to(self.dtype)
        return sent

    def distinct(self, sent: Tensor) -> Tensor:
        """V ``[J, d]``: x̃ (R rows), then every receiver's distinct Byzantine messages
        (:class:`~.distinct.SlotLayout`); draws the attack's randomness as
        :meth:`received` does."""
        if self.attack is None:
            return sent
        messages = self.attack.distinct_messages(sent, self.view, self.generator)
        return torch.cat([sent, messages.reshape(-1, sent.shape[1])])

    def mix(self, sent: Tensor) -> Tensor:
        """Every honest agent's new model ``[R, d]`` from the broadcasts: the attack's
        messages and the rule on the distinct messages (:mod:`.distinct`)."""
        return self._mix(self.distinct(sent))

    def received(self, sent: Tensor) -> Tensor:
        """``[R, N, d]``: slot m of row n is what agent m sent to n (honest: x̃_m;
        Byzantine: the attack's message to n). The straight path (see :meth:`mix`)."""
        R, d = sent.shape
        out = torch.empty(R, self.graph.size, d, dtype=sent.dtype, device=sent.device)
        out[:, self.honest_slots] = sent[None].expand(R, R, d)
        if self.attack is not None:
            out[:, self.byzantine_slots] = self.attack.messages(sent, self.view, self.generator)
        return out

    def aggregate(self, sent: Tensor, received: Tensor) -> Tensor:
        """Every honest agent's new model ``[R, d]`` from its own x̃ and its messages
        ``[R, N, d]`` (:meth:`received`), by the batched rules: the straight path."""
        rule = self.cfg.rule
        if rule == "mean":
            return batched_weighted_mean(sent, received, self.weights)
        if rule == "trimmed_mean":
            return batched_trimmed_mean(sent, received, self.mask, self.q)
        if rule == "scc":
            return batched_self_centered_clipping(sent, received, self.weights, self.cfg.scc_tau)
        return batched_ios(sent, received, self.weights, self.mask, self.q)

    def step(self) -> RoundRecord:
        """One iteration; evaluates x̄ when due. Returns the iteration's record."""
        with torch.no_grad():
            sent = self.broadcast(self.x, self.step_size(self.round))
            self.x = self.mix(sent)
        self.round += 1
        due = self.evaluation_due()
        if not due:
            return RoundRecord(self.round, None, None, None, self.elapsed())
        return self.evaluate()

    # -- metrics and reporting -----------------------------------------------------------

    def consensus_error(self) -> float:
        """H = (1/|R|) Σ_n ‖x_n − x̄‖²."""
        centred = self.x - self.x.mean(dim=0, keepdim=True)
        return float((centred**2).sum(dim=1).mean())

    def evaluate(self) -> RoundRecord:
        """The record of the current iteration with x̄'s test accuracy and loss and H."""
        mean = self.x.mean(dim=0)
        accuracy, loss = self.model.evaluate(mean, self.test_inputs, self.test_set.targets)
        extra = {"consensus_error": self.consensus_error()}
        return RoundRecord(self.round, accuracy, loss, self.epsilon(), self.elapsed(), extra)

    def final_model(self) -> FinalModel:
        """x̄ = mean_n x_n (the model every evaluation reports) after the iterations so far,
        as the module's ``state_dict`` in ``decentralized.dtype``, with every honest agent's
        model (``agents``, rows in the order of :attr:`honest`)
        (:class:`~sharefl.simulator.final_model.FinalModel`)."""
        return FinalModel.from_flat(
            self.model,
            self.x.mean(dim=0),
            loop="decentralized",
            describes="the average honest model x̄ = mean of the honest agents' models",
            run=self.run,
            input_shape=tuple(self.train_set.inputs.shape[1:]),
            num_classes=self.train_set.num_classes,
            round=self.round,
            agents=self.x,
        )

    def agent_privacy(self, iterations: int | None = None) -> list[AgentPrivacy]:
        """The accounting parameters of every honest agent after ``iterations`` (default:
        the iterations run so far)."""
        cfg = self.cfg
        k = self.round if iterations is None else iterations
        return [
            AgentPrivacy(
                cfg.noise,
                cfg.clip,
                self.run.training.batch_size,
                len(p),
                k,
                cfg.delta,
                cfg.adjacency,
            )
            for p in self.parts
        ]

    def epsilon(self) -> float | None:
        """The largest RDP ε over the honest agents so far (``None`` without noise)."""
        if self.cfg.noise == 0 or self.round == 0:
            return None
        return max(a.rdp_epsilon() for a in self.agent_privacy())

    def privacy_summary(self) -> tuple[float | None, dict[str, Any]]:
        """(δ or ``None``, ε per honest agent from RDP and Theorem 3 with C, M, B, S, K)."""
        if self.cfg.noise == 0:
            return None, {"mechanism": None}
        agents = {
            str(n): a.to_json() for n, a in zip(self.honest, self.agent_privacy(), strict=True)
        }
        info = {
            "mechanism": "gaussian model noise, std C·α_k, per-example clipping to M",
            "scope": "one honest agent's local dataset, all its broadcasts (every neighbour "
            "curious and colluding)",
            "agents": agents,
        }
        return self.cfg.delta, info
