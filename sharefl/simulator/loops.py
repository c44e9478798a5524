"""The training loops a run can select (``[algorithm] name``), behind one interface.

:class:`Loop` is what the runner and the results writer need from a loop: its run, device,
``run_rounds(callback)``, ``privacy_summary()`` and ``final_model()`` (the model the run's
evaluations report, as a :class:`~sharefl.simulator.final_model.FinalModel`: a
``state_dict`` of numpy arrays plus what rebuilds the module, written as ``model.npz`` and
``model.json``). :func:`build_loop` picks the loop.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol

import torch

from sharefl.simulator.config import RunConfig
from sharefl.simulator.final_model import FinalModel
from sharefl.simulator.results import RoundRecord


class Loop(Protocol):
    round: int
    started: float  # time.perf_counter() when the loop was built (moved back on resume)

    @property
    def run(self) -> RunConfig: ...

    @property
    def device(self) -> torch.device: ...

    def run_rounds(self, callback: Callable[[RoundRecord], None] | None = None) -> RoundRecord: ...

    def elapsed(self) -> float: ...

    def privacy_summary(self) -> tuple[float | None, dict[str, Any]]: ...

    def final_model(self) -> FinalModel: ...


LOOPS: dict[str, str] = {
    "federated": "sharefl.simulator.federated.loop:Simulation",
    "dp_rsa": "sharefl.simulator.dp_rsa.loop:RSALoop",
    "decentralized": "sharefl.simulator.decentralized.loop:DecentralizedLoop",
}
"""``[algorithm] name`` → the loop class, as ``module:class`` (imported when a run selects
it; the names are :data:`~sharefl.simulator.config.ALGORITHMS`). A new paper's loop is one
line here."""


def build_loop(run: RunConfig, *, device: str | None = None) -> Loop:
    """The loop :data:`LOOPS` names for ``run.algorithm.name``, built for ``run``."""
    module, _, name = LOOPS[run.algorithm.name].partition(":")
    loop: Loop = getattr(importlib.import_module(module), name)(run, device=device)
    return loop
