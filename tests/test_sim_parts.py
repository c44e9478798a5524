"""The simulator's parts on their own: the pure run setup, one σ source shared by training
and accounting (schedules included), the results writer and reader, the stepped loop, the
gRPC bridge through the simulation's public API, and the names (papers, aliases)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from sim_configs import with_overrides

from sharefl import papers
from sharefl.rounds.released import Released
from sharefl.simulation_bridge import SimulationStrategy, SimulationTrainer
from sharefl.simulator.config import SimulationConfigError, expand
from sharefl.simulator.federated import populations
from sharefl.simulator.federated.loop import Simulation
from sharefl.simulator.federated.setup import PrivacyPlan, build_setup
from sharefl.simulator.models import MODELS, build_model
from sharefl.simulator.names import MODEL_ALIASES, PARTITION_ALIASES, model_name
from sharefl.simulator.partition import SCHEMES, partition
from sharefl.simulator.results import (
    ROUNDS_FILE,
    ResultsError,
    RoundRecord,
    RunWriter,
    load_runs,
    run_summary,
)
from sharefl.simulator.stepped import SteppedLoop
from sharefl.simulator.training import VectorizedClients

ROOT = Path(__file__).resolve().parents[1]


def config(**overrides) -> dict:
    base = {
        "name": "parts",
        "seed": 3,
        "rounds": 4,
        "eval_every": 2,
        "data": {
            "dataset": "synthetic",
            "options": {"num_examples": 600, "shape": [1, 6, 6], "noise": 0.4},
            "partition": "iid",
        },
        "model": {"name": "mlp", "options": {"hidden": [16]}},
        "clients": {"honest": 6},
        "training": {"batch_size": 8, "local_steps": 2, "learning_rate": 0.5, "upload": "delta"},
        "secure_aggregation": {"cluster_size": 1},
        "aggregator": {"name": "mean"},
    }
    return with_overrides(base, overrides)


def one_run(**overrides):
    (run,) = expand(config(**overrides))
    return run


SCHEDULED = {
    "enabled": True,
    "noise_multiplier": 1.0,
    "clipping": "flat",
    "clip": 1.0,
    "delta": 1e-5,
    "schedule": "linear",
    "schedule_options": {"decay": 0.1},
}


# -- setup ---------------------------------------------------------------------------------


def test_setup_is_deterministic_and_leaves_global_random_state_alone():
    run = one_run(data={"auxiliary_per_class": 2}, privacy=SCHEDULED)
    torch_state, np_state = torch.get_rng_state(), np.random.get_state()
    a, b = build_setup(run), build_setup(run)
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert np.random.get_state()[1].tolist() == np_state[1].tolist()
    assert all(np.array_equal(x, y) for x, y in zip(a.honest_parts, b.honest_parts, strict=True))
    assert torch.equal(a.initial, b.initial)
    assert a.privacy == b.privacy and a.privacy.schedule == b.privacy.schedule
    assert a.auxiliary is not None and b.auxiliary is not None
    assert torch.equal(a.auxiliary.targets, b.auxiliary.targets)
    # the auxiliary examples are taken out of the clients' pool
    pool = np.concatenate(a.honest_parts)
    assert len(pool) + len(a.auxiliary.targets) == len(a.train.targets)


def test_the_plan_is_the_one_sigma_source_for_training_and_accounting(monkeypatch):
    run = one_run(privacy=SCHEDULED)
    sim = Simulation(run)
    trained: list[float] = []
    added: list[float] = []
    composed: list[float] = []
    train, private_gradient = VectorizedClients.train, VectorizedClients._private_gradient

    def spy_train(self, *args, **kwargs):
        trained.append(kwargs["sigma"])
        return train(self, *args, **kwargs)

    def spy_gradient(self, params, rows, mask, sigma, *args, **kwargs):
        added.append(sigma)
        return private_gradient(self, params, rows, mask, sigma, *args, **kwargs)

    monkeypatch.setattr(VectorizedClients, "train", spy_train)
    monkeypatch.setattr(VectorizedClients, "_private_gradient", spy_gradient)
    step = sim.ledger.accountant.step
    monkeypatch.setattr(
        sim.ledger.accountant, "step", lambda s, q, n=1: (composed.append(s), step(s, q, n))[1]
    )
    sim.run_rounds()
    expected = [1.0 - 0.1 * t for t in range(run.rounds)]  # the linear schedule by round
    assert trained == pytest.approx(expected)
    assert composed == pytest.approx(expected)
    assert sim.ledger.sigmas == pytest.approx(expected)
    per_step = [s for s in expected for _ in range(run.training.local_steps)]
    assert added == pytest.approx(per_step)  # every local step adds the round's σ
    assert sim.ledger.plan.sigma(2) == pytest.approx(0.8)


def test_client_level_noise_follows_the_same_schedule(monkeypatch):
    privacy = {**SCHEDULED, "level": "client", "clip": 2.0}
    run = one_run(privacy=privacy, training={"local_steps": 1})
    sim = Simulation(run)
    used: list[float] = []
    original = populations.privatize_update_

    def spy(row, cfg, generator, **kwargs):
        used.append(cfg.noise_multiplier)
        return original(row, cfg, generator, **kwargs)

    monkeypatch.setattr(populations, "privatize_update_", spy)
    sim.run_rounds()
    honest = run.clients.honest
    expected = [1.0 - 0.1 * t for t in range(run.rounds)]
    assert used == pytest.approx([s for s in expected for _ in range(honest)])
    assert sim.ledger.sigmas == pytest.approx(expected)


def test_a_non_private_plan_adds_no_noise():
    plan = Simulation(one_run()).ledger.plan
    assert isinstance(plan, PrivacyPlan)
    assert not plan.enabled and plan.sigma(0) == 0.0 and not plan.client_level


# -- results -------------------------------------------------------------------------------


class _Finished:
    def __init__(self, run):
        self.run, self.device = run, torch.device("cpu")

    def privacy_summary(self):
        return 1e-5, {"noise_multiplier": 1.5}


def test_results_writer_and_reader_round_trip_with_extra_keys(tmp_path):
    run = one_run(label="round trip")
    writer = RunWriter(tmp_path / "run")
    writer.start(run.to_dict())
    records = [
        RoundRecord(1, None, None, None, 0.1),  # not evaluated: not written
        RoundRecord(2, 0.5, 1.25, 0.3, 0.2, {"disagreement": 4.5, "epsilon_round": 0.2}),
        RoundRecord(3, None, None, None, 0.3),
        RoundRecord(4, 0.75, float("inf"), 0.6, 0.4, {"disagreement": 1.0}),
    ]
    written = [writer.record(r) for r in records]
    assert written == [False, True, False, True]
    writer.finish(run_summary(_Finished(run), records[-1], writer.accuracies))
    (back,) = load_runs(tmp_path)
    assert back.finished and back.name == "parts" and back.label == "round trip"
    assert back.final_accuracy == 0.75 and back.best_accuracy == 0.75
    assert back.epsilon == 0.6 and back.delta == 1e-5
    assert back.config["seed"] == run.seed
    assert [r.round for r in back.rounds] == [2, 4]
    assert back.rounds[0] == records[1]  # every field, extra keys included
    assert back.rounds[1].extra == {"disagreement": 1.0} and back.rounds[1].loss == float("inf")


def test_an_unfinished_run_is_read_from_its_rounds_and_config(tmp_path):
    run = one_run()
    writer = RunWriter(tmp_path / "grid" / "a")
    writer.start(run.to_dict())
    writer.record(RoundRecord(2, 0.4, 1.0, None, 1.0))
    (back,) = load_runs(tmp_path)
    assert not back.finished and back.name == "parts" and back.seed == run.seed
    assert [r.accuracy for r in back.rounds] == [0.4]


def test_extra_keys_may_not_shadow_the_fixed_ones_and_bad_lines_name_their_file(tmp_path):
    with pytest.raises(ResultsError, match="accuracy"):
        RoundRecord(1, 0.5, extra={"accuracy": 0.9})
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / ROUNDS_FILE).write_text(json.dumps({"round": 1, "accuracy": 2.0}) + "\n")
    with pytest.raises(ResultsError, match=r"rounds\.jsonl:1: 'accuracy' must be a fraction"):
        load_runs(tmp_path)


def test_the_reader_skips_a_deployment_servers_protocol_log(tmp_path):
    run = one_run()
    writer = RunWriter(tmp_path / run.run_id)  # where launch --out puts the run's folder
    writer.start(run.to_dict())
    writer.record(RoundRecord(2, 0.4, 1.0, None, 1.0))
    # sharefl serve's own log in the same --out folder (cluster reports, no accuracy)
    (tmp_path / ROUNDS_FILE).write_text(json.dumps({"round": 1, "clusters": []}) + "\n")
    (tmp_path / "checkpoint.npz").write_bytes(b"")
    (back,) = load_runs(tmp_path)
    assert back.path == tmp_path / run.run_id


def test_simulate_writes_the_format_the_reader_reads(tmp_path):
    from sharefl.simulator.runner import run_one

    run = one_run()
    outcome = run_one(run, tmp_path)
    (back,) = load_runs(tmp_path)
    assert back.final_accuracy == outcome.summary["final_accuracy"]
    assert [r.round for r in back.rounds] == [2, 4]
    assert back.rounds[-1].seconds is not None and back.rounds[-1].seconds > 0


# -- the stepped loop ----------------------------------------------------------------------


def test_run_rounds_stops_at_the_last_round_and_refuses_to_run_past_it():
    sim = Simulation(one_run(rounds=3, eval_every=2))
    seen: list[RoundRecord] = []
    last = sim.run_rounds(seen.append)
    assert [r.round for r in seen] == [1, 2, 3] and last is seen[-1]
    assert [r.accuracy is not None for r in seen] == [False, True, True]
    assert isinstance(sim, SteppedLoop)
    with pytest.raises(RuntimeError, match="all 3 rounds have run"):
        sim.run_rounds()


# -- the gRPC bridge through the public API ------------------------------------------------


def test_the_bridge_steps_the_server_with_the_trainers_uploads(tmp_path):
    run = one_run(
        rounds=2,
        clients={"honest": 4},
        secure_aggregation={"cluster_size": 2, "min_sum_size": 2},
        privacy={"enabled": True, "noise_multiplier": 1.0, "clipping": "flat", "clip": 1.0},
    )
    strategy = SimulationStrategy(run, tmp_path / "grpc")
    strategy.check(2)
    model = strategy.initial_model()
    assert model.shape == (strategy.dim,)
    np.testing.assert_array_equal(model, Simulation(run).model_vector.numpy())
    trainers = [SimulationTrainer(run, cid) for cid in range(run.clients.total)]
    uploads = [t(model, round=0, client_id=t.client_id) for t in trainers]
    # OS-seeded noise: two trainers of the same client do not draw the same noise
    again = SimulationTrainer(run, 0)(model, round=0, client_id=0)
    assert not np.array_equal(again, uploads[0])
    released = Released.of([[(uploads[0] + uploads[1], (0, 1)), (uploads[2] + uploads[3], (2, 3))]])
    new, aggregate, note = strategy.apply(model, 0, released)
    np.testing.assert_allclose(aggregate, np.mean(uploads, axis=0), rtol=1e-5, atol=1e-6)
    lr = strategy.simulation.server.learning_rate
    np.testing.assert_allclose(new, model - lr * aggregate, rtol=1e-5, atol=1e-6)
    assert note == ""  # round 1 of 2 is not evaluated (eval_every = 2)
    new2, _, note2 = strategy.apply(new, 1, released)
    assert "test accuracy" in note2
    np.testing.assert_array_equal(new2, strategy.simulation.model_vector.numpy())
    (back,) = load_runs(tmp_path)
    assert back.finished and back.label.endswith("(gRPC)") and [r.round for r in back.rounds] == [2]
    assert back.epsilon is not None and back.epsilon > 0


def test_the_bridge_uses_no_private_state_of_the_simulation():
    source = (ROOT / "sharefl" / "simulation_bridge.py").read_text()
    for reach_in in ("sim.w", ".generator =", "sim.round", "simulation.rule", "sim.rule"):
        assert reach_in not in source, reach_in


# -- names ---------------------------------------------------------------------------------


def test_every_codename_maps_to_one_paper_and_docs_list_them():
    assert sorted(papers.PAPERS) == [f"seed00{i}" for i in range(5)]
    doc = (ROOT / "docs" / "papers.md").read_text()
    for p in papers.PAPERS.values():
        assert papers.paper(p.short) is p and papers.paper(p.codename) is p
        assert p.title in doc.replace("\n  ", " ")
        assert p.authors[0] in doc
    shorts = {p.short for p in papers.PAPERS.values()}
    for new in [*MODEL_ALIASES.values(), *PARTITION_ALIASES.values()]:
        assert any(new.startswith(s + "_") for s in shorts), new
    with pytest.raises(KeyError, match="seed002/dp_rsa"):
        papers.paper("seed009")


def test_the_package_names_papers_not_codenames():
    """Docstrings and comments name a paper (the DP filter, SHARE, DP-RSA, Fed-αCDP, Ye, Zhu
    and Ling), not its codename: a ``seed00x`` is left only where a codename is the subject
    (:mod:`sharefl.papers`, the aliases of :mod:`sharefl.simulator.names` and the docstrings
    that list them) and in identifiers (``seed000_init``)."""
    codename = re.compile(r"\b[Ss]eed00[0-4]\b(?!_)")
    subject = re.compile(r"codename|alias|``seed00|([\"'])seed00[0-4]\1", re.IGNORECASE)
    found = []
    for path in sorted((ROOT / "sharefl").rglob("*.py")):
        if path.name == "papers.py" or path.parts[-2:] == ("simulator", "names.py"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if codename.search(line) and not subject.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize(("alias", "name"), sorted(MODEL_ALIASES.items()))
def test_model_aliases_build_the_same_model(alias, name):
    assert alias not in MODELS and MODELS[model_name(alias)] is MODELS[name]
    shape = (3, 32, 32) if name == "dp_rsa_cnn" else (1, 28, 28)
    a = build_model(alias, input_shape=shape, seed=5)
    b = build_model(name, input_shape=shape, seed=5)
    assert type(a) is type(b)
    for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize(("alias", "name"), sorted(PARTITION_ALIASES.items()))
def test_partition_aliases_split_the_same_way(alias, name):
    assert name in SCHEMES and alias not in SCHEMES
    y = np.repeat(np.arange(10), 60)
    options = {"shard_size": 20} if name == "fed_cdp_replicated_shards" else {}
    a = partition(y, 20, alias, seed=4, **options)
    b = partition(y, 20, name, seed=4, **options)
    assert all(np.array_equal(x, z) for x, z in zip(a, b, strict=True))


def test_no_experiment_file_keeps_a_codename():
    files = sorted((ROOT / "experiments").iterdir())
    assert files
    assert [f.name for f in files if f.name.startswith("seed00")] == []
    for f in files:
        if f.suffix != ".toml":
            continue
        data = tomllib.loads(f.read_text())
        model = data.get("model", {}).get("name")
        scheme = data.get("data", {}).get("partition")
        assert model not in MODEL_ALIASES, f"{f.name}: model {model}"
        assert scheme not in PARTITION_ALIASES, f"{f.name}: partition {scheme}"
        assert "seed00" not in str(data.get("name", "")), f.name


def test_every_algorithm_name_has_a_loop_in_the_table():
    """[algorithm] name is checked against config.ALGORITHMS and looked up in loops.LOOPS:
    the two agree, and each entry holds its folder's loop class (imported statically, so
    the import contracts see it) with the runner's interface and its folder's attacks."""
    import importlib

    from sharefl.simulator.config import ALGORITHMS
    from sharefl.simulator.loops import LOOPS

    assert set(LOOPS) == set(ALGORITHMS)
    for algorithm, entry in LOOPS.items():
        cls = entry.loop
        assert isinstance(cls, type) and cls.__module__ == f"sharefl.simulator.{algorithm}.loop"
        assert all(callable(getattr(cls, m, None)) for m in ("run_rounds", "final_model"))
        assert issubclass(cls, SteppedLoop) and cls.algorithm == algorithm
        attacks = importlib.import_module(f"sharefl.simulator.{algorithm}.attacks")
        assert entry.attacks is attacks.ATTACKS and entry.attacks[0] == "none"
        assert callable(attacks.build_attack)


@pytest.mark.parametrize("loop", ["federated", "dp_rsa", "decentralized"])
def test_a_loop_refuses_a_run_of_another_loop_by_name(loop):
    """SteppedLoop.begin: a run built for one loop and handed to another is refused before
    any data loads, with the message naming the loop and where the right one comes from."""
    from sharefl.simulator.config import load_runs
    from sharefl.simulator.loops import LOOPS

    other = {"federated": "decentralized_mnist_rules"}.get(loop, "quickstart")
    experiments = Path(__file__).resolve().parents[1] / "experiments"
    run = load_runs(experiments / f"{other}.toml")[0]
    assert run.algorithm.name != loop
    cls = LOOPS[loop].loop
    with pytest.raises(
        SimulationConfigError, match=f"runs \\[algorithm\\] name = '{loop}'.*build_loop"
    ):
        cls(run)
