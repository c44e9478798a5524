"""One federated server round for the in-process loop and a deployment's server.

``Simulation.server_round`` is the recipe both run: the in-process loop makes the uploads
and runs the protocol itself, a deployment's server (the gRPC bridge's
``SimulationStrategy``) hands in the sums its protocol released. Fed the sums an
in-process run released, the bridge's server reproduces that run bit for bit: the model
after every round, the ε of every evaluation and the per-client ledger (the honest
participants charged, the known Byzantine members not)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sim_configs import with_overrides

from sharefl.rounds.released import Released
from sharefl.simulation_bridge import SimulationStrategy
from sharefl.simulator.config import SimulationConfigError, expand
from sharefl.simulator.federated.client import ClientPart
from sharefl.simulator.federated.loop import Simulation

CLUSTER_SPLIT = {
    "enabled": True,
    "level": "client",
    "noise_split": "cluster",
    "epsilon": 2.0,
    "clip": 0.05,
    "delta": 1e-5,
}


def config(**overrides) -> dict:
    """12 honest + 3 sign-flipping clients on synthetic 8×8 images, clusters of 3."""
    base = {
        "name": "server-round",
        "seed": 1,
        "rounds": 4,
        "eval_every": 2,
        "data": {
            "dataset": "synthetic",
            "options": {"num_examples": 1200, "shape": [1, 8, 8], "noise": 0.4},
            "partition": "iid",
            "auxiliary_per_class": 20,
        },
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "clients": {"honest": 12, "byzantine": 3},
        "training": {"batch_size": 16, "local_steps": 2, "learning_rate": 0.1, "upload": "delta"},
        "attack": {"name": "sign_flipping", "options": {"scale": 10}},
        "secure_aggregation": {"cluster_size": 3, "clip": 10.0},
        "aggregator": {"name": "trimmed_mean", "options": {"f": 1}},
    }
    return with_overrides(base, overrides)


def in_process(
    run, *, failed_rounds: frozenset[int] = frozenset()
) -> tuple[list[Released], list[np.ndarray], Simulation]:
    """Every round of ``run`` in process: the sums each round released and the model after
    it. In ``failed_rounds`` (0-based) every cluster fails: the protocol runs and nothing
    is released."""
    sim = Simulation(run)
    share = sim.share
    secure_sums = share.secure_sums
    released: list[Released] = []

    def recording(*args, **kwargs):
        sums = secure_sums(*args, **kwargs)
        released.append(Released.of([]) if len(released) in failed_rounds else sums)
        return released[-1]

    share.secure_sums = recording
    models = []
    for _ in range(run.rounds):
        sim.step()
        models.append(sim.model_vector.numpy().copy())
    return released, models, sim


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"secure_aggregation": {"reclusterings": 2}, "server": {"momentum": 0.5}},
        {
            # the honest participants charged; Byzantine members of a sum are known
            "secure_aggregation": {"cluster_size": 4},
            "privacy": CLUSTER_SPLIT | {"colluders": 0},
        },
        {
            "attack": {"name": "none"},
            "clients": {"honest": 12, "byzantine": 0},
            "secure_aggregation": {"reclusterings": 2},
            "privacy": CLUSTER_SPLIT | {"distributed": "skellam", "bits": 20},
        },
    ],
    ids=["trimmed-mean", "reclusterings-momentum", "cluster-split", "skellam"],
)
def test_the_bridge_replays_an_in_process_run_bit_for_bit(overrides, tmp_path):
    (run,) = expand(config(**overrides))
    released, models, sim = in_process(run)
    strategy = SimulationStrategy(run, tmp_path)
    model = strategy.initial_model()
    for round_index, sums in enumerate(released):
        model, _, _ = strategy.apply(model, round_index, sums)
        assert model.tobytes() == models[round_index].tobytes(), round_index
    bridge = strategy.simulation
    assert bridge.epsilon() == sim.epsilon()
    assert bridge.extra_summary()["share"].get("client_dp") == sim.extra_summary()["share"].get(
        "client_dp"
    )
    rounds = [json.loads(x) for x in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rounds] == [2, 4]


@pytest.mark.parametrize(
    "overrides",
    [
        {"server": {"momentum": 0.5}, "rounds": 3, "eval_every": 1},
        {
            "attack": {"name": "none"},
            "clients": {"honest": 12, "byzantine": 0},
            "privacy": CLUSTER_SPLIT,
            "rounds": 3,
            "eval_every": 1,
        },
    ],
    ids=["momentum", "cluster-split"],
)
def test_a_round_that_released_nothing_is_the_same_round_in_process_and_deployed(
    overrides, tmp_path
):
    """Every cluster of round 2 fails: in process the round still runs its recipe (a zero
    aggregate: server momentum moves the model, the accountant composes the round, the
    round is evaluated); the deployed server hands the bridge the empty release and gets
    the same model, record and ε, bit for bit (it used to skip the strategy: the model
    stood still and the round was neither charged nor evaluated)."""
    (run,) = expand(config(**overrides))
    released, models, sim = in_process(run, failed_rounds=frozenset({1}))
    assert not released[1] and released[0] and released[2]
    strategy = SimulationStrategy(run, tmp_path)
    model = strategy.initial_model()
    notes = []
    for round_index, sums in enumerate(released):
        model, aggregate, note = strategy.apply(model, round_index, sums)
        assert (aggregate is None) == (not sums)
        assert model.tobytes() == models[round_index].tobytes(), round_index
        notes.append(note)
    assert "test accuracy" in notes[1]  # the empty round is evaluated, as in process
    assert strategy.simulation.epsilon() == sim.epsilon()
    if "momentum" in str(overrides):
        assert models[1].tobytes() != models[0].tobytes()  # momentum moved it anyway


def test_the_bridge_runs_zeno_over_the_released_sums(tmp_path):
    """Zeno++ over a deployment's sums (its server holds the validation set): before the
    one round, the bridge refused it with a message about cluster sizes."""
    (run,) = expand(config(aggregator={"name": "zeno", "options": {"rho": 1e-4, "epsilon": 0.0}}))
    released, _, _ = in_process(run)
    strategy = SimulationStrategy(run, tmp_path)
    model = strategy.initial_model()
    for round_index, sums in enumerate(released):
        model, aggregate, _ = strategy.apply(model, round_index, sums)
        assert np.isfinite(aggregate).all()
    zeno = strategy.simulation.share.zeno
    assert zeno.candidates == sum(len(r) for sums in released for r in sums.sums)


def test_the_bridge_follows_the_servers_round_index(tmp_path):
    """The strategy's round is the server's (here round 2 of 2, evaluated and summarised),
    whatever rounds the bridge saw before."""
    (run,) = expand(config(rounds=2))
    released, _, _ = in_process(run)
    strategy = SimulationStrategy(run, tmp_path)
    _, _, note = strategy.apply(strategy.initial_model(), 1, released[1])
    assert "test accuracy" in note and strategy.simulation.round == 2
    assert (tmp_path / "summary.json").exists()


def test_released_sums_need_their_members_and_no_empty_reclustering():
    one = np.zeros(3, dtype=np.float32)
    assert not Released.of([[], []])
    kept = Released.of([[], [(one, (0, 1)), (one, (2, 3, 4))]])
    assert kept.pairs() == [[(one, 2), (one, 3)]] and kept.all_members() == [(0, 1), (2, 3, 4)]
    with pytest.raises(ValueError, match="members"):
        Released(sums=((one,),), members=((),))
    with pytest.raises(ValueError, match="left out"):
        Released(sums=((),), members=((),))


def test_released_sums_need_clusters():
    (run,) = expand(config(secure_aggregation={"cluster_size": 1}))
    with pytest.raises(SimulationConfigError, match="cluster_size >= 2"):
        Simulation(run).server_round(Released.of([]))


def test_a_client_process_uploads_its_weighted_delta_as_the_in_process_round_sums_it():
    """``training.weighted``: the in-process round weighs every upload (N·n_i/n) before
    the protocol sums them, so a client process uploads its weighted delta."""
    partition = {"partition": "dirichlet", "partition_options": {"alpha": 0.5}}
    training = {"batch_size": 16, "local_steps": 2, "learning_rate": 0.1, "upload": "delta"}
    (plain,) = expand(config(data=partition))
    (weighted,) = expand(config(data=partition, training=training | {"weighted": True}))
    sims = Simulation(plain), Simulation(weighted)
    weights = sims[1].share.weights
    assert weights is not None and not np.allclose(weights.numpy(), 1.0)
    for cid in (0, 13):  # an honest client, a Byzantine one
        raw, up = (ClientPart(s.run, cid).update(s.model_vector, 0) for s in sims)
        assert up.numpy().tobytes() == (raw * weights[cid]).numpy().tobytes()


def test_a_round_whose_sums_the_rule_refuses_runs_as_a_round_that_released_nothing(tmp_path):
    """Drop-outs left one cluster sum of round 2 and TrimmedMean(f=1) needs 3: the bridge
    runs that round with a zero aggregate, as the round whose clusters all failed (server
    momentum moves the model, the round is evaluated), instead of ending the deployment
    with the rule's error."""
    (run,) = expand(config(server={"momentum": 0.5}, rounds=3, eval_every=1))
    released, models, _ = in_process(run, failed_rounds=frozenset({1}))
    full, _, _ = in_process(run)
    one = Released.of([[(full[1].sums[0][0], full[1].members[0][0])]])
    strategy = SimulationStrategy(run, tmp_path)
    model = strategy.initial_model()
    for round_index, sums in enumerate([released[0], one, released[2]]):
        model, _, note = strategy.apply(model, round_index, sums)
        assert model.tobytes() == models[round_index].tobytes(), round_index
    assert "test accuracy" in note
