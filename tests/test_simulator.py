"""The federated simulator end to end on small synthetic data: configuration and grids, the
loop learning, DP accounting, Byzantine clients against the plain mean and a robust rule,
secure versus clear cluster sums, the vectorised DP step against the reference DPSGD, the
runner's outputs, and the same run over gRPC."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import serving

from sharefl.cli import main as cli_main
from sharefl.deploy.client import ClientRuntime
from sharefl.deploy.server import serve
from sharefl.privacy import DPSGD, DPSGDConfig, FlatClipping, L2MaxClipping, Normalization
from sharefl.protocol.driver import secure_sum
from sharefl.simulation_bridge import SimulationStrategy, SimulationTrainer, deployment_for
from sharefl.simulator import training as training_module
from sharefl.simulator.config import SimulationConfigError, expand, load_runs
from sharefl.simulator.federated.loop import Simulation
from sharefl.simulator.models import ModelError, build_model
from sharefl.simulator.runner import run_grid
from sharefl.simulator.setup import load_data
from sharefl.simulator.training import FlatModel, LocalTraining, TrainingError, VectorizedClients


def base_config(**overrides) -> dict:
    config = {
        "name": "test",
        "seed": 1,
        "rounds": 12,
        "eval_every": 4,
        "data": {
            "dataset": "synthetic",
            "options": {"num_examples": 1200, "shape": [1, 8, 8], "noise": 0.4},
            "partition": "iid",
        },
        "model": {"name": "mlp", "options": {"hidden": [32]}},
        "clients": {"honest": 8},
        "training": {"batch_size": 16, "local_steps": 4, "learning_rate": 0.5, "upload": "delta"},
        "secure_aggregation": {"cluster_size": 1},
        "aggregator": {"name": "mean"},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


def run_once(config: dict) -> tuple[Simulation, list]:
    (run,) = expand(config)
    sim = Simulation(run)
    records = []
    sim.run_rounds(records.append)
    return sim, [r for r in records if r.accuracy is not None]


# -- configuration ------------------------------------------------------------------------


def test_lists_expand_into_a_grid_with_variants_labels_and_paper_values():
    config = base_config(seed=[1, 2], label="lr={training.learning_rate}")
    config["training"]["learning_rate"] = [0.1, 0.5]
    config["variant"] = [{}, {"label": "plain", "training": {"learning_rate": 0.3}}]
    config["paper"] = {"lr=0.1": 0.9}
    runs = expand(config)
    assert len(runs) == 2 * 2 + 2
    labels = [r.label for r in runs]
    assert labels.count("lr=0.1") == 2 and labels.count("plain") == 2
    assert {r.paper for r in runs if r.label == "lr=0.1"} == {0.9}
    assert all(r.paper is None for r in runs if r.label != "lr=0.1")
    assert len({r.run_id for r in runs}) == len(runs)
    assert expand(config)[0].run_id == runs[0].run_id  # stable
    config["paper"] = {"lr=0.1": 0.95}  # a corrected paper value keeps the finished runs
    assert expand(config)[0].run_id == runs[0].run_id


def test_run_ids_spell_out_greek_letters():
    config = base_config()
    config["variant"] = [{"label": "Fed-αCDP, σ=0.5"}, {"label": "Fed-CDP, σ=0.5"}]
    ids = [r.run_id for r in expand(config)]
    assert "Fed-alphaCDP-sigma-0-5-s" in ids[0] and "Fed-CDP-sigma-0-5-s" in ids[1]


def test_run_ids_keep_the_label_when_the_name_is_long():
    """The name is cut first, so runs of one file differ in their readable prefix; ids
    whose name and label fit in 60 characters are those earlier versions gave."""
    config = base_config(
        name="DP filter (Xiang et al.) Figure 1 (MNIST, label flipping, 1,500 steps)"
    )
    config["variant"] = [{"label": "30 Byzantine, first_stage=True"}, {"label": "30 Byzantine"}]
    first, second = expand(config)
    assert first.run_id.startswith("DP-filter-Xiang-et-al-Figure-1-MNIST-label-flipping-1-500")
    assert "-30-Byzantine-first-stage-True-s1-" in first.run_id
    assert "-30-Byzantine-s1-" in second.run_id
    assert first.run_id.endswith(first.run_key) and first.earlier_run_id.endswith(first.run_key)
    assert first.earlier_run_id[:60] == second.earlier_run_id[:60]  # what the change mends
    (short,) = expand(base_config(name="quickstart"))
    assert short.run_id == short.earlier_run_id
    long_label = base_config(name="n" * 200)
    long_label["variant"] = [{"label": "l" * 200}]
    (long,) = expand(long_label)
    assert long.run_id.startswith("n" * 20 + "-l") and len(long.run_id) <= 120 + 1 + 14


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"clients": {"honest": 0}}, "clients.honest"),
        ({"training": {"batch_size": "16"}}, "training.batch_size must be an integer"),
        ({"training": {"colour": 1}}, "unknown key(s) in [training]"),
        ({"rounds": 0}, "rounds must be >= 1"),
        ({"bogus": 1}, "unknown key(s)"),
        ({"attack": {"name": "label_flipping"}}, "needs clients.byzantine"),
        ({"training": {"upload": "gradient"}}, "local_steps = 1"),
        ({"privacy": {"enabled": True}}, "privacy.epsilon"),
        ({"data": {"input_mean": [0.1], "input_std": []}}, "data.input_mean and data.input_std"),
        ({"training": {"sampling": "uniform"}}, 'training.sampling must be "poisson", "shuffle"'),
    ],
)
def test_invalid_configurations_name_the_key(patch, message):
    with pytest.raises(SimulationConfigError, match=re.escape(message)):
        expand(base_config(**patch))


def test_runs_standardise_their_inputs_when_configured():
    plain = base_config()
    standardised = base_config(data={**plain["data"], "input_mean": [0.5], "input_std": [0.25]})
    (a,), (b,) = expand(plain), expand(standardised)
    (train_a, test_a), (train_b, test_b) = (
        load_data(a, torch.device("cpu")),
        load_data(b, torch.device("cpu")),
    )
    torch.testing.assert_close(train_b.inputs, (train_a.inputs - 0.5) / 0.25)
    torch.testing.assert_close(test_b.inputs, (test_a.inputs - 0.5) / 0.25)


def test_the_noise_filter_refuses_cluster_sums():
    config = base_config(
        privacy={"enabled": True, "noise_multiplier": 1.0, "clipping": "normalize"},
        secure_aggregation={"cluster_size": 3},
        aggregator={"name": "noise_filter"},
        data={**base_config()["data"], "auxiliary_per_class": 2},
    )
    (run,) = expand(config)
    with pytest.raises(SimulationConfigError, match="individual uploads"):
        Simulation(run)


def test_shipped_experiment_files_parse():
    for name, count in [
        ("quickstart", 1),
        ("dp_filter_mnist_table15", 18),
        ("dp_filter_mnist_figure1", 63),  # 21 cells of Figure 1 (and 90 %) × 3 seeds
        ("dp_filter_mnist_table3", 6),
    ]:
        runs = load_runs(f"experiments/{name}.toml")
        assert len(runs) == count, name
        if name != "quickstart":
            assert all(r.paper is not None for r in runs), name


# -- learning, privacy, robustness ---------------------------------------------------------


def test_the_loop_learns_on_synthetic_data():
    _, evals = run_once(base_config())
    assert evals[0].accuracy < evals[-1].accuracy
    assert evals[-1].accuracy > 0.8


def test_dp_training_reports_the_calibrated_epsilon_and_still_learns():
    config = base_config(
        rounds=12,
        privacy={"enabled": True, "epsilon": 4.0, "clipping": "flat", "clip": 1.0},
    )
    sim, evals = run_once(config)
    assert sim.ledger.plan.noise_multiplier > 0
    assert evals[-1].epsilon == pytest.approx(4.0, rel=0.02)
    assert all(a.epsilon < b.epsilon for a, b in itertools.pairwise(evals))
    assert evals[-1].accuracy > 0.5


def test_byzantine_clients_break_the_mean_and_a_robust_rule_filters_them():
    attack = {"name": "sign_flipping", "options": {"scale": 10.0}}
    common = {"clients": {"honest": 8, "byzantine": 3}, "attack": attack}
    _, mean = run_once(base_config(**common))
    _, robust = run_once(base_config(**common, aggregator={"name": "median"}))
    _, clean = run_once(base_config())
    assert mean[-1].accuracy < 0.5
    assert robust[-1].accuracy > 0.8
    assert robust[-1].accuracy > clean[-1].accuracy - 0.1


def test_label_flipping_and_share_clusters_with_a_robust_rule_learn():
    config = base_config(
        clients={"honest": 9, "byzantine": 3},
        attack={"name": "label_flipping"},
        secure_aggregation={"cluster_size": 3},
        aggregator={"name": "trimmed_mean", "options": {"f": 1}},
    )
    _, evals = run_once(config)
    assert evals[-1].accuracy > 0.8


def test_seed000_protocol_with_the_noise_filter_resists_label_flipping():
    data = {**base_config()["data"], "auxiliary_per_class": 2, "honest_only": True}
    config = base_config(
        rounds=30,
        eval_every=10,
        data=data,
        clients={"honest": 6, "byzantine": 9},
        training={"batch_size": 16, "local_steps": 1, "upload": "gradient"},
        privacy={
            "enabled": True,
            "noise_multiplier": 0.5,
            "clipping": "normalize",
            "momentum": 0.1,
        },
        attack={"name": "label_flipping"},
        aggregator={"name": "noise_filter", "options": {"first_stage": False}},
        server={"learning_rate": 2.0},
    )
    sim, evals = run_once(config)
    assert sim.server.noise_filter is not None and sim.server.noise_filter.state.rounds == 30
    selected = sim.server.noise_filter.state.cumulative.topk(6).indices
    assert int((selected < 6).sum()) >= 5  # the filter keeps (almost only) honest workers
    assert evals[-1].accuracy > 0.7


def test_secure_and_clear_cluster_sums_are_identical():
    rng = np.random.default_rng(0)
    inputs = {cid: rng.normal(0, 0.1, 500).astype(np.float32) for cid in range(10)}
    kwargs = {"cluster_size": 3, "reclusterings": 1, "seed": 7, "clip": 1.0}
    secure = secure_sum(inputs, **kwargs)
    clear = secure_sum(inputs, **kwargs, protocol=False)
    assert [s.members for s in secure.clusters] == [s.members for s in clear.clusters]
    for a, b in zip(secure.clusters, clear.clusters, strict=True):
        np.testing.assert_array_equal(a.ring_sum, b.ring_sum)


def test_a_run_with_the_protocol_equals_the_same_run_in_the_clear():
    config = base_config(
        rounds=3,
        clients={"honest": 7},
        secure_aggregation={"cluster_size": 3, "enabled": True},
    )
    secure, _ = run_once(config)
    config["secure_aggregation"] = {"cluster_size": 3, "enabled": False}
    clear, _ = run_once(config)
    torch.testing.assert_close(secure.model_vector, clear.model_vector, rtol=0, atol=0)


@pytest.mark.parametrize(("sampling", "shared"), [("shuffle", False), ("poisson", True)])
def test_the_vectorised_dp_step_matches_the_reference_dpsgd(sampling, shared):
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(1, 6, 6), hidden=(8,))
    flat = FlatModel(model)
    inputs, targets = torch.rand(60, 1, 6, 6), torch.randint(0, 10, (60,))
    parts = [list(range(0, 20)), list(range(20, 40)), list(range(40, 60))]
    training = LocalTraining(
        batch_size=5, upload="gradient", sampling=sampling, clipping=FlatClipping(0.5)
    )
    clients = VectorizedClients(flat, inputs, targets, parts, training)
    gen = torch.Generator().manual_seed(3)
    rows, mask = clients.sample(torch.tensor([0, 1, 2]), gen)
    assert sampling == "shuffle" or not mask.all()  # Poisson batches are padded and masked
    w = flat.initial()
    ours = clients._private_gradient(
        w.repeat(3, 1), rows, mask, 0.0, torch.Generator().manual_seed(0), None, shared=shared
    )
    for k in range(3):
        dp = DPSGD(
            model,
            torch.nn.functional.cross_entropy,
            DPSGDConfig(FlatClipping(0.5), 0.0, expected_batch_size=5),
            generator=torch.Generator().manual_seed(0),
        )
        taken = rows[k][mask[k]]
        reference = dp.privatize(inputs[taken], targets[taken]).flat
        torch.testing.assert_close(ours[k], reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", [Normalization(momentum=0.1), L2MaxClipping(max_norm=0.3)])
def test_packed_per_example_steps_match_a_per_client_loop(mode):
    torch.manual_seed(1)
    flat = FlatModel(build_model("mlp", input_shape=(1, 4, 4), hidden=(6,)))
    inputs, targets = torch.rand(90, 1, 4, 4), torch.randint(0, 10, (90,))
    parts = [list(range(0, 30)), list(range(30, 60)), list(range(60, 90))]
    training = LocalTraining(batch_size=6, upload="gradient", clipping=mode, noise=0.7)
    clients = VectorizedClients(flat, inputs, targets, parts, training)
    rows, mask = clients.sample(torch.tensor([0, 1, 2]), torch.Generator().manual_seed(5))
    assert not mask.all()  # padded Poisson batches: the packed path with per-client weights
    w = flat.initial() + 0.1 * torch.randn(flat.dim)
    params = w.repeat(3, 1) + 0.05 * torch.randn(3, flat.dim)  # clients after local steps
    state = torch.randn(3, flat.dim)
    ours = clients._private_gradient(
        params, rows, mask, 0.7, torch.Generator().manual_seed(9), state.clone()
    )
    noise = torch.randn(3, flat.dim, generator=torch.Generator().manual_seed(9))
    for k in range(3):
        total, largest = torch.zeros(flat.dim), 0.0
        theta = params[k].clone().requires_grad_()
        for i in rows[k][mask[k]].tolist():
            loss = torch.nn.functional.cross_entropy(
                flat(theta, inputs[i : i + 1]), targets[i : i + 1]
            )
            (g,) = torch.autograd.grad(loss, theta)
            if isinstance(mode, Normalization):
                phi = 0.9 * g + 0.1 * state[k]
                total += phi / phi.norm()
            else:
                parts_k = torch.split(g, flat.numels)
                largest = max(largest, max(float(p.norm()) for p in parts_k))
                total += torch.cat([p * min(1.0, 0.3 / float(p.norm())) for p in parts_k])
        sens = 1.0 if isinstance(mode, Normalization) else min(0.3, largest or 0.3)
        expected = (total + noise[k] * 0.7 * sens) / 6
        torch.testing.assert_close(ours[k], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize(
    "mode", [FlatClipping(0.5), L2MaxClipping(max_norm=0.3), Normalization(momentum=0.1)]
)
def test_a_chunk_where_no_client_sampled_an_example_gets_the_noise_alone(mode, shared):
    """Poisson sampling can leave every client of a chunk without an example (5 label
    flippers at one expected example each: e^-5 a step). Each row must then be what an empty
    client gets beside a client that sampled one: its noise alone, and its momentum state."""
    flat = FlatModel(build_model("mlp", input_shape=(1, 4, 4), hidden=(6,)))
    inputs, targets = torch.rand(40, 1, 4, 4), torch.randint(0, 10, (40,))
    training = LocalTraining(batch_size=1, upload="gradient", clipping=mode, noise=0.7)
    clients = VectorizedClients(
        flat, inputs, targets, [list(range(20)), list(range(20, 40))], training
    )
    rows = torch.tensor([[3, 4], [25, 26]])
    one = torch.tensor([[False, False], [True, False]])  # client 1 sampled one example
    none = torch.zeros_like(one)
    w = (flat.initial() + 0.1 * torch.randn(flat.dim)).repeat(2, 1)
    state = torch.randn(2, flat.dim)
    results = []
    for mask in (one, none):
        momentum = state.clone()
        upload = clients._private_gradient(
            w, rows, mask, 0.7, torch.Generator().manual_seed(4), momentum, shared=shared
        )
        assert torch.isfinite(upload).all()
        results.append((upload, momentum))
    (with_one, state_one), (empty, state_empty) = results
    torch.testing.assert_close(empty[0], with_one[0])  # client 0 had no example either way
    torch.testing.assert_close(state_empty[0], state_one[0])
    assert not torch.equal(empty[1], with_one[1])  # client 1's example counted only once


def tiny_clients(sizes: list[int], training: LocalTraining) -> VectorizedClients:
    """Clients of a bias-free linear model on random 4×4 images, client k holding the next
    ``sizes[k]`` examples (contiguous index ranges)."""
    model = FlatModel(build_model("mlp", input_shape=(1, 4, 4), hidden=()))
    bounds = np.cumsum([0, *sizes]).tolist()
    parts = [list(range(lo, hi)) for lo, hi in itertools.pairwise(bounds)]
    n = bounds[-1]
    return VectorizedClients(
        model, torch.rand(n, 1, 4, 4), torch.randint(0, 10, (n,)), parts, training
    )


def test_sparse_poisson_batches_have_the_law_of_one_coin_per_example(monkeypatch):
    monkeypatch.setattr(training_module, "SPARSE_POISSON_KEYS", 0)
    training = LocalTraining(batch_size=4, clipping=FlatClipping(1.0), noise=1.0)
    clients = tiny_clients([400, 200], training)
    gen = torch.Generator().manual_seed(0)
    sizes, hits = [[], []], torch.zeros(600)
    for _ in range(2000):
        rows, mask = clients.sample(torch.tensor([0, 1]), gen)
        for k, (lo, hi) in enumerate(((0, 400), (400, 600))):
            taken = rows[k][mask[k]]
            assert ((taken >= lo) & (taken < hi)).all() and len(set(taken.tolist())) == len(taken)
            sizes[k].append(len(taken))
            hits[taken] += 1
    for k, n in enumerate((400, 200)):  # Binomial(n, 4/n): mean 4, variance 4(1 - 4/n)
        assert abs(np.mean(sizes[k]) - 4) < 0.15
        assert abs(np.var(sizes[k]) - 4 * (1 - 4 / n)) < 0.5
    np.testing.assert_allclose(hits[:400].mean() / 2000, 4 / 400, rtol=0.05)
    assert hits[:400].std() < 5.5  # Binomial(2000, 0.01) spread (4.45): all about as likely


def test_sparse_poisson_refuses_when_it_cannot_find_distinct_examples(monkeypatch):
    # A broken uniform source (always 0) makes every batch of >= 2 repeat position 0:
    # the rejection loop must give up with a named error instead of spinning forever.
    monkeypatch.setattr(training_module, "SPARSE_POISSON_KEYS", 0)
    clients = tiny_clients([400], LocalTraining(batch_size=4, clipping=FlatClipping(1.0)))
    monkeypatch.setattr(training_module.torch, "binomial", lambda n, p, **_: torch.full_like(n, 3))
    monkeypatch.setattr(training_module.torch, "rand", lambda *shape, **_: torch.zeros(*shape))
    with pytest.raises(TrainingError, match="did not find distinct examples"):
        clients.sample(torch.tensor([0]), torch.Generator().manual_seed(0))


def test_local_training_refuses_an_unknown_sampling():
    with pytest.raises(TrainingError, match="sampling must be one of"):
        LocalTraining(batch_size=5, sampling="uniform", clipping=FlatClipping(1.0))  # type: ignore[arg-type]


def test_replayed_batches_come_twice_in_a_row_and_again_every_epoch():
    training = LocalTraining(batch_size=5, sampling="replay", clipping=FlatClipping(1.0))
    clients = tiny_clients([40, 30], training)  # E = 8 and 6 steps per epoch
    gen = torch.Generator().manual_seed(0)
    seen = []
    for _ in range(24):
        rows, mask = clients.sample(torch.tensor([0, 1]), gen)
        assert mask.all() and rows.shape == (2, 5)
        assert ((rows[0] < 40).all() and (rows[1] >= 40).all()).item()
        seen.append(rows.clone())
        clients.steps_done += 1
    for s in range(0, 24, 2):
        assert torch.equal(seen[s], seen[s + 1])  # twice in a row
    for k, epoch in ((0, 8), (1, 6)):
        assert all(torch.equal(seen[s][k], seen[s + epoch][k]) for s in range(24 - epoch))
        distinct = {tuple(seen[s][k].tolist()) for s in range(24)}
        assert len(distinct) == epoch // 2  # ⌈E/2⌉ batches, nothing else


def test_poisson_batches_are_masked_samples_of_each_client():
    training = LocalTraining(batch_size=10, clipping=FlatClipping(1.0), noise=1.0)
    clients = tiny_clients([50, 30], training)
    gen = torch.Generator().manual_seed(0)
    counts = np.zeros(2)
    for _ in range(300):
        rows, mask = clients.sample(torch.tensor([0, 1]), gen)
        assert bool(((rows[0] < 50) | ~mask[0]).all()) and bool((rows[1] >= 50)[mask[1]].all())
        counts += mask.sum(1).numpy()
    np.testing.assert_allclose(counts / 300, [10, 10], rtol=0.1)


# -- outputs, CLI-level runner, gRPC -------------------------------------------------------


def test_runner_writes_results_and_skips_finished_runs(tmp_path):
    config = base_config(rounds=4, seed=[1, 2])
    runs = expand(config)
    first = run_grid(runs, tmp_path)
    assert [o.skipped for o in first] == [False, False]
    folder = first[0].folder
    lines = [json.loads(x) for x in (folder / "rounds.jsonl").read_text().splitlines()]
    assert [x["round"] for x in lines] == [4]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["final_accuracy"] == lines[-1]["accuracy"]
    assert summary["seed"] == 1 and summary["label"] == runs[0].label
    again = run_grid(runs, tmp_path)
    assert [o.skipped for o in again] == [True, True]
    config["paper"] = {runs[0].label: 0.9}  # a paper value added later reaches the summary
    corrected = run_grid(expand(config), tmp_path)
    assert [o.skipped for o in corrected] == [True, True]
    assert json.loads((folder / "summary.json").read_text())["paper"] == 0.9
    assert corrected[0].summary["paper"] == 0.9


def test_progress_shows_elapsed_time_and_eta(tmp_path):
    import io

    from sharefl.simulator.runner import Progress

    stream = io.StringIO()
    progress = Progress(stream)
    progress.last = -1e9  # not a terminal: a line every 10 s; show the first one
    run_grid(expand(base_config(rounds=2)), tmp_path, progress=progress)
    first, *_, last = stream.getvalue().splitlines()
    assert "round 1/2" in first and "elapsed, ETA 0:0" in first
    assert "accuracy" in last


def test_a_run_that_cannot_be_built_leaves_no_folder(tmp_path):
    run = expand(base_config(rounds=2, model={"name": "seed000_cn"}))[0]
    with pytest.raises(ModelError):
        run_grid([run], tmp_path)
    assert list(tmp_path.iterdir()) == []


def _learning_rate_grid(tmp_path, rates: list[float]) -> Path:
    """A grid file of 2-round runs, one per learning rate, labelled ``lr=<rate>``."""
    config = base_config(rounds=2, label="lr={training.learning_rate}")
    config["training"]["learning_rate"] = rates
    path = tmp_path / "grid.toml"
    path.write_text(_toml(config), encoding="utf-8")
    return path


def test_simulate_command_runs_the_matching_part_of_a_grid(tmp_path):
    path = _learning_rate_grid(tmp_path, [0.1, 0.5])
    out = tmp_path / "out"
    assert cli_main(["simulate", str(path), "--out", str(out), "--match", "lr=0.5"]) == 0
    (summary,) = [json.loads(p.read_text()) for p in out.glob("*/summary.json")]
    assert summary["label"] == "lr=0.5"
    assert cli_main(["simulate", str(path), "--out", str(out), "--match", "lr=9"]) == 2


def test_simulate_label_selects_exactly_one_run_where_match_selects_its_variants(tmp_path, capsys):
    """``--match "lr=0.5"`` would also select "lr=0.55"; ``--label`` selects the one run,
    and a label no run has is refused naming the closest ones."""
    path = _learning_rate_grid(tmp_path, [0.5, 0.55])
    out = tmp_path / "out"
    assert cli_main(["simulate", str(path), "--out", str(out), "--label", "lr=0.5"]) == 0
    (summary,) = [json.loads(p.read_text()) for p in out.glob("*/summary.json")]
    assert summary["label"] == "lr=0.5"
    capsys.readouterr()
    assert cli_main(["simulate", str(path), "--out", str(out), "--label", "lr=0.6"]) == 2
    err = capsys.readouterr().err
    assert "--label 'lr=0.6' is no run's label" in err and "closest: 'lr=0.5'" in err


def test_simulate_prints_its_final_json_lines_readably(tmp_path, capsys):
    config = base_config(rounds=2, label="ε-free run, lr={training.learning_rate}")
    path = tmp_path / "run.toml"
    path.write_text(_toml(config), encoding="utf-8")
    assert cli_main(["simulate", str(path), "--out", str(tmp_path / "out")]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert "ε-free run" in line and "\\u03b5" not in line
    assert json.loads(line)["label"] == "ε-free run, lr=0.5"


def _toml(config: dict) -> str:
    """A minimal TOML writer for the nested dicts of :func:`base_config`."""

    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return repr(v)

    top = [f"{k} = {value(v)}" for k, v in config.items() if not isinstance(v, dict)]
    tables = [
        f"[{k}]\n" + "\n".join(f"{kk} = {value(vv)}" for kk, vv in v.items())
        for k, v in config.items()
        if isinstance(v, dict)
    ]
    return "\n".join(top) + "\n\n" + "\n\n".join(tables) + "\n"


def test_the_same_run_trains_over_grpc(tmp_path):
    config = base_config(
        rounds=6,
        eval_every=2,
        clients={"honest": 5, "byzantine": 1},
        attack={"name": "label_flipping"},
        secure_aggregation={"cluster_size": 3},
        aggregator={"name": "trimmed_mean", "options": {"f": 0}},
        privacy={"enabled": True, "noise_multiplier": 0.3, "clipping": "flat"},
    )
    (run,) = expand(config)
    strategy = SimulationStrategy(run, tmp_path / "grpc")
    deployment = deployment_for(run, strategy.simulation)

    async def main():
        server, address = await serving(serve, deployment, strategy=strategy, log=lambda _: None)
        clients = [
            ClientRuntime(cid, address, trainer=SimulationTrainer(run, cid)).run()
            for cid in range(run.clients.total)
        ]
        await asyncio.gather(*clients)
        return await server

    result = asyncio.run(main())
    assert len(result.reports) == 6
    lines = [json.loads(x) for x in (tmp_path / "grpc" / "rounds.jsonl").read_text().splitlines()]
    assert [x["round"] for x in lines] == [2, 4, 6]
    assert lines[-1]["accuracy"] > max(0.3, lines[0]["accuracy"])
    assert not math.isnan(lines[-1]["epsilon"])
    assert (tmp_path / "grpc" / "summary.json").exists()


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"secure_aggregation": {"cluster_size": 1}}, "cluster_size >= 2"),
        (
            {"clients": {"honest": 8, "per_round": 4}, "secure_aggregation": {"cluster_size": 3}},
            "per_round = 0",
        ),
        (
            {
                "secure_aggregation": {"cluster_size": 3, "bits": 64},
                "privacy": {
                    "enabled": True,
                    "level": "client",
                    "noise_split": "cluster",
                    "noise_multiplier": 1.0,
                    "distributed": "skellam",
                },
            },
            "set secure_aggregation.bits = 32",
        ),
    ],
)
def test_a_deployment_refuses_runs_it_cannot_carry(patch, message):
    (run,) = expand(base_config(**patch))
    with pytest.raises(SimulationConfigError, match=re.escape(message)):
        deployment_for(run, Simulation(run))


def test_a_client_process_refuses_an_id_outside_the_run():
    (run,) = expand(base_config())
    with pytest.raises(SimulationConfigError, match=re.escape("not in 0..7")):
        SimulationTrainer(run, 8)


@pytest.mark.slow
def test_quickstart_reaches_95_percent(tmp_path):
    (run,) = load_runs("experiments/quickstart.toml")
    sim = Simulation(run)
    last = sim.run_rounds()
    assert last.accuracy >= 0.95
    assert last.epsilon == pytest.approx(2.0, rel=0.01)


def test_evaluation_in_pieces_equals_one_forward_pass_per_batch():
    """FlatModel.evaluate runs a CPU batch's forward pass in pieces (CPU_FORWARD_BATCH): the
    accuracy is the one of a single pass over each batch and the loss agrees to float
    rounding (every example's forward pass is its own; GroupNorm normalises per example)."""
    torch.manual_seed(0)
    model = training_module.FlatModel(build_model("dp_filter_cnn"))
    flat = torch.randn(model.dim) * 0.05
    inputs, targets = torch.randn(1300, 1, 28, 28), torch.randint(0, 10, (1300,))
    with torch.no_grad():
        out = model(flat, inputs)
    expected_acc = float((out.argmax(1) == targets).float().mean())
    expected_loss = float(torch.nn.functional.cross_entropy(out, targets))
    acc, loss = model.evaluate(flat, inputs, targets, batch_size=1000)
    assert training_module.CPU_FORWARD_BATCH < 1000  # the batch really is cut into pieces
    assert acc == pytest.approx(expected_acc, abs=0.5 / len(targets))
    assert loss == pytest.approx(expected_loss, rel=1e-5)
