"""SHARE's Figure 9 baseline: ``secure_aggregation.clustering = "fixed"`` is one partition of
the clients into clusters of m, drawn once and used in every round (the paper: "clusters are
drawn once before training"), against ``"random"`` (fresh clusterings every round, the
paper's Algorithm 1) and ``"fixed_plan"`` (round 1's R reclusterings reused, what "fixed"
meant before, whose recorded run ids are kept)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from sim_configs import with_overrides

from sharefl.protocol import Clustering
from sharefl.simulator.config import SimulationConfigError, expand
from sharefl.simulator.federated.loop import Simulation


def config(**overrides: Any) -> dict[str, Any]:
    """15 honest + 3 Byzantine clients on synthetic 8×8 images, clusters of 3, trimmed mean."""
    base = {
        "name": "share-fixed",
        "seed": 1,
        "rounds": 4,
        "eval_every": 4,
        "data": {
            "dataset": "synthetic",
            "options": {"num_examples": 900, "shape": [1, 8, 8], "noise": 0.4},
            "partition": "iid",
        },
        "model": {"name": "mlp", "options": {"hidden": [16]}},
        "clients": {"honest": 15, "byzantine": 3},
        "training": {"batch_size": 16, "local_steps": 1, "learning_rate": 0.1, "upload": "delta"},
        "attack": {"name": "sign_flipping", "options": {"scale": 10}},
        "secure_aggregation": {"cluster_size": 3, "enabled": False, "clip": 10.0},
        "aggregator": {"name": "trimmed_mean", "options": {"f": 1}},
    }
    return with_overrides(base, overrides)


def plans(clustering: str, reclusterings: int, rounds: int = 4) -> list[tuple[Clustering, ...]]:
    """The clusterings the protocol summed over, round by round."""
    (run,) = expand(
        config(secure_aggregation={"clustering": clustering, "reclusterings": reclusterings})
    )
    sim = Simulation(run)
    seen = []
    for _ in range(rounds):
        sim.step()
        seen.append(tuple(sim.share.last_clusterings))
    return seen


def test_fixed_is_one_partition_into_clusters_of_m_used_in_every_round():
    seen = plans("fixed", 1)
    assert len(seen[0]) == 1, "a fixed schedule sums over one clustering per round"
    (clustering,) = seen[0]
    assert all(plan == seen[0] for plan in seen), "the same partition in every round"
    assert sorted(clustering.members) == list(range(18))
    assert Counter(len(c) for c in clustering.clusters) == {3: 6}


def test_reclustering_draws_a_new_partition_every_round_unlike_fixed():
    fixed = plans("fixed", 1)
    fresh = plans("random", 1)
    assert len({plan for plan in fresh}) == len(fresh), "a new clustering every round"
    assert any(f != r for f, r in zip(fixed, fresh, strict=True))
    assert all(len(plan) == 1 for plan in fresh)


def test_fixed_plan_reuses_round_ones_r_clusterings_so_it_still_reclusters():
    seen = plans("fixed_plan", 2, rounds=3)
    assert seen[0] == seen[1] == seen[2]
    assert len(seen[0]) == 2 and seen[0][0] != seen[0][1]


def test_fixed_refuses_more_than_one_reclustering_and_names_the_alternatives():
    with pytest.raises(SimulationConfigError, match=r"reclusterings = 1.*fixed_plan"):
        expand(config(secure_aggregation={"clustering": "fixed", "reclusterings": 10}))
    with pytest.raises(SimulationConfigError, match="fixed_plan"):
        expand(config(secure_aggregation={"clustering": "fixd"}))


def test_run_ids_recorded_before_fixed_plan_existed_are_kept():
    """Ids computed by the code before ``"fixed_plan"`` (commit a7ff2b6) for this file's
    config: "fixed" with R = 2 then ran what "fixed_plan" runs now, and R = 1 was and is one
    clustering; the new "fixed" and "fixed_plan" must keep those ids, and "random" its own."""
    recorded = {
        ("fixed_plan", 2): "share-fixed-share-fixed-s1-13a4106fee",
        ("fixed", 1): "share-fixed-share-fixed-s1-3d5658aa41",
        ("random", 2): "share-fixed-share-fixed-s1-46ab5a2457",
    }
    for (clustering, r), run_id in recorded.items():
        (run,) = expand(config(secure_aggregation={"clustering": clustering, "reclusterings": r}))
        assert run.run_id == run_id, (clustering, r)


def test_figure_9_compares_one_fixed_clustering_with_reclustering():
    from pathlib import Path

    from sharefl.simulator.config import load_runs

    path = Path(__file__).resolve().parents[1] / "experiments" / "share_mnist_figure9.toml"
    runs = [r for r in load_runs(path) if r.seed == 1]
    fixed = [r for r in runs if r.secure_aggregation.clustering == "fixed"]
    assert {r.aggregator.name for r in fixed} == {"zeno", "trimmed_mean"}
    assert all(r.secure_aggregation.reclusterings == 1 for r in fixed)
    assert all("fixed clusters" in r.label for r in fixed)
    random = [r for r in runs if r.secure_aggregation.clustering == "random"]
    assert {r.secure_aggregation.planner for r in random} == {"safe", "random"}
    assert all(r.secure_aggregation.reclusterings == 10 for r in random)
