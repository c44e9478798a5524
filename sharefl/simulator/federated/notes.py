"""What running other rounds than the file's did to a federated run's σ.

A run whose rounds the command line changed (``sharefl simulate --rounds N``) and whose σ
is calibrated to a target ε says so before its first round (:func:`rounds_override_note`,
the federated entry's ``rounds_note`` in :data:`~sharefl.simulator.loops.LOOPS`): the same
ε over other rounds is another σ, which the user did not write.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sharefl.privacy.calibration import calibrate_noise
from sharefl.privacy.errors import CalibrationError
from sharefl.simulator.federated.loop import Simulation
from sharefl.simulator.federated.setup import PrivacyPlan
from sharefl.simulator.federated.share import distributed_encoder
from sharefl.wording import counted


def rounds_override_note(sim: Any, file_rounds: int) -> str | None:
    """One line saying what running ``sim.run.rounds`` rounds instead of the file's
    ``file_rounds`` did to σ, or ``None`` when it did nothing to it (same rounds, no
    privacy, a configured σ, a loop without a :class:`PrivacyPlan`).

    With a target ε (``privacy.epsilon``) σ is the smallest noise multiplier whose ε after
    all the run's mechanism steps stays within the target (:func:`calibrate_noise`), so
    fewer rounds give a smaller σ, more rounds a larger one; δ and q do not depend on the
    rounds, so the file's σ is the calibration with the plan's δ and q over
    ``file_rounds`` × ``steps_per_round`` steps. ``privacy.distributed`` =
    ``"discrete_gaussian"`` / ``"skellam"`` calibrate with their own accounting (in the
    cluster split), and so does the line's "before". Costs one calibration (~2 s).
    """
    run = sim.run
    plan = sim.ledger.plan if isinstance(sim, Simulation) else None
    if file_rounds == run.rounds or not isinstance(plan, PrivacyPlan):
        return None
    if not plan.enabled or plan.target_epsilon is None:
        return None
    head = (
        f"--rounds {run.rounds}: σ recalibrated to reach ε = {plan.target_epsilon:g} in "
        f"{counted(run.rounds, 'round')} instead of the file's {file_rounds}"
    )
    p = run.privacy
    after = f"{plan.noise_multiplier:.3g}"
    try:
        if p.level == "client" and p.distributed != "gaussian":
            head += f" (by the {p.distributed} mechanism's accounting)"
            target = (plan.target_epsilon, plan.delta)
            file_run = dataclasses.replace(run, rounds=file_rounds)
            assert isinstance(sim, Simulation)  # the one loop with discrete mechanisms
            encoder = distributed_encoder(file_run, plan.noise_multiplier, sim.dim, target=target)
            assert encoder is not None  # a discrete mechanism at client level
            return f"{head}: {encoder.config.noise_multiplier:.3g} → {after}"
        before = calibrate_noise(
            plan.target_epsilon,
            plan.delta,
            plan.sample_rate,
            file_rounds * plan.steps_per_round,
            p.accountant,
            conversion=p.conversion,
        )
    except CalibrationError:  # the file's rounds need more noise than calibration tries
        return f"{head}: σ = {after}"
    return f"{head}: {before:.3g} → {after}"
