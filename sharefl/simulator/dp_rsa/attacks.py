"""Byzantine workers of the DP-RSA loop (Zhu and Ling §4), on sign messages and on gradients.

A Byzantine worker j of RSA sends ``sign(x_0 − z_j)`` for a vector z_j of its choosing
(:func:`rsa_messages`); the gradient baselines (SGD, SignSGD,
SGD with GM) receive a gradient from it instead, where it sends b_j in place of its
stochastic gradient (SignSGD's master takes sign(b_j) of it, like every row; GM takes b_j
as a point). The configuration names (``[attack] name``) and this module's choices where
the note (§6.7) leaves them open:

============================  ===========================  ===============================
``name`` (options)            sign message (RSA family)    gradient b_j (baselines)
============================  ===========================  ===============================
``gaussian`` (``std`` = 1e4,  z_j ~ N(0, std² I); one      b_j ~ N(0, std² I), one draw
``shared`` = true)            draw shared by all j (the    shared likewise
                              code) unless shared = false
``sign_flipping``             z_j = scale · x_0, "the      b_j = scale · x_0, the same
(``scale`` = −5,              true model" read as x_0:     −5 × the true model (x_0 is the
``baseline_flip`` =           the message is sign(x_0)     shared model x); SignSGD thus
"model")                                                   gets sign(−5 x) = −sign(x).
                                                           ``baseline_flip = "gradient"``:
                                                           b_j = scale · (mean of the
                                                           regular gradients), this
                                                           module's earlier reading
``sample_duplicating``        the message of regular       the gradient of regular worker
(``source`` = 0, ``message``  worker ``source``: its raw   ``source``
= "raw" or "sent")            sign(x_0 − x_src) (the code)
                              or its perturbed message
``none``                      no Byzantine messages        no Byzantine gradients
============================  ===========================  ===============================

Sign-flipping on the baselines. The paper (Zhu & Ling, §5 "Numerical Experiments", attack
(ii)) defines one attack for every method of Figures 1–4: "each Byzantine worker calculates
the true model and multiplies it with a negative constant −5". For RSA that is z_j = −5·x_0
in eq. (7)/(11); the baselines' messages are gradients, and the paper names no other
quantity to flip, so the Byzantine gradient is b_j = −5·x (x = the shared model it was
sent). Consequence for SGD (r regular, b Byzantine of K): the mean step is
(Σ_k g_k − 5b·x)/K, i.e. x ← (1 + 5αb/K)·x − (α/K)·Σ_k g_k: a push away from 0 that grows
with x itself, so x grows geometrically (× 1.005 per iteration at α = 0.01, b/K = 3/30)
unless the honest mean gradient outweighs (5b/K)·x = 0.5·x, which is what the paper's "SGD
has no defense abilities" needs (measured: docs/results/dp-rsa.md). The earlier reading
(``baseline_flip = "gradient"``: −5 × the mean regular gradient, the authors' code's
``Attack.sign_flipping`` applied to a gradient, whose Byzantine buffer there is never
computed and stays 0) makes the SGD mean (r − 5b)/K = 0.4 × the honest mean at 27/3: a
shorter step the right way, an attack that cannot break the mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from sharefl.robust import rsa_sign
from sharefl.simulator.config import RunConfig, SimulationConfigError


def rsa_messages(x0: Tensor, models: Tensor) -> Tensor:
    """DP-RSA's Byzantine messages ``sign(x_0 - z_j)`` for attack vectors ``z_j`` (rows of
    ``models``) posing as worker models: Zhu and Ling's Gaussian attack draws ``z_j`` from
    ``N(0, 10⁴²)``, their sign-flipping attack uses ``z_j = -5 x_0``."""
    return rsa_sign(x0.unsqueeze(0) - models)


ATTACKS = ("none", "gaussian", "sign_flipping", "sample_duplicating")
"""The dp_rsa loop's ``attack.name`` values (what :func:`build_attack` builds)."""
BASELINE_FLIPS = ("model", "gradient")
"""What sign-flipping multiplies by ``scale`` for the gradient baselines: the shared model
(the paper, §5) or the mean regular gradient (the earlier reading)."""


