"""The training loops a run can select (``[algorithm] name``), behind one interface.

:class:`Loop` is what the runner and the results writer need from a loop: its run, device,
``run_rounds(callback)`` and ``privacy_summary()``. :func:`build_loop` picks the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from sharefl.simulator.config import RunConfig
from sharefl.simulator.engine import Simulation
from sharefl.simulator.results import RoundRecord


class Loop(Protocol):
    round: int

    @property
    def run(self) -> RunConfig: ...

    @property
    def device(self) -> torch.device: ...

    def run_rounds(self, callback: Callable[[RoundRecord], None] | None = None) -> RoundRecord: ...

    def privacy_summary(self) -> tuple[float | None, dict[str, Any]]: ...


def build_loop(run: RunConfig, *, device: str | None = None) -> Loop:
    """The loop of ``run``: :class:`~sharefl.simulator.engine.Simulation` for
    ``"federated"``, :class:`~sharefl.simulator.rsa_loop.RSALoop` for ``"dp_rsa"``,
    :class:`~sharefl.simulator.decentralized.loop.DecentralizedLoop` for
    ``"decentralized"``."""
    if run.algorithm.name == "dp_rsa":
        from sharefl.simulator.rsa_loop import RSALoop

        return RSALoop(run, device=device)
    if run.algorithm.name == "decentralized":
        from sharefl.simulator.decentralized.loop import DecentralizedLoop

        return DecentralizedLoop(run, device=device)
    return Simulation(run, device=device)
