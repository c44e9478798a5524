"""Distributed discrete noise in the simulator's SHARE loop: the cells that bound each
client's privacy (against a brute-force oracle), drop-outs in the ring, and whole runs
with the discrete Gaussian and Skellam through the real protocol, accounted at the
calibrated target."""

from __future__ import annotations

import asyncio
import itertools
import json

import numpy as np
import pytest
from conftest import serving
from hypothesis import given
from hypothesis import strategies as st
from test_share import config, simulation

from sharefl.deploy.client import ClientRuntime
from sharefl.deploy.distributed import deployment_encoder
from sharefl.deploy.server import serve
from sharefl.privacy.distributed import DistributedDPConfig, DistributedEncoder
from sharefl.privacy.distributed_accounting import released_cells
from sharefl.privacy.secure_random import SecureRandom
from sharefl.protocol import secure_sum
from sharefl.simulation_bridge import SimulationStrategy, SimulationTrainer, deployment_for
from sharefl.simulator.config import SimulationConfigError, expand

DP = {
    "enabled": True,
    "level": "client",
    "noise_split": "cluster",
    "epsilon": 2.0,
    "clip": 0.05,
    "delta": 1e-5,
}


@given(
    clients=st.integers(1, 12),
    sums=st.lists(st.sets(st.integers(0, 14), min_size=1, max_size=6), max_size=8),
    byzantine=st.sets(st.integers(0, 14), max_size=3),
)
def test_released_cells_are_the_coarsest_partition_every_released_sum_is_made_of(
    clients, sums, byzantine
):
    """Oracle: two honest clients share a cell iff exactly the same released sums hold
    them; every sum's honest members are a union of whole cells."""
    honest = [c for c in range(clients) if c not in byzantine]
    released = [sorted(s) for s in sums]
    cells = released_cells(released, honest)
    flat = [c for cell in cells for c in cell]
    assert len(flat) == len(set(flat))
    covered = {c for s in released for c in s if c in honest}
    assert set(flat) == covered
    cell_of = {c: i for i, cell in enumerate(cells) for c in cell}
    for a, b in itertools.combinations(sorted(covered), 2):
        same = all((a in s) == (b in s) for s in released)
        assert (cell_of[a] == cell_of[b]) == same
    for s in released:
        members = {c for c in s if c in honest}
        assert members == {c for i in {cell_of[c] for c in members} for c in cells[i]}


@pytest.mark.parametrize("mechanism", ["discrete_gaussian", "skellam"])
def test_a_run_with_discrete_noise_through_the_protocol_reports_the_mechanism_at_the_target(
    mechanism,
):
    """Clusters of 3 through the real protocol: each released sum has 3 honest members,
    the calibration's design point, so every client's accounted ε is the target."""
    sim = simulation(
        attack={"name": "none"},
        clients={"honest": 12, "byzantine": 0},
        aggregator={"name": "trimmed_mean", "options": {"f": 1}},
        secure_aggregation={"cluster_size": 3, "enabled": True},
        privacy=DP | {"distributed": mechanism, "bits": 16},
    )
    last = sim.run_rounds()
    dp = sim.extra_summary()["share"]["client_dp"]
    assert dp["mechanism"] == mechanism and dp["rounds"] == 4 and dp["bits"] == 16
    assert dp["epsilon_max"] == pytest.approx(2.0, rel=2e-3)
    assert sim.ledger.plan.noise_multiplier == dp["noise_multiplier"]  # one σ, the discrete one
    assert last.epsilon == pytest.approx(dp["epsilon_max"])
    assert last.accuracy is not None


def test_discrete_noise_needs_the_cluster_split_and_rdp():
    with pytest.raises(SimulationConfigError, match='noise_split = "cluster"'):
        simulation(privacy=DP | {"noise_split": "participants", "distributed": "skellam"})
    with pytest.raises(SimulationConfigError, match=r"privacy\.distributed must be one of"):
        simulation(privacy=DP | {"distributed": "laplace"})
    with pytest.raises(SimulationConfigError, match="bits"):
        simulation(privacy=DP | {"distributed": "skellam", "bits": 1})
    with pytest.raises(SimulationConfigError, match='accountant = "rdp"'):
        simulation(
            attack={"name": "none"},
            clients={"honest": 12, "byzantine": 0},
            aggregator={"name": "trimmed_mean", "options": {"f": 1}},
            privacy=DP | {"distributed": "skellam", "accountant": "pld"},
        )


