"""The one model step ``w ← w − η·v`` (:mod:`sharefl.rounds.model_step`), shared by the
simulator's server and every deployment strategy.

Oracles: the simulator's step as it was written in torch before it moved here
(``velocity.mul_(μ).add_(g)``, then ``w − η · v.to(w)``), compared bit for bit, and the
deployment's ``(model − η·g).astype(float32)`` formula.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_sim_outputs import FEDERATED

import sharefl.deploy.strategy as deploy_strategy
from sharefl.rounds.model_step import ModelStepError, descend, heavy_ball, server_step
from sharefl.simulator.checkpoint import LoopState
from sharefl.simulator.config import expand
from sharefl.simulator.federated.server import Server
from sharefl.simulator.loops import build_loop

DIM = 257
RATES = (1.0, 0.3, 0.1, 2.0 / 3.0)


def torch_steps(
    w: torch.Tensor, aggregates: list[torch.Tensor], lr: float, momentum: float
) -> torch.Tensor:
    """The simulator's step before it moved to numpy, round after round."""
    velocity = torch.zeros_like(w)
    for aggregate in aggregates:
        if momentum:
            velocity.mul_(momentum).add_(aggregate)
            aggregate = velocity
        w = w - lr * aggregate.to(w)
    return w


def aggregates(rounds: int, dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(DIM, generator=g, dtype=dtype) * 10 ** (r - 2) for r in range(rounds)]


@pytest.mark.parametrize("lr", RATES)
@pytest.mark.parametrize("momentum", [0.0, 0.9, 0.5])
@pytest.mark.parametrize("aggregate_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("model_dtype", [torch.float32, torch.float64])
def test_server_step_is_the_simulators_torch_step_bit_for_bit(
    lr, momentum, aggregate_dtype, model_dtype
):
    w0 = torch.randn(DIM, generator=torch.Generator().manual_seed(1), dtype=model_dtype)
    steps = aggregates(5, aggregate_dtype, seed=2)
    expected = torch_steps(w0, steps, lr, momentum)
    w = w0.numpy().copy()
    velocity = np.zeros_like(w)
    for aggregate in steps:
        w = server_step(w, lr, aggregate.numpy(), momentum=momentum, velocity=velocity)
    assert w.dtype == expected.numpy().dtype
    np.testing.assert_array_equal(w, expected.numpy())  # bit for bit, not approximately


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_the_simulators_server_steps_through_it(momentum):
    """:meth:`Server.step` (with its velocity) against the torch oracle, round after round;
    the velocity changes in place, as a checkpoint needs."""
    w0 = torch.randn(DIM, generator=torch.Generator().manual_seed(3))
    server = Server.__new__(Server)  # only what step() reads
    server.setup = SimpleNamespace(run=SimpleNamespace(server=SimpleNamespace(momentum=momentum)))
    server.w, server.velocity, server.learning_rate = w0.clone(), torch.zeros(DIM), 0.3
    velocity, version = server.velocity, server.velocity._version
    steps = aggregates(4, torch.float32, seed=4)
    for aggregate in steps:
        server.step(aggregate)
    assert torch.equal(server.w, torch_steps(w0, steps, 0.3, momentum))
    assert server.velocity is velocity
    assert (server.velocity._version > version) == bool(momentum)


def test_a_run_with_server_momentum_resumes_bit_for_bit():
    """The velocity changes in place where a checkpoint sees it: a run restored after
    round 2 is the uninterrupted run (a velocity the checkpoint missed would restart at
    zero and give another model)."""
    (run,) = expand(
        copy.deepcopy(FEDERATED) | {"rounds": 4, "server": {"learning_rate": 0.3, "momentum": 0.9}}
    )
    reference = build_loop(run)
    for _ in range(run.rounds):
        reference.step()
    stopped = build_loop(run)
    state = LoopState(stopped)
    for _ in range(2):
        stopped.step()
    assert stopped.server.velocity.abs().sum() > 0
    resumed = build_loop(run)
    LoopState(resumed).restore(state.capture())
    for _ in range(run.rounds - 2):
        resumed.step()
    assert torch.equal(resumed.server.velocity, reference.server.velocity)
    assert torch.equal(resumed.model_vector, reference.model_vector)


def test_the_deployment_descends_with_the_same_function():
    assert deploy_strategy.descend is descend


def test_descend_rounds_once_to_float32():
    """A float32 model and a float64 aggregate (a deployment's decoded sums): computed in
    float64, rounded once (the formula the deployment always used)."""
    rng = np.random.default_rng(5)
    model = rng.standard_normal(DIM).astype(np.float32)
    aggregate = rng.standard_normal(DIM) / 3
    out = descend(model, 0.1, aggregate)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(
        out, (model.astype(np.float64) - 0.1 * aggregate).astype(np.float32)
    )
    assert out is not model


def test_heavy_ball_updates_the_velocity_in_place():
    velocity = np.array([1.0, -2.0], np.float32)
    out = heavy_ball(velocity, 0.5, np.array([1.0, 1.0], np.float32))
    assert out is velocity
    np.testing.assert_array_equal(velocity, [1.5, 0.0])


@pytest.mark.parametrize("momentum", [-0.1, 1.0, float("nan")])
def test_a_momentum_outside_zero_one_is_refused(momentum):
    with pytest.raises(ModelStepError, match=r"momentum must be in \[0, 1\)"):
        server_step(np.zeros(2), 1.0, np.ones(2), momentum=momentum, velocity=np.zeros(2))


def test_momentum_without_a_velocity_is_refused():
    with pytest.raises(ModelStepError, match="pass velocity"):
        server_step(np.zeros(2), 1.0, np.ones(2), momentum=0.9)
