"""Per-example gradients (torch.func) against a batch-of-one loop; BatchNorm rejected."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from sharefl.privacy import (
    PerExampleGradients,
    UnsupportedModuleError,
    check_per_example_compatible,
    per_example_gradients,
)
from sharefl.privacy.reference_models import seed000_mnist_cnn, seed002_cifar_cnn

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def loop_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Reference: one backward pass per example."""
    rows: dict[str, list[torch.Tensor]] = {n: [] for n, p in model.named_parameters()}
    for j in range(x.shape[0]):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[j : j + 1]), y[j : j + 1]).backward()
        for n, p in model.named_parameters():
            if p.requires_grad:
                rows[n].append(p.grad.detach().clone())
    return {n: torch.stack(r) for n, r in rows.items() if r}


def test_reference_model_sizes():
    assert sum(p.numel() for p in seed000_mnist_cnn().parameters()) == 21_802
    assert sum(p.numel() for p in seed002_cifar_cnn().parameters()) == 576_778


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunk_size", [None, 3])
def test_per_example_equals_batch_of_one_loop(device, chunk_size):
    torch.manual_seed(0)
    model = seed000_mnist_cnn().to(device)
    x = torch.randn(7, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (7,), device=device)
    got = PerExampleGradients(model, F.cross_entropy, chunk_size=chunk_size)(x, y)
    want = loop_gradients(model, x, y)
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].shape == want[name].shape
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6)


def test_frozen_parameters_and_buffers_are_held_fixed():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 4), nn.LayerNorm(4), nn.Tanh(), nn.Linear(4, 3))
    model[0].weight.requires_grad_(False)
    model.register_buffer("unused", torch.ones(2))
    x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))
    got = per_example_gradients(model, F.cross_entropy, x, y)
    assert "0.weight" not in got
    want = loop_gradients(model, x, y)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-7)


def test_empty_batch():
    model = nn.Linear(3, 2)
    pe = PerExampleGradients(model, F.cross_entropy)
    x, y = torch.zeros(0, 3), torch.zeros(0, dtype=torch.long)
    assert list(pe.chunks(x, y)) == []
    got = pe(x, y)
    assert got["weight"].shape == (0, 2, 3) and got["bias"].shape == (0, 2)


def test_chunk_size_policy():
    big = PerExampleGradients(seed002_cifar_cnn(), F.cross_entropy)
    small = PerExampleGradients(seed000_mnist_cnn(), F.cross_entropy)
    assert big.chunk_size_for(256) == 16  # 24 MiB / (393,216 floats of the 1024×384 layer)
    assert small.chunk_size_for(256) == 256
    assert small.chunk_size_for(0) == 1
    fixed = PerExampleGradients(nn.Linear(2, 2), F.cross_entropy, chunk_size=4)
    assert fixed.chunk_size_for(10) == 4  # chunks 4, 4, 2 → balanced to ceil(10/3)
    assert fixed.chunk_size_for(3) == 3


@pytest.mark.parametrize(
    "layer",
    [nn.BatchNorm1d(4), nn.BatchNorm2d(4), nn.SyncBatchNorm(4), nn.LazyBatchNorm1d()],
)
def test_batchnorm_rejected_with_groupnorm_hint(layer):
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(layer))
    with pytest.raises(UnsupportedModuleError, match="GroupNorm") as info:
        check_per_example_compatible(model)
    assert "'1.0'" in str(info.value)
    with pytest.raises(UnsupportedModuleError):
        PerExampleGradients(model, F.cross_entropy)


def test_group_norm_and_layer_norm_accepted():
    check_per_example_compatible(nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4)))
    check_per_example_compatible(nn.LayerNorm(3))


def test_mismatched_batch_rejected():
    pe = PerExampleGradients(nn.Linear(3, 2), F.cross_entropy)
    with pytest.raises(ValueError, match="batch"):
        pe(torch.zeros(4, 3), torch.zeros(3, dtype=torch.long))


@pytest.mark.slow
def test_per_example_equals_loop_on_the_058m_cnn():
    torch.manual_seed(0)
    model = seed002_cifar_cnn()
    x, y = torch.randn(20, 3, 32, 32), torch.randint(0, 10, (20,))
    pe = PerExampleGradients(model, F.cross_entropy)
    assert pe.chunk_size_for(20) == 10  # 16 per chunk at most → two balanced chunks
    got, want = pe(x, y), loop_gradients(model, x, y)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6)
