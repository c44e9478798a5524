"""One client of a federated run, alone in a process: what a deployed client builds.

A client process (``sharefl launch``/``sharefl client --config FILE``, through
:class:`sharefl.simulation_bridge.SimulationTrainer`) trains one client of the run and
nothing else. :class:`ClientPart` builds what that needs with the simulator's own
functions (:func:`~sharefl.simulator.federated.setup.build_client_setup`):

* the training set (no test set), partitioned exactly as the run partitions it (the
  partition is part of the results), of which the process keeps its client's examples;
* the model and the privacy plan (σ, calibrated as the run calibrates it), the clients'
  local training over that one client (:class:`~sharefl.simulator.federated.populations.
  HonestClients` or :class:`~sharefl.simulator.federated.populations.ByzantineClients`,
  its batches drawn as the whole run draws them from the same generator state), its
  weight with ``training.weighted`` and the discrete pipeline of a discrete
  ``privacy.distributed``.

The server's side (the rule, the evaluation, the accountant, the global model and its
velocity) and the other clients' data are not built.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sharefl.privacy.distributed import DistributedEncoder
from sharefl.simulator.config import RunConfig
from sharefl.simulator.federated.populations import ByzantineClients, HonestClients
from sharefl.simulator.federated.setup import RunSetup, build_client_setup
from sharefl.simulator.federated.share import delta_weights, distributed_encoder, weigh


class ClientPart:
    """Client ``client_id`` of ``run`` (module docstring).

    Attributes:
        setup: its :class:`~sharefl.simulator.federated.setup.RunSetup` (``held`` =
            ``client_id``: ``train`` holds its examples only, ``test`` is ``None``).
        generator: the randomness of its training and attack (seeded with ``run.seed``
            as the simulation's; a deployed client replaces it: :meth:`use_generator`).
        ring_encoder: the discrete pipeline of a discrete ``privacy.distributed`` (σ as
            calibrated for the run), which it runs before masking; ``None`` otherwise.

    Raises:
        SimulationConfigError: ``client_id`` outside the run, or a setup that does not fit.
    """

    def __init__(self, run: RunConfig, client_id: int, *, device: str | None = None) -> None:
        self.setup: RunSetup = build_client_setup(run, client_id, device=device)
        self.run = run
        self.client_id = client_id
        self.honest = client_id < run.clients.honest
        self.generator = torch.Generator(device=self.device).manual_seed(run.seed)
        self.clients: HonestClients | ByzantineClients = (
            HonestClients(self.setup) if self.honest else ByzantineClients(self.setup)
        )
        sizes = [len(p) for p in self.setup.honest_parts + self.setup.byzantine_parts]
        self.weights = delta_weights(sizes) if run.training.weighted else None
        self.ring_encoder: DistributedEncoder | None = distributed_encoder(
            run, self.setup.privacy.noise_multiplier, self.dim
        )

    @property
    def device(self) -> torch.device:
        return self.setup.device

    @property
    def dim(self) -> int:
        """d, the number of model parameters."""
        return self.setup.model.dim

    def initial_model(self) -> Tensor:
        """The run's initial global model (``model.init_seed``), ``[d]`` on :attr:`device`."""
        return self.setup.initial

    def use_generator(self, generator: torch.Generator) -> None:
        """Draw the client's randomness (DP noise, batches, attacks) from ``generator``, e.g.
        an operating-system-seeded one in a real client process."""
        self.generator = generator

    def update(self, w: Tensor, round_index: int) -> Tensor:
        """The client's upload ``[d]`` from the global ``w`` in the 0-based round
        ``round_index``: what the in-process round makes of it (honest training, or
        label-flipping / own-data attacks for a Byzantine id), and with
        ``training.weighted`` times its weight N·n_i/n, as the in-process round weighs
        every upload before the protocol sums them (:func:`~sharefl.simulator.federated.
        share.weigh`). The round is accounted by the server
        (:meth:`~sharefl.simulator.federated.loop.Simulation.server_round`), not here.

        Raises:
            SimulationConfigError: a Byzantine client whose attack needs the other
                clients' uploads."""
        cid = self.client_id
        if isinstance(self.clients, HonestClients):
            upload = self.clients.train([cid], w, round_index, self.generator)[0]
        else:
            upload = self.clients.client_upload(cid, w, round_index, self.generator)
        return weigh(upload[None], self.weights, [cid])[0]
