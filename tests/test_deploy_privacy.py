"""Distributed DP in a deployment file (``[privacy]``): each client encodes its own update
with its noise share into ring words, the server decodes the released cluster sums and
accounts them. Checked against the exact clipped mean (tiny σ), the noise variance a
released sum must carry (large σ), the mechanism's own ε, and as users run it: ``sharefl
serve`` and ``sharefl client --config`` processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import HANG_S, PYTHON, serving, start_server

from sharefl.deploy.client import ClientRuntime, demo_trainer
from sharefl.deploy.config import load_config
from sharefl.deploy.distributed import deployment_encoder
from sharefl.deploy.server import serve
from sharefl.launch import _client_trainer
from sharefl.privacy.distributed import epsilon_after
from sharefl.protocol.errors import ConfigurationError

DIM = 300
CLIENTS = 6
TRAINER = "sharefl.deploy.client:demo_trainer"


def deployment(tmp_path: Path, clients: int = CLIENTS, dim: int = DIM, **privacy) -> Path:
    tables = {
        "server": {"clients": clients, "rounds": 2, "connect_timeout_s": 60},
        "model": {"dim": dim, "aggregator": "mean", "learning_rate": 1.0},
        "secure_aggregation": {"cluster_size": 3},
        "privacy": {"distributed": "skellam", "clip": 1.0, "bits": 16, **privacy},
    }
    lines = []
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    path = tmp_path / "deploy.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_in_process(path: Path):
    config = load_config(path)

    async def main():
        server, address = await serving(serve, config, log=lambda _: None)
        clients = [
            ClientRuntime(cid, address, trainer=_client_trainer(str(path), TRAINER, cid)).run()
            for cid in range(CLIENTS)
        ]
        reports = await asyncio.gather(*clients)
        return await server, reports

    return asyncio.run(main())


def clipped_mean(round_index: int, clip: float = 1.0, dim: int = DIM) -> np.ndarray:
    updates = []
    for cid in range(CLIENTS):
        u = demo_trainer(np.zeros(dim, np.float32), round=round_index, client_id=cid)
        u = u.astype(np.float64)
        updates.append(u * min(1.0, clip / np.linalg.norm(u)))
    return np.mean(updates, axis=0)


@pytest.mark.parametrize("mechanism", ["skellam", "discrete_gaussian"])
def test_the_server_gets_the_clipped_mean_through_the_ring_with_tiny_noise(tmp_path, mechanism):
    """σ = 10⁻³: the aggregate of round 1 is the mean of the clipped updates (the rotation
    seed, the scale and the decode agree on both sides), up to the noise and rounding."""
    # 32 bits: the ring unit is then σ_l/2^20 and no coordinate wraps (at 16 bits a sum
    # beyond k = 4 standard deviations does, p ≈ 6e-5 per coordinate: by design, and here
    # an error of 2^b·γ/√D/6 ≈ 0.005 on every coordinate in ~6 % of runs)
    path = deployment(tmp_path, distributed=mechanism, noise_multiplier=1e-3, bits=32)
    result, reports = run_in_process(path)
    assert all(not r.refusals for r in reports)
    first = result.reports[0]
    assert len(first.clusters) == CLIENTS // 3 and first.epsilon is not None
    expected = clipped_mean(0)
    # the run's model after round 1 is -aggregate (learning rate 1, model 0)
    np.testing.assert_allclose(result.reports[0].total, expected, atol=2e-3)


def test_each_released_sum_carries_the_noise_and_the_ledger_charges_it(tmp_path):
    """σ = 2, s = 3: a released sum of 3 carries variance (σC)² per coordinate, so the mean
    over two sums of 6 clients has 2(σC)²/36 (orthogonal rotation: per coordinate after
    the decode too); the server's ε after 2 rounds is the mechanism's own for cells of 3.

    4,096 coordinates × 2 rounds: the measured ratio's spread over 12 runs is 0.014
    (0.07 at 300 coordinates, where ±15 % failed about one run in 25), so ±15 % is 11
    spreads and the check is not a coin toss."""
    sigma, dim = 2.0, 4096
    path = deployment(tmp_path, dim=dim, noise_multiplier=sigma, bits=32)  # no wrap-around
    result, _ = run_in_process(path)
    errors = np.concatenate([r.total - clipped_mean(r.round, dim=dim) for r in result.reports])
    expected = 2 * sigma**2 / CLIENTS**2
    assert 0.85 * expected < float(np.mean(errors**2)) < 1.15 * expected
    encoder = deployment_encoder(load_config(path))
    assert result.reports[-1].epsilon == pytest.approx(epsilon_after(encoder, 2, 1e-5))


def test_a_privacy_table_is_checked_where_it_is_read(tmp_path):
    with pytest.raises(ConfigurationError, match="exactly one of noise_multiplier"):
        load_config(deployment(tmp_path))
    with pytest.raises(ConfigurationError, match=r"secure_aggregation\.bits = 64"):
        load_config(deployment(tmp_path, noise_multiplier=1.0, bits=40))
    with pytest.raises(ConfigurationError, match="float"):
        load_config(deployment(tmp_path, distributed="gaussian", noise_multiplier=1.0))
    plain = tmp_path / "plain.toml"
    plain.write_text("[model]\ndim = 4\n")
    with pytest.raises(ConfigurationError, match="no \\[privacy\\] table"):
        _client_trainer(str(plain), TRAINER, 0)


def test_serve_and_client_processes_run_a_private_deployment_as_documented(tmp_path):
    """``sharefl serve --config F`` and ``sharefl client --config F --trainer T``: every
    process exits 0, and result.json records each round's ε, calibrated to the target."""
    path = deployment(tmp_path, clients=3, epsilon=4.0, delta=1e-5)
    out = tmp_path / "out"
    server, address = start_server(path, "--out", str(out), folder=tmp_path)
    clients = [
        subprocess.Popen(
            [*PYTHON, "client", "--server", address, "--id", str(c), "--config", str(path)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for c in range(3)
    ]
    codes = [c.wait(timeout=HANG_S) for c in clients]
    assert server.wait(timeout=HANG_S) == 0
    assert codes == [0] * 3, [c.stderr.read()[-2000:] for c in clients]
    rounds = json.loads((out / "result.json").read_text())["rounds"]
    assert len(rounds) == 2
    assert rounds[-1]["epsilon"] == pytest.approx(4.0, rel=2e-3)
    assert rounds[0]["epsilon"] < rounds[-1]["epsilon"]


def test_a_resumed_run_replays_the_released_sums_into_its_ledger(tmp_path):
    """--resume: the ε of the rounds before the stop is not forgotten (the ledger replays
    the members of every released sum that result.json's rows record)."""
    from sharefl.deploy.results import Checkpoint
    from sharefl.deploy.run import ServerRun

    config = load_config(deployment(tmp_path, noise_multiplier=2.0))
    row = {"round": 1, "culprits": {}, "clusters": [{"members": [0, 1, 2]}, {"members": [3, 4, 5]}]}
    resume = Checkpoint([row], np.zeros(DIM, np.float32), run=bytes(16))
    run = ServerRun(config, log=lambda _: None, resume=resume)
    encoder = deployment_encoder(config)
    assert run.privacy_ledger.epsilon(1e-5) == pytest.approx(epsilon_after(encoder, 1, 1e-5))


def test_a_client_refuses_more_clusterings_than_its_noise_was_sized_for(tmp_path):
    """σ calibrated for one clustering a round (cells of s − t members): a server whose
    plan has two reclusterings (cells of one member possible) gets refusals from every
    client of that file, and no sum; the policy floor is the noise's s."""
    client_file = deployment(tmp_path, noise_multiplier=2.0)
    trainer = _client_trainer(str(client_file), TRAINER, 0)
    policy = ClientRuntime(0, "127.0.0.1:1", trainer=trainer).policy
    assert policy.max_reclusterings == 1 and policy.sum_floor == 3
    server_dir = tmp_path / "server"
    server_dir.mkdir()
    server_file = deployment(server_dir, noise_multiplier=2.0)
    text = (
        server_file.read_text()
        .replace("[secure_aggregation]\n", "[secure_aggregation]\nreclusterings = 2\n")
        .replace("[server]\n", f"[server]\nstage_timeout_s = {HANG_S}\n")
    )
    server_file.write_text(text)
    config = load_config(server_file)

    async def main():
        server, address = await serving(serve, config, log=lambda _: None)
        clients = [
            ClientRuntime(
                cid, address, trainer=_client_trainer(str(client_file), TRAINER, cid)
            ).run()
            for cid in range(CLIENTS)
        ]
        reports = await asyncio.gather(*clients, return_exceptions=True)
        return await asyncio.gather(server, return_exceptions=True), reports

    (result,), reports = asyncio.run(main())
    refusals = [r for rep in reports if not isinstance(rep, BaseException) for r in rep.refusals]
    assert refusals and all("round plan has 2 entries; at most 1" in r for r in refusals)
    released = [] if isinstance(result, BaseException) else result.reports
    assert all(not r.clusters for r in released)
