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
    rng = np.random.default_rng(run.seed + 7919)
    return _load(run, "train", device, rng), _load(run, "test", device, rng)


def load_train(run: RunConfig, device: torch.device) -> Dataset:
    """The run's training set alone, exactly as :func:`load_data` loads it (the test
    set's subsample draws after the training set's): what a deployed client process
    needs, which never evaluates."""
    return _load(run, "train", device, np.random.default_rng(run.seed + 7919))


def _load(run: RunConfig, split: str, device: torch.device, rng: np.random.Generator) -> Dataset:
    """One split of the run's data set, subsampled (from ``rng``, training set first),
    standardised and moved to ``device``."""
    cfg = run.data
    data = load_dataset(
        cfg.dataset, split, root=cfg.root or None, download=cfg.download, **cfg.options
    )
    keep = cfg.train_examples if split == "train" else cfg.test_examples
    if keep and keep < len(data):
        data = data.subset(np.sort(rng.choice(len(data), keep, replace=False)))
    if cfg.input_mean:
        data = data.standardized(cfg.input_mean, cfg.input_std)
    return Dataset(data.name, data.inputs.to(device), data.targets.to(device), data.num_classes)


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