@pytest.mark.parametrize("mechanism", ["discrete_gaussian", "skellam"])
def test_a_cluster_that_loses_a_member_still_releases_the_full_noise_in_the_ring(mechanism):
    """m = 4, s = 3: the ring vectors of 4 members, one drops before masking; the real
    protocol releases the 3 survivors' sum mod 2^32, which decodes (mod 2^b, un-rotated) to
    noise of std σC per coordinate; with two gone nothing is released. The cell of each
    survivor is the 3 of them, which is what the ledger charges."""
    sigma, clip, d = 1.0, 4.0, 16_384
    config = DistributedDPConfig(mechanism, clip, sigma, min_survivors=3, max_summands=4)
    encoder = DistributedEncoder(config, d)
    public, secret = bytes(range(48)), SecureRandom.from_seed(bytes(range(1, 49)))
    inputs = {c: encoder.encode(np.zeros(d), public, secret) for c in range(4)}
    result = secure_sum(inputs, cluster_size=4, seed=5, dropouts={"mask": [3]})
    (released,) = result.clusters
    assert released.members == (0, 1, 2) and released.ring_sum.dtype == np.uint32
    noise = encoder.decode(released.ring_sum, public)
    assert noise.std() == pytest.approx(sigma * clip, rel=0.05)
    assert released_cells([released.members], [0, 1, 2, 3]) == [[0, 1, 2]]
    two_left = secure_sum(inputs, cluster_size=4, seed=5, dropouts={"mask": [2, 3]})
    assert not two_left.clusters


def test_a_float_encoding_that_would_clip_the_noisy_shares_is_refused():
    """Why: clipping each noisy share before the sum removes noise the accounting counts
    (the oracle: the released sum's noise std falls far below σC); so the float cluster
    split needs secure_aggregation.clip >= C + 7 share stds."""
    sigma, clip, d = 2.0, 1.0, 20_000
    rng = np.random.default_rng(0)
    shares = {c: rng.normal(0, sigma * clip / np.sqrt(3), d) for c in range(3)}
    released = secure_sum(shares, cluster_size=3, clip=1.0, seed=1, protocol=False)
    assert released.clusters[0].sum.std() < 0.7 * sigma * clip  # noise lost to clipping
    kept = secure_sum(shares, cluster_size=3, clip=20.0, seed=1, protocol=False)
    assert kept.clusters[0].sum.std() == pytest.approx(sigma * clip, rel=0.03)
    gaussian = DP | {"epsilon": 1.0, "clip": 1.0}
    common = {
        "attack": {"name": "none"},
        "clients": {"honest": 12, "byzantine": 0},
        "aggregator": {"name": "trimmed_mean", "options": {"f": 1}},
    }
    with pytest.raises(SimulationConfigError, match=r"secure_aggregation\.clip >= "):
        simulation(**common, secure_aggregation={"cluster_size": 3, "clip": 10.0}, privacy=gaussian)
    simulation(**common, secure_aggregation={"cluster_size": 3, "clip": 1000.0}, privacy=gaussian)


def test_with_reclusterings_sigma_is_calibrated_for_the_finest_cell_and_the_target_holds():
    """R = 2 overlapping clusterings cut the cells down to single clients: calibrated for a
    cell of one, every client's accounted ε stays within the target."""
    sim = simulation(
        attack={"name": "none"},
        clients={"honest": 12, "byzantine": 0},
        aggregator={"name": "trimmed_mean", "options": {"f": 1}},
        secure_aggregation={"cluster_size": 3, "reclusterings": 2},
        privacy=DP | {"distributed": "skellam", "bits": 20},
        rounds=2,
    )
    sim.run_rounds()
    dp = sim.extra_summary()["share"]["client_dp"]
    assert dp["rounds"] == 2 and dp["epsilon_max"] <= 2.0
    one_cell = simulation(
        attack={"name": "none"},
        clients={"honest": 12, "byzantine": 0},
        aggregator={"name": "trimmed_mean", "options": {"f": 1}},
        privacy=DP | {"distributed": "skellam", "bits": 20},
        rounds=2,
    )
    assert sim.ledger.plan.noise_multiplier > 1.5 * one_cell.ledger.plan.noise_multiplier


# -- over gRPC: client processes encode their own ring inputs --------------------------------


def grpc_run(mechanism: str):
    (run,) = expand(
        config(
            attack={"name": "none"},
            clients={"honest": 9, "byzantine": 0},
            aggregator={"name": "mean", "options": {}},
            secure_aggregation={"cluster_size": 3, "enabled": True},
            privacy=DP | {"distributed": mechanism, "bits": 16},
        )
    )
    return run


@pytest.mark.parametrize("mechanism", ["discrete_gaussian", "skellam"])
def test_client_processes_add_discrete_noise_in_the_ring_and_the_server_accounts_it(
    mechanism, tmp_path
):
    """The run over gRPC: the deployment carries the run's [privacy] (σ as calibrated, so
    the server's pipeline is the clients'), the server proposes no float encoding, every
    client encodes its own update with its own noise, the server decodes each released
    sum and the run's strategy accounts it: the ε in rounds.jsonl is the calibrated target, as
    in the simulator (what each decoded sum carries: the next test)."""
    run = grpc_run(mechanism)
    strategy = SimulationStrategy(run, tmp_path / "grpc")
    deployment = deployment_for(run, strategy.simulation)
    assert deployment_encoder(deployment) == strategy.simulation.ring_encoder  # one pipeline

    async def main():
        server, address = await serving(serve, deployment, strategy=strategy, log=lambda _: None)
        clients = [
            ClientRuntime(cid, address, trainer=SimulationTrainer(run, cid)).run()
            for cid in range(run.clients.total)
        ]
        reports = await asyncio.gather(*clients)
        return await server, reports

    result, reports = asyncio.run(main())
    assert len(result.reports) == run.rounds
    assert all(not r.refusals for r in reports)
    assert all(len(r.clusters) == 3 for r in result.reports)
    lines = [json.loads(x) for x in (tmp_path / "grpc" / "rounds.jsonl").read_text().splitlines()]
    assert lines[-1]["epsilon"] == pytest.approx(2.0, rel=2e-3)


