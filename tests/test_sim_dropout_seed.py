"""A run of a model with dropout (Fed-αCDP's CNN) follows from its seed alone.

The CNN's dropout used to draw from torch's global generator, which no run seeds, so two
runs of one configuration trained with different masks (issue 41). The oracle: two runs of
one tiny Fed-αCDP-style configuration, each started from a different global generator
state, give the same records and the same final model bit for bit; a run stopped after a
round and resumed from its checkpoint into a fresh build (another global state again) is
the uninterrupted run; and no run moves the global generator. A negative control shows the
dropout is live: the same round with another training generator gives another model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.func import functional_call, grad, vmap

from sharefl.simulator.checkpoint import LoopCheckpoint, LoopState
from sharefl.simulator.config import expand
from sharefl.simulator.loops import build_loop
from sharefl.simulator.models import GeneratorDropout, build_model, dropout_generator

# Fed-αCDP's CNN (dropout 0.5) with l2-max DP-SGD, on 10×10 synthetic images: about a
# second for all rounds.
FED_CDP_TINY: dict[str, Any] = {
    "name": "fed_cdp_dropout",
    "seed": 3,
    "rounds": 4,
    "eval_every": 1,
    "data": {
        "dataset": "synthetic",
        "options": {"num_examples": 240, "shape": [1, 10, 10], "noise": 0.4},
        "partition": "iid",
    },
    "model": {"name": "fed_cdp_cnn", "init_seed": 7},
    "clients": {"honest": 4, "per_round": 3},
    "training": {
        "batch_size": 5,
        "local_steps": 3,
        "learning_rate": 0.05,
        "upload": "delta",
        "sampling": "shuffle",
    },
    "privacy": {"enabled": True, "noise_multiplier": 0.5, "clip": 4.0, "clipping": "l2max"},
    "secure_aggregation": {"cluster_size": 1},
    "aggregator": {"name": "mean"},
}


def _records(loop: Any, rounds: int) -> list[tuple]:
    return [(r.round, r.accuracy, r.loss, r.epsilon) for r in (loop.step() for _ in range(rounds))]


def _model(loop: Any) -> dict[str, np.ndarray]:
    return dict(loop.final_model().state)


def _assert_same_model(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name


def _build(run: Any, global_seed: int) -> Any:
    torch.manual_seed(global_seed)  # a process's global generator: anything but the run's
    return build_loop(run)


def test_two_runs_with_one_seed_give_the_same_records_and_model_bytes():
    (run,) = expand(FED_CDP_TINY)
    first = _build(run, 11)
    global_state = torch.get_rng_state()
    expected = _records(first, run.rounds)
    assert torch.equal(torch.get_rng_state(), global_state), "a run drew from the global generator"
    second = _build(run, 12)
    assert _records(second, run.rounds) == expected
    _assert_same_model(_model(second), _model(first))


def test_a_run_resumed_from_its_checkpoint_is_the_uninterrupted_run(tmp_path):
    (run,) = expand(FED_CDP_TINY)
    reference = _build(run, 21)
    expected = _records(reference, run.rounds)
    stopped = _build(run, 22)
    state = LoopState(stopped)
    assert _records(stopped, 2) == expected[:2]
    LoopCheckpoint(run.run_id, 2, stopped.elapsed(), state.capture()).write(tmp_path)
    saved = LoopCheckpoint.read(tmp_path, run.run_id)
    assert saved is not None
    resumed = _build(run, 23)
    LoopState(resumed).restore(saved.state)
    torch.manual_seed(24)  # what the checkpoint put back is not what the rounds use
    assert _records(resumed, run.rounds - 2) == expected[2:]
    _assert_same_model(_model(resumed), _model(reference))


def test_the_dropout_is_live_another_training_generator_gives_another_round():
    """Negative control: the first round from the same global model, with the training
    generator's state replaced by another seed, trains another model."""
    (run,) = expand(FED_CDP_TINY)
    loops = [build_loop(run) for _ in range(3)]
    loops[2].generator.manual_seed(run.seed + 1)
    models = []
    for loop in loops:
        loop.step()
        models.append(loop.model_vector.clone())
    assert torch.equal(models[0], models[1])
    assert not torch.equal(models[0], models[2])


def test_generator_dropout_draws_its_masks_from_the_generator_given():
    layer = GeneratorDropout(0.5)
    x = torch.ones(4, 64)
    with dropout_generator(layer, torch.Generator().manual_seed(5)):
        a = layer(x)
    with dropout_generator(layer, torch.Generator().manual_seed(5)):
        b = layer(x)
    assert layer.generator is None  # put back after the block
    assert torch.equal(a, b) and set(a.unique().tolist()) == {0.0, 2.0}  # kept ones × 1/(1 − p)
    layer.eval()
    with dropout_generator(layer, torch.Generator().manual_seed(5)):
        assert torch.equal(layer(x), x)  # no dropout in evaluation


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_generator_dropout_at_the_ends(p):
    layer = GeneratorDropout(p)
    x = torch.randn(3, 8)
    with dropout_generator(layer, torch.Generator().manual_seed(0)):
        assert torch.equal(layer(x), x if p == 0 else torch.zeros_like(x))


def test_every_example_gets_its_own_mask_under_nested_vmap():
    """The simulator's per-example gradients (clients × examples): one mask per example."""
    model = build_model("fed_cdp_cnn", input_shape=(1, 10, 10), seed=1)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(model, (p,), (x.unsqueeze(0),)).sum()

    inner = vmap(grad(loss), in_dims=(None, 0), randomness="different")
    outer = vmap(inner, in_dims=(None, 0), randomness="different")
    x = torch.ones(2, 3, 1, 10, 10)  # 2 clients × 3 identical examples
    with dropout_generator(model, torch.Generator().manual_seed(2)):
        g = outer(params, x)["8.weight"].reshape(6, -1)
    assert len({tuple((row != 0).tolist()) for row in g}) == 6
