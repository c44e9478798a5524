"""Checks of a run that need no data: every name and option of its configuration, the
device, and its loop's own checks (the federated loop's: its attack, and whether the robust
rule's ``f`` fits the rows it will aggregate).

``sharefl simulate`` and ``sharefl launch`` call :func:`check_runs` right after loading a
file, before any dataset is read or any folder is written, so that a typo fails in a
second with one line instead of after the data loaded and σ was calibrated.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from sharefl.simulator.config import RunConfig, SimulationConfigError
from sharefl.simulator.datasets import DATASETS
from sharefl.simulator.loops import LOOPS
from sharefl.simulator.models import MODELS
from sharefl.simulator.names import model_name, partition_name
from sharefl.simulator.partition import SCHEMES

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def check_device(name: str) -> torch.device:
    """The torch device ``name`` (``cpu``, ``cuda`` or ``cuda:N``), usable on this machine.

    Raises:
        SimulationConfigError: another name (``gpu``, ``mps``...), or CUDA asked for and absent.
    """
    if not _DEVICE.match(name):
        hint = " (Apple's mps is not supported)" if name.startswith("mps") else ""
        raise SimulationConfigError(
            f"device {name!r} is not one of cpu, cuda, cuda:N{hint}: use cpu or cuda"
        )
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = "built without CUDA" if torch.version.cuda is None else "no GPU visible"
            raise SimulationConfigError(
                f"device {name!r}: CUDA is not available here (torch {torch.__version__}, "
                f"{build}); use --device cpu"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise SimulationConfigError(
                f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    return device


def _choose(key: str, value: str, names: Sequence[str]) -> None:
    if value not in names:
        raise SimulationConfigError(
            f"{key} = {value!r} is unknown; choose one of {', '.join(names)}"
        )


def check_run(run: RunConfig, device: str | None = None) -> None:
    """Raise :class:`SimulationConfigError` (naming the key) for anything in ``run`` that
    cannot work, as far as it can be told without loading data: the shared names here, the
    loop's own tables by its entry's ``check`` (:data:`~sharefl.simulator.loops.LOOPS`)."""
    check_device(device or run.device)
    _choose("data.dataset", run.data.dataset, DATASETS)
    _choose("data.partition", partition_name(run.data.partition), SCHEMES)
    _choose("model.name", model_name(run.model.name), sorted(MODELS))
    LOOPS[run.algorithm.name].check(run)


def check_runs(runs: Sequence[RunConfig], device: str | None = None) -> None:
    """:func:`check_run` for every run of a grid (the first error is raised)."""
    for run in runs:
        try:
            check_run(run, device)
        except SimulationConfigError as exc:
            prefix = f"run {run.label!r}: " if len(runs) > 1 else ""
            raise SimulationConfigError(f"{prefix}{exc}") from exc
