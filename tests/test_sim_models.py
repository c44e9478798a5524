"""sharefl.simulator.models: parameter counts from the notes, seeding, per-example gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from sharefl.machine import torch_threads
from sharefl.simulator.models import (
    MODELS,
    ModelError,
    build_model,
    num_parameters,
    register_model,
)

NAMES = {
    "dp_filter_cnn",
    "dp_filter_mlp",
    "dp_filter_resnet",
    "dp_rsa_mlp",
    "dp_rsa_cnn",
    "fed_cdp_cnn",
    "decentralized_softmax",
    "mcmahan_cnn",
    "mlp",
}

MNIST = (1, 28, 28)


@pytest.fixture(autouse=True)
def _one_thread():
    """These tensors are tiny: one intra-op thread avoids OpenMP synchronisation, which on a
    busy 2-core machine made a vmap step 100× slower."""
    with torch_threads(1):
        yield


CIFAR = (3, 32, 32)


@pytest.mark.parametrize(
    ("name", "shape", "classes", "count"),
    [
        ("dp_filter_cnn", MNIST, 10, 21_802),  # seed000 note, Table 7
        ("dp_filter_mlp", MNIST, 10, 25_450),  # Table 8
        ("dp_filter_resnet", (3, 64, 64), 8, 33_736),  # Colorectal network
        ("dp_rsa_mlp", MNIST, 10, 42_310),  # seed002 note, code
        ("dp_rsa_cnn", CIFAR, 10, 576_778),  # seed002 note, code
        ("fed_cdp_cnn", MNIST, 10, 34_720),
        ("fed_cdp_cnn", CIFAR, 62, 162_144),  # LFW
        ("decentralized_softmax", MNIST, 10, 7_850),  # seed004 note, D = 7850
        ("mcmahan_cnn", MNIST, 10, 1_663_370),  # McMahan et al. 2017
        ("mlp", MNIST, 10, 199_210),  # McMahan et al.'s 2NN
    ],
)
def test_parameter_counts(name, shape, classes, count):
    model = build_model(name, num_classes=classes, input_shape=shape)
    assert num_parameters(model) == count
    assert model(torch.rand(1, *shape)).shape == (1, classes)


def test_registry_and_options():
    assert set(MODELS) >= NAMES
    model = build_model("mlp", hidden=(16, 8), activation="tanh")
    assert num_parameters(model) == 784 * 16 + 16 + 16 * 8 + 8 + 8 * 10 + 10
    assert num_parameters(build_model("mlp", hidden=())) == 7_850
    assert build_model("dp_filter_cnn", input_shape=CIFAR)(torch.rand(1, *CIFAR)).shape == (1, 10)
    assert build_model("dp_rsa_cnn", input_shape=MNIST)(torch.rand(1, *MNIST)).shape == (1, 10)


def test_register_model():
    @register_model("_test_linear")
    def linear(*, num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))

    try:
        assert num_parameters(build_model("_test_linear", input_shape=(4,), num_classes=3)) == 15
        with pytest.raises(ModelError, match="already registered"):
            register_model("_test_linear")(lambda **kw: nn.Identity())
    finally:
        MODELS.pop("_test_linear")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "resnet50"}, "unknown model"),
        ({"name": "dp_filter_cnn", "hidden": (3,)}, "option"),
        ({"name": "mlp", "activation": "gelu"}, "activation"),
        ({"name": "dp_filter_cnn", "input_shape": (1, 12, 12)}, "too small"),
        ({"name": "fed_cdp_cnn", "input_shape": (784,)}, r"\(C, H, W\)"),
        ({"name": "mcmahan_cnn", "input_shape": (1, 3, 28)}, "too small"),
        ({"name": "dp_rsa_cnn", "input_shape": (3, 16, 16)}, "too small"),
        ({"name": "dp_filter_resnet", "input_shape": (3, 7, 64)}, "too small"),
        ({"name": "mlp", "num_classes": 0}, "num_classes"),
        ({"name": "mlp", "input_shape": (0, 3)}, "input_shape"),
    ],
)
def test_errors(kwargs, match):
    name = kwargs.pop("name")
    with pytest.raises(ModelError, match=match):
        build_model(name, **kwargs)


@pytest.mark.parametrize(
    ("name", "side"),
    [
        ("dp_filter_cnn", 13),
        ("dp_filter_resnet", 8),
        ("dp_rsa_cnn", 19),
        ("fed_cdp_cnn", 10),
        ("mcmahan_cnn", 4),
    ],
)
def test_smallest_input(name, side):
    model = build_model(name, input_shape=(3, side, side))
    assert model(torch.rand(1, 3, side, side)).shape == (1, 10)
    with pytest.raises(ModelError, match=f">= {side}"):
        build_model(name, input_shape=(3, side, side - 1))


def test_seeded_build_is_deterministic_and_leaves_global_rng():
    state = torch.random.get_rng_state()
    for name in ("dp_filter_cnn", "fed_cdp_cnn", "mlp"):
        a = build_model(name, seed=7).state_dict()
        b = build_model(name, seed=7).state_dict()
        c = build_model(name, seed=8).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert any(not torch.equal(a[k], c[k]) for k in a)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_seed000_initialisation():
    model = build_model("dp_filter_cnn", seed=1234)
    conv, linear = model[3], model[11]  # Conv(16→16, 5×5), Linear(256, 32)
    assert isinstance(conv, nn.Conv2d) and isinstance(linear, nn.Linear)
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / (25 * 16)), rel=0.05)
    assert linear.weight.std().item() == pytest.approx(math.sqrt(2 / (256 + 32)), rel=0.1)
    assert abs(conv.weight.mean().item()) < 0.005


SHAPES = {
    "dp_filter_resnet": (3, 10, 10),
    "dp_filter_cnn": (1, 16, 16),
    "dp_rsa_cnn": (3, 20, 20),
    "mcmahan_cnn": (1, 12, 12),
}


@pytest.mark.parametrize("name", sorted(NAMES))
def test_vmap_per_example_gradients(name):
    """``vmap(grad(loss))`` runs for every model and matches a per-example loop (models
    with dropout: in eval mode; in train mode with ``randomness="different"``)."""
    shape = SHAPES.get(name, MNIST)
    model = build_model(name, input_shape=shape, seed=0)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.rand(2, *shape, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([3, 9])

    def loss(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi[None],)), yi[None])

    has_dropout = any(isinstance(m, nn.Dropout) for m in model.modules())
    if has_dropout:
        train = vmap(grad(loss), in_dims=(None, 0, 0), randomness="different")(params, x, y)
        assert all(g.shape == (2, *params[k].shape) for k, g in train.items())
        model.eval()
    grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    for i in range(2):
        expected = grad(loss)(params, x[i], y[i])
        for k in params:
            torch.testing.assert_close(grads[k][i], expected[k], atol=1e-5, rtol=1e-4)
