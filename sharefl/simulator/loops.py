"""The training loops a run can select (``[algorithm] name``), behind one interface.

:class:`Loop` is what the runner and the results writer need from a loop: its run, device,
``run_rounds(callback)``, ``privacy_summary()`` and ``final_model()`` (the model the run's
evaluations report, as a :class:`~sharefl.simulator.final_model.FinalModel`: a
``state_dict`` of numpy arrays plus what rebuilds the module, written as ``model.npz`` and
``model.json``). :data:`LOOPS` is the registry of loops by ``[algorithm] name``,
:func:`build_loop` picks the loop.

The registry imports every loop's folder statically, so the import contracts see what it
uses (``pyproject.toml``: the loop folders are independent of each other, the shared
simulator modules below them, this module, the preflight and the runner above them). It
imports torch: the command line reads and checks a file (:mod:`sharefl.simulator.config`,
no torch) before it imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from sharefl.simulator.config import RunConfig
from sharefl.simulator.decentralized import attacks as decentralized_attacks
from sharefl.simulator.decentralized.loop import DecentralizedLoop
from sharefl.simulator.dp_rsa import attacks as dp_rsa_attacks
from sharefl.simulator.dp_rsa.loop import RSALoop
from sharefl.simulator.federated import attacks as federated_attacks
from sharefl.simulator.federated.checks import check_federated_run
from sharefl.simulator.federated.loop import Simulation
from sharefl.simulator.federated.notes import rounds_override_note
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


@dataclass(frozen=True)
class LoopEntry:
    """What the simulator needs of one loop, beside its class.

    Attributes:
        loop: the loop class (a :class:`~sharefl.simulator.stepped.SteppedLoop`), built as
            ``loop(run, device=...)``.
        attacks: the ``attack.name`` values it takes (its folder's ``attacks.ATTACKS``; each
            folder's ``attacks.build_attack`` builds them).
        check: its checks that need no data (the attack, the federated loop's rule), raising
            :class:`~sharefl.simulator.config.SimulationConfigError`; run by
            :func:`~sharefl.simulator.preflight.check_run` before any data loads.
        rounds_note: what running other rounds than the file's did to the loop's σ (one
            line, or ``None``), for loops whose σ is calibrated to the rounds.
    """

    loop: Callable[..., Loop]
    attacks: tuple[str, ...]
    check: Callable[[RunConfig], None]
    rounds_note: Callable[[Any, int], str | None] | None = None


LOOPS: dict[str, LoopEntry] = {
    "federated": LoopEntry(
        Simulation, federated_attacks.ATTACKS, check_federated_run, rounds_override_note
    ),
    "dp_rsa": LoopEntry(RSALoop, dp_rsa_attacks.ATTACKS, dp_rsa_attacks.check_attack),
    "decentralized": LoopEntry(
        DecentralizedLoop, decentralized_attacks.ATTACKS, decentralized_attacks.check_attack
    ),
}
"""``[algorithm] name`` → the loop's :class:`LoopEntry` (the names are
:data:`~sharefl.simulator.config.ALGORITHMS`). A new paper's loop is one entry here."""


def build_loop(run: RunConfig, *, device: str | None = None) -> Loop:
    """The loop :data:`LOOPS` names for ``run.algorithm.name``, built for ``run``."""
    return LOOPS[run.algorithm.name].loop(run, device=device)


def rounds_note(sim: Loop, file_rounds: int) -> str | None:
    """The loop's :attr:`LoopEntry.rounds_note` for ``sim`` (``None`` for a loop without
    one)."""
    note = LOOPS[sim.run.algorithm.name].rounds_note
    return None if note is None else note(sim, file_rounds)
