"""The clients of a federated run: :class:`HonestClients` (vectorised local training) and
:class:`ByzantineClients` (what the attack makes them upload).

Both are built from a :class:`~sharefl.simulator.federated.setup.RunSetup` (a client
process's, whose ``held`` client is the one they train: :class:`~sharefl.simulator.federated.
client.ClientPart`) and take every source of state from their caller: the global model,
the round index (σ comes from the run's :class:`~sharefl.simulator.federated.setup.
PrivacyPlan` at that round) and the generator.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sharefl.privacy.client_level import ClientDPConfig, privatize_update_
from sharefl.privacy.cluster_noise import ClusterNoiseSplit
from sharefl.simulator import components
from sharefl.simulator.config import SimulationConfigError
from sharefl.simulator.federated import attacks
from sharefl.simulator.federated.attacks import AttackView, LabelFlipping
from sharefl.simulator.federated.setup import RunSetup, upload_noise_std
from sharefl.simulator.federated.share import cluster_noise_split
from sharefl.simulator.training import LocalTraining, VectorizedClients


def local_training(setup: RunSetup, batch_size: int, denominator: int | None) -> LocalTraining:
    """The clients' :class:`LocalTraining` (clipping from the run; its ``noise`` is the
    plan's base σ, for validation only: every round's σ is passed from the plan)."""
    t, plan = setup.run.training, setup.privacy
    return LocalTraining(
        batch_size=batch_size,
        local_steps=t.local_steps,
        learning_rate=t.learning_rate,
        upload="gradient" if t.upload == "gradient" else "delta",
        sampling=t.sampling,  # validated by TrainingConfig
        clipping=components.build_clipping(setup.run.privacy),
        noise=0.0 if plan.client_level else plan.noise_multiplier,
        denominator=denominator,
        momentum=t.momentum,  # SHARE's local SGD momentum
    )


class HonestClients:
    """The honest clients, trained together (ids ``0 … honest − 1``).

    :meth:`train` returns their uploads: DP-SGD (example level, σ of the round at every
    local step), or clear training then Fed-SDP at the client (client level,
    :meth:`privatize`); the DP filter's per-client momentum state lives here.
    """

    def __init__(self, setup: RunSetup) -> None:
        self.setup = setup
        self.plan = setup.privacy
        training = local_training(setup, setup.run.training.batch_size, None)
        self.clients = VectorizedClients(
            setup.model,
            setup.train.inputs,
            setup.train.targets,
            setup.honest_parts,
            training,
            held=setup.held,
        )
        uses_momentum = isinstance(training.clipping, components.Normalization) and (
            setup.run.privacy.momentum > 0
        )
        self.momentum = (
            torch.zeros(len(setup.honest_parts), setup.model.dim, device=setup.device)
            if uses_momentum
            else None
        )
        # SHARE: client-level noise split over each cluster (privacy.noise_split = "cluster")
        self.cluster_noise: ClusterNoiseSplit | None = cluster_noise_split(
            setup.run, setup.privacy.noise_multiplier
        )

    def train(
        self, ids: list[int], w: Tensor, round_index: int, generator: torch.Generator
    ) -> Tensor:
        """Uploads ``[len(ids), d]`` of clients ``ids`` from the global ``w`` in the 0-based
        round ``round_index`` (privatised at client level)."""
        sigma = self.plan.sigma(round_index)
        momentum = None if self.momentum is None else self.momentum[ids]
        uploads = self.clients.train(w, ids, generator, momentum=momentum, sigma=sigma)
        if self.momentum is not None and momentum is not None:
            self.momentum[ids] = momentum
        if self.plan.client_level and ids:
            uploads = self.privatize(uploads, round_index, generator)
        return uploads

    def privatize(self, uploads: Tensor, round_index: int, generator: torch.Generator) -> Tensor:
        """Fed-SDP at the clients, in place: every row of ``uploads`` (``[h, d]``, the
        round's h honest uploads) is clipped to l2 norm C = ``privacy.clip`` and gets its
        share N(0, σ_t²C²/h I) of the noise (:func:`~sharefl.privacy.client_level.
        privatize_update_`). Their sum carries N(0, σ_t²C² I), so with K = h participants
        the mean has std σ_t·C/K per coordinate: the same aggregate as server-side Fed-SDP
        (clip at the server, add N(0, σ_t²C²) to the sum). Returns ``uploads``.

        With ``privacy.noise_split = "cluster"`` each row gets N(0, σ²C²/s I) instead, so
        that every cluster sum the protocol can release carries the whole noise
        (:mod:`sharefl.privacy.cluster_noise`). With a discrete ``privacy.distributed``
        the uploads are returned as they are: the clip, the rounding and the noise happen
        in the ring, where :class:`~sharefl.simulator.federated.share.ShareAggregation` encodes them
        (:class:`~sharefl.privacy.distributed.DistributedEncoder`)."""
        if self.setup.run.privacy.distributed != "gaussian":
            return uploads  # clipped and noised in the ring (ShareAggregation's encoder)
        scratch = torch.empty_like(uploads[0])
        if self.cluster_noise is not None:
            for row in uploads:
                self.cluster_noise.privatize_(row, generator, scratch=scratch)
            return uploads
        config = ClientDPConfig(
            clip_norm=self.setup.run.privacy.clip,
            noise_multiplier=self.plan.sigma(round_index),
            cluster_size=len(uploads),
        )
        for row in uploads:
            privatize_update_(row, config, generator, scratch=scratch)
        return uploads


class ByzantineClients:
    """The Byzantine clients (ids ``honest … total − 1``) and their attack.

    They train (on flipped labels, or on their own data when the attack needs their own
    update) only when the attack asks for it; before ``attack.start_fraction`` of the
    rounds they copy random honest uploads (the DP filter's "time to be Byzantine").
    """

    def __init__(self, setup: RunSetup) -> None:
        run = setup.run
        self.setup = setup
        self.plan = setup.privacy
        self.first_id = run.clients.honest
        self.attack = attacks.build_attack(
            run.attack.name, run.attack.options, noise_std=upload_noise_std(run, setup.privacy)
        )
        self.clients: VectorizedClients | None = None
        if run.clients.byzantine and (self.attack.label_flipping or self._needs_own()):
            b = self.attack.batch_size or run.training.batch_size
            self.clients = VectorizedClients(
                setup.model,
                setup.train.inputs,
                setup.train.targets,
                setup.byzantine_parts,
                local_training(setup, b, run.training.batch_size),
                label_map=(
                    LabelFlipping(setup.train.num_classes) if self.attack.label_flipping else None
                ),
                held=None if setup.held is None else setup.held - self.first_id,
            )

    def _needs_own(self) -> bool:
        attack = self.attack.update_attack
        return attack is not None and attack.knowledge.value == "own"

    def _sigma(self, round_index: int) -> float:
        return self.plan.sigma(round_index)

    def _train(self, local: list[int], w: Tensor, round_index: int, generator) -> Tensor:
        assert self.clients is not None
        return self.clients.train(w, local, generator, sigma=self._sigma(round_index))

    def uploads(
        self,
        ids: list[int],
        honest: Tensor,
        w: Tensor,
        round_index: int,
        generator: torch.Generator,
    ) -> Tensor:
        """The uploads ``[len(ids), d]`` of Byzantine clients ``ids`` in the 0-based round
        ``round_index``, given the honest uploads (an omniscient attacker)."""
        run = self.setup.run
        local = [i - self.first_id for i in ids]
        if round_index < run.attack.start_fraction * run.rounds or self.attack.name == "none":
            if self.attack.name == "none" and self.clients is not None:
                return self._train(local, w, round_index, generator)
            picks = torch.randint(
                len(honest), (len(ids),), generator=generator, device=honest.device
            )
            return honest[picks].clone()
        own = None if self.clients is None else self._train(local, w, round_index, generator)
        if self.attack.label_flipping:
            assert own is not None
            return own
        view = AttackView(
            num_byzantine=len(ids),
            own=own,
            honest=honest,
            round=round_index,
            num_rounds=run.rounds,
        )
        assert self.attack.update_attack is not None
        return self.attack.update_attack(view, generator)

    def client_upload(
        self, client_id: int, w: Tensor, round_index: int, generator: torch.Generator
    ) -> Tensor:
        """One Byzantine client's upload ``[d]`` on its own (a client process over gRPC):
        label flipping, or an attack on its own update.

        Raises:
            SimulationConfigError: the attack needs the other clients' uploads.
        """
        if self.clients is None:
            raise SimulationConfigError(
                f"attack {self.attack.name!r} needs other clients' uploads; over gRPC only "
                "label_flipping and attacks on the client's own update are possible"
            )
        own = self._train([client_id - self.first_id], w, round_index, generator)
        if self.attack.update_attack is None:
            return own[0]
        view = AttackView(
            num_byzantine=1, own=own, round=round_index, num_rounds=self.setup.run.rounds
        )
        return self.attack.update_attack(view, generator)[0]