@dataclass(frozen=True, kw_only=True)
class SignAttack:
    """One of :data:`ATTACKS` with its options (see the module table).

    Raises:
        SimulationConfigError: an unknown name, option or value.
    """

    name: str = "none"
    std: float = 1e4
    shared: bool = True
    scale: float = -5.0
    source: int = 0
    message: str = "raw"
    baseline_flip: str = "model"

    def __post_init__(self) -> None:
        if self.name not in ATTACKS:
            raise SimulationConfigError(f"attack.name for the dp_rsa loop: one of {ATTACKS}")
        if not self.std > 0:
            raise SimulationConfigError("attack.options.std must be > 0")
        if self.message not in ("raw", "sent"):
            raise SimulationConfigError('attack.options.message must be "raw" or "sent"')
        if self.source < 0:
            raise SimulationConfigError("attack.options.source must be >= 0")
        if self.baseline_flip not in BASELINE_FLIPS:
            raise SimulationConfigError(
                f"attack.options.baseline_flip must be one of {BASELINE_FLIPS}"
            )

    @classmethod
    def from_config(cls, name: str, options: dict[str, Any]) -> SignAttack:
        try:
            return cls(name=name, **options)
        except TypeError as exc:
            raise SimulationConfigError(f"attack {name!r} with options {options}: {exc}") from exc

    def _gaussian(self, count: int, like: Tensor, generator: torch.Generator) -> Tensor:
        rows = 1 if self.shared else count
        z = torch.randn(
            rows, like.shape[-1], generator=generator, device=like.device, dtype=like.dtype
        )
        return (z * self.std).expand(count, -1)

    def messages(
        self, count: int, x0: Tensor, raw: Tensor, sent: Tensor, generator: torch.Generator
    ) -> Tensor:
        """``[count, d]`` ±1 messages of the Byzantine workers given the master model ``x0``
        ``[d]`` and the regular workers' raw signs and sent messages (``[r, d]`` each)."""
        if count == 0 or self.name == "none":
            return x0.new_zeros(0, x0.numel())
        if self.name == "gaussian":
            return rsa_messages(x0, self._gaussian(count, x0, generator))
        if self.name == "sign_flipping":
            return rsa_messages(x0, (self.scale * x0).expand(count, -1))
        copied = (raw if self.message == "raw" else sent)[self._source(len(raw))]
        return copied.expand(count, -1).clone()

    def gradients(
        self, count: int, x0: Tensor, honest: Tensor, generator: torch.Generator
    ) -> Tensor:
        """``[count, d]`` Byzantine gradients given the shared model ``x0`` ``[d]`` (the
        model the baselines' workers were sent) and the regular gradients ``[r, d]``.

        Sign-flipping sends ``scale · x0`` (``baseline_flip = "model"``, the paper's §5
        attack (ii)) or ``scale · mean(honest)`` (``"gradient"``); see the module text."""
        if count == 0 or self.name == "none":
            return honest.new_zeros(0, honest.shape[1])
        if self.name == "gaussian":
            return self._gaussian(count, honest, generator).clone()
        if self.name == "sign_flipping":
            flipped = x0 if self.baseline_flip == "model" else honest.mean(dim=0)
            return (self.scale * flipped).expand(count, -1).clone()
        return honest[self._source(len(honest))].expand(count, -1).clone()

    def _source(self, regular: int) -> int:
        if self.source >= regular:
            raise SimulationConfigError(
                f"attack.options.source must be < {regular} regular workers"
            )
        return self.source


def build_attack(name: str, options: dict[str, Any]) -> SignAttack:
    """The attack ``name`` of :data:`ATTACKS` with ``options`` (``[attack]``).

    Raises:
        SimulationConfigError: an unknown name, option or value.
    """
    return SignAttack.from_config(name, options)


def check_attack(run: RunConfig) -> None:
    """The dp_rsa entry's data-free check (:data:`~sharefl.simulator.loops.LOOPS`): its
    ``[attack]`` builds (:func:`build_attack`)."""
    build_attack(run.attack.name, run.attack.options)
