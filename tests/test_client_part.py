"""A deployed client process builds only its own client (``ClientPart``) and uploads what
the in-process run's client uploads.

Given the same generator state, every client's upload over several rounds is the
simulation's bit for bit (honest DP training with per-client state, label flipping, an
attack on the client's own update, weighted uploads, every batch sampling, unequal
partitions), its examples are the run's partition, σ and the discrete pipeline are the
run's; and the process holds no test set, no other client's examples and no server."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sim_configs import with_overrides

from sharefl.simulation_bridge import SimulationTrainer
from sharefl.simulator.config import SimulationConfigError, expand
from sharefl.simulator.federated.client import ClientPart
from sharefl.simulator.federated.loop import Simulation
from sharefl.simulator.training import TrainingError

DP_SGD = {"enabled": True, "noise_multiplier": 1.0, "clip": 1.0, "delta": 1e-5}


def config(**overrides) -> dict:
    """6 honest + 2 label-flipping clients on synthetic 6×6 images, unequal partitions."""
    base = {
        "name": "client-part",
        "seed": 3,
        "rounds": 3,
        "data": {
            "dataset": "synthetic",
            "options": {"num_examples": 643, "shape": [1, 6, 6], "noise": 0.4},
            "partition": "dirichlet",
            "partition_options": {"alpha": 0.8},
        },
        "model": {"name": "mlp", "options": {"hidden": [16]}},
        "clients": {"honest": 6, "byzantine": 2},
        "training": {"batch_size": 8, "local_steps": 2, "learning_rate": 0.1, "upload": "delta"},
        "attack": {"name": "label_flipping"},
        "secure_aggregation": {"cluster_size": 3, "clip": 10.0},
        "aggregator": {"name": "mean"},
    }
    return with_overrides(base, overrides)


def simulation_upload(sim: Simulation, cid: int, w: torch.Tensor, r: int, generator) -> bytes:
    """What the in-process round makes of client ``cid``'s upload (weighted as it sums it)."""
    if cid < sim.run.clients.honest:
        upload = sim.honest_clients.train([cid], w, r, generator)[0]
    else:
        upload = sim.byzantine_clients.client_upload(cid, w, r, generator)
    share = sim.share
    upload = upload if share is None else share.weigh(upload[None], [cid])[0]
    return upload.numpy().tobytes()


CASES = {
    "dp-sgd, normalised with momentum": {
        "privacy": DP_SGD | {"clipping": "normalize", "momentum": 0.1}
    },
    "plain, weighted, auxiliary set": {
        "training": {"weighted": True},
        "data": {"auxiliary_per_class": 5},
    },
    "shuffled batches": {"training": {"sampling": "shuffle"}, "privacy": DP_SGD},
    "replayed batches": {"training": {"sampling": "replay", "local_steps": 3}},
    "adaclip": {"privacy": DP_SGD | {"clipping": "adaclip"}},
    "client level, own-update attack, honest only": {
        "privacy": DP_SGD | {"level": "client", "clip": 0.5},
        "attack": {"name": "sign_flipping", "options": {"scale": 3}},
        "data": {"honest_only": True},
        "secure_aggregation": {"cluster_size": 1},
    },
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_clients_uploads_are_the_simulations_bit_for_bit(case):
    (run,) = expand(config(**CASES[case]))
    for cid in range(run.clients.total):
        sim, part = Simulation(run), ClientPart(run, cid)
        assert part.setup.held == cid and part.setup.test is None
        np.testing.assert_array_equal(
            part.setup.train.inputs, sim.setup.train.subset(sim.setup.part(cid)).inputs
        )
        assert part.setup.privacy == sim.setup.privacy
        w = sim.model_vector.clone()
        for r in range(run.rounds):
            ours, theirs = (
                torch.Generator().manual_seed(100 + r),
                torch.Generator().manual_seed(100 + r),
            )
            part.use_generator(ours)
            upload = part.update(w, r)
            assert upload.numpy().tobytes() == simulation_upload(sim, cid, w, r, theirs), (cid, r)
            w = w - 0.5 * upload  # the next round from another model


def test_a_client_process_holds_its_own_examples_and_no_server():
    (run,) = expand(config(privacy=DP_SGD))
    trainer = SimulationTrainer(run, 6)  # a label flipper
    part = trainer.client
    assert part.generator is trainer.randomness
    assert len(part.setup.train) == len(part.setup.byzantine_parts[0]) < 643 // 4
    assert part.setup.test is None and part.setup.auxiliary is None
    assert not hasattr(part, "server")
    with pytest.raises(TrainingError, match="client 0's examples only"):
        part.clients.clients.train(part.initial_model(), [1], part.generator)  # type: ignore[union-attr]
    model = part.initial_model().numpy()
    upload = trainer(model, round=0, client_id=6)
    assert upload.dtype == np.float32 and upload.shape == model.shape


def test_the_discrete_pipeline_of_a_client_is_the_simulations():
    privacy = {
        "enabled": True,
        "level": "client",
        "noise_split": "cluster",
        "epsilon": 4.0,
        "clip": 0.5,
        "delta": 1e-5,
        "distributed": "skellam",
        "accountant": "rdp",
    }
    (run,) = expand(
        config(
            privacy=privacy,
            secure_aggregation={"cluster_size": 3, "bits": 32},
            attack={"name": "none"},
        )
    )
    assert ClientPart(run, 1).ring_encoder == Simulation(run).ring_encoder is not None


def test_a_client_outside_the_run_is_refused():
    (run,) = expand(config())
    with pytest.raises(SimulationConfigError, match=r"not in 0\.\.7"):
        ClientPart(run, 8)
