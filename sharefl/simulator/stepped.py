""":class:`SteppedLoop`: what every training loop shares (the federated
:class:`~sharefl.simulator.federated.loop.Simulation`, the DP-RSA
:class:`~sharefl.simulator.dp_rsa.loop.RSALoop`, the
:class:`~sharefl.simulator.decentralized.loop.DecentralizedLoop`).

A loop has a run (``self.run``), a count of finished rounds (``self.round``) and a wall
clock started when it was built (``self.started``); it implements :meth:`SteppedLoop.step`
(one round, returning its :class:`~sharefl.simulator.results.RoundRecord`) and inherits
the constructor's prologue (:meth:`SteppedLoop.begin`: the run, its device and data),
running the remaining rounds, the clock, and the rule of which rounds are evaluated.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar

import torch

from sharefl.simulator.config import RunConfig, SimulationConfigError
from sharefl.simulator.datasets import Dataset
from sharefl.simulator.results import RoundRecord
from sharefl.simulator.setup import run_data


class SteppedLoop:
    """A loop run one ``step()`` (one round or iteration) at a time.

    A subclass names the ``[algorithm] name`` it runs (:attr:`algorithm`), opens its
    constructor with :meth:`begin` and closes it with :meth:`start_clock`."""

    algorithm: ClassVar[str]
    """The ``[algorithm] name`` this loop runs (a key of
    :data:`~sharefl.simulator.loops.LOOPS`)."""

    run: RunConfig
    round: int
    started: float

    def begin(
        self,
        run: RunConfig,
        device: str | torch.device | None,
        train: Dataset | None,
        test: Dataset | None,
    ) -> tuple[torch.device, Dataset, Dataset]:
        """Keep ``run`` and return its device and (train, test) sets (loaded unless both
        are given: :func:`~sharefl.simulator.setup.run_data`); call first in ``__init__``.
        Raises :class:`SimulationConfigError` for a run of another loop or a device that is
        not there."""
        if run.algorithm.name != self.algorithm:
            raise SimulationConfigError(
                f"{type(self).__name__} runs [algorithm] name = {self.algorithm!r}, not "
                f"{run.algorithm.name!r}: sharefl.simulator.loops.build_loop builds the "
                "loop a run names"
            )
        self.run = run
        return run_data(run, device, train, test)

    def start_clock(self) -> None:
        """Start the wall clock and the round count (call at the end of ``__init__``)."""
        self.started = time.perf_counter()
        self.round = 0

    def step(self) -> RoundRecord:
        """Run one round; returns its record (evaluated when :meth:`evaluation_due`)."""
        raise NotImplementedError

    def elapsed(self) -> float:
        """Seconds since the loop was built."""
        return time.perf_counter() - self.started

    def evaluation_due(self) -> bool:
        """Whether the round just finished (``self.round``) is evaluated: every
        ``run.eval_every`` rounds and the last one."""
        return self.round % self.run.eval_every == 0 or self.round == self.run.rounds

    def run_rounds(self, callback: Callable[[RoundRecord], None] | None = None) -> RoundRecord:
        """Run the remaining rounds; ``callback`` sees every record. Returns the last one.

        Raises:
            RuntimeError: no round is left to run.
        """
        record = None
        while self.round < self.run.rounds:
            record = self.step()
            if callback is not None:
                callback(record)
        if record is None:
            raise RuntimeError(f"all {self.run.rounds} rounds have run already")
        return record
