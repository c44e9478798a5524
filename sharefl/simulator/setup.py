"""What every loop starts from: the run's device and its (train, test) data sets.

:func:`run_data` is the prologue of every loop (:meth:`~sharefl.simulator.stepped.
SteppedLoop.begin`); :func:`load_data` loads, subsamples and standardises the run's data
sets; :func:`resolve_device` checks the device. The federated loop's own setup (clients'
partitions, the model, the privacy plan) is :mod:`sharefl.simulator.federated.setup`.
"""

from __future__ import annotations

import numpy as np
import torch

from sharefl.simulator.config import RunConfig, SimulationConfigError
from sharefl.simulator.datasets import Dataset, load_dataset


def resolve_device(name: str | torch.device) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N``; :class:`SimulationConfigError` if CUDA is asked for
    and absent."""
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SimulationConfigError("device cuda requested but torch.cuda.is_available() is False")
    return device


def load_data(run: RunConfig, device: torch.device) -> tuple[Dataset, Dataset]:
    """(train, test) datasets of the run, subsampled and standardised as configured, on
    ``device``."""
    cfg = run.data
    root = cfg.root or None
    train = load_dataset(cfg.dataset, "train", root=root, download=cfg.download, **cfg.options)
    test = load_dataset(cfg.dataset, "test", root=root, download=cfg.download, **cfg.options)
    rng = np.random.default_rng(run.seed + 7919)
    if cfg.train_examples and cfg.train_examples < len(train):
        train = train.subset(np.sort(rng.choice(len(train), cfg.train_examples, replace=False)))
    if cfg.test_examples and cfg.test_examples < len(test):
        test = test.subset(np.sort(rng.choice(len(test), cfg.test_examples, replace=False)))
    if cfg.input_mean:
        train = train.standardized(cfg.input_mean, cfg.input_std)
        test = test.standardized(cfg.input_mean, cfg.input_std)
    move = lambda d: Dataset(d.name, d.inputs.to(device), d.targets.to(device), d.num_classes)  # noqa: E731
    return move(train), move(test)


def run_data(
    run: RunConfig,
    device: str | torch.device | None,
    train: Dataset | None,
    test: Dataset | None,
) -> tuple[torch.device, Dataset, Dataset]:
    """The prologue of every loop: the run's device (``device``, else ``run.device``) and
    its (train, test) sets — the given ones, or loaded on that device when either is
    missing. Raises :class:`SimulationConfigError` for a device that is not there."""
    where = resolve_device(device or run.device)
    if train is None or test is None:
        train, test = load_data(run, where)
    return where, train, test