def test_a_cluster_sum_of_client_ring_inputs_carries_the_noise_the_accounting_assumes():
    """Three clients' ring inputs, summed as the protocol sums them (mod 2^32) and decoded
    as the server decodes them: the error against the sum of the clipped updates has the
    variance of three noise shares plus rounding (exact formula), and two encodings of
    one update differ (fresh OS-keyed noise each time)."""
    run = grpc_run("skellam")
    trainers = [SimulationTrainer(run, cid) for cid in range(3)]
    encoder = trainers[0].client.ring_encoder
    rng = np.random.default_rng(0)
    updates = [rng.normal(size=encoder.dim).astype(np.float32) * 1e-4 for _ in trainers]
    seed = bytes(48)
    words = [t.ring_inputs.encode(u, seed) for t, u in zip(trainers, updates, strict=True)]
    again = trainers[0].ring_inputs.encode(updates[0], seed)
    assert not np.array_equal(again, words[0])
    total = np.zeros_like(words[0])
    for w in words:
        total += w
    error = encoder.decode(total, seed) - np.sum(updates, axis=0)
    member_var = 2 * encoder.skellam_mu * encoder.gamma**2  # Sk(μ, μ): 2μ ring units²
    expected = 3 * member_var * encoder.padded / encoder.dim
    rounding = 3 * encoder.gamma**2 / 4 * encoder.padded / encoder.dim  # at most
    measured = float(np.mean(error**2)) * encoder.padded / encoder.dim
    assert expected * 0.9 < measured < (expected + rounding) * 1.1


def test_a_client_with_ring_inputs_refuses_a_float_encoding_or_another_ring():
    """Its noise is its own: an assignment proposing a float encoding (the server would
    get the update without the client's noise) or a 64-bit ring (the carries of its
    residues) is refused; a float client refuses an assignment without an encoding."""
    from sharefl.crypto.encoding import RingEncoding
    from sharefl.crypto.kdf import KeyContext
    from sharefl.protocol.errors import MalformedRequest
    from sharefl.protocol.messages import ClusterAssignment

    run = grpc_run("discrete_gaussian")
    trainer = SimulationTrainer(run, 0)
    client = ClientRuntime(0, "127.0.0.1:1", trainer=trainer)
    length = trainer.ring_inputs.length
    words = np.zeros(length, dtype=np.uint32)

    def assignment(bits: int) -> ClusterAssignment:
        return ClusterAssignment(KeyContext(0), (0, 1, 2), 2, length, bits)

    assert client._input(words, assignment(32), None) is words
    with pytest.raises(MalformedRequest, match="proposed a float encoding"):
        client._input(words, assignment(32), RingEncoding(32, 16, 1.0, 3))
    with pytest.raises(MalformedRequest, match="64-bit"):
        client._input(words, assignment(64), None)
    plain = ClientRuntime(0, "127.0.0.1:1")
    with pytest.raises(MalformedRequest, match="no float encoding"):
        plain._input(np.zeros(length, np.float32), assignment(32), None)


@pytest.mark.parametrize("mechanism", ["gaussian", "skellam"])
def test_byzantine_members_that_add_no_noise_need_privacy_colluders(mechanism):
    """A Byzantine member adds no share, so an honest client in a cluster with one gets
    less noise than σC and its accounted ε exceeds the target; with privacy.colluders = t
    every share is sized for s − t adders and the target holds whatever t members add."""
    setting = {
        "attack": {"name": "label_flipping"},
        "clients": {"honest": 12, "byzantine": 3},
        "aggregator": {"name": "trimmed_mean", "options": {"f": 1}},
        "secure_aggregation": {"cluster_size": 3, "enabled": True, "clip": 200.0},
    }
    eps = {}
    for t in (0, 2):
        sim = simulation(**setting, privacy=DP | {"distributed": mechanism, "colluders": t})
        sim.run_rounds()
        dp = sim.extra_summary()["share"]["client_dp"]
        assert dp["colluders"] == t
        eps[t] = dp["epsilon_max"]
    assert eps[0] > 2.0 * 1.01  # 4 rounds: some honest client shared a cluster with one
    assert eps[2] <= 2.0 * 1.002


def test_colluders_must_leave_one_honest_share():
    with pytest.raises(SimulationConfigError, match="colluders = 3 must be below the 3"):
        simulation(
            attack={"name": "none"},
            clients={"honest": 12, "byzantine": 0},
            aggregator={"name": "mean", "options": {}},
            secure_aggregation={"cluster_size": 3, "enabled": True},
            privacy=DP | {"distributed": "skellam", "colluders": 3},
        )
