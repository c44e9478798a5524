"""Byzantine workers of the DP-RSA loop (seed002 §4), on sign messages and on gradients.

A Byzantine worker j of RSA sends ``sign(x_0 − z_j)`` for a vector z_j of its choosing
(:func:`~sharefl.simulator.attacks.rsa_messages`); the gradient baselines (SGD, SignSGD,
SGD with GM) receive a gradient from it instead. The configuration names
(``[attack] name``) and this module's choices where the note (§6.7) leaves them open:

============================  ===========================  ===============================
``name`` (options)            sign message (RSA family)    gradient (baselines)
============================  ===========================  ===============================
``gaussian`` (``std`` = 1e4,  z_j ~ N(0, std² I); one      g_j ~ N(0, std² I), one draw
``shared`` = true)            draw shared by all j (the    shared likewise
                              code) unless shared = false
``sign_flipping``             z_j = scale · x_0, "the      g_j = scale · (mean of the
(``scale`` = −5)              true model" read as x_0:     regular gradients); the code's
                              the message is sign(x_0)     Byzantine gradients are 0
``sample_duplicating``        the message of regular       the gradient of regular worker
(``source`` = 0, ``message``  worker ``source``: its raw   ``source``
= "raw" or "sent")            sign(x_0 − x_src) (the code)
                              or its perturbed message
``none``                      no Byzantine messages        no Byzantine gradients
============================  ===========================  ===============================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from sharefl.simulator.attacks import rsa_messages
from sharefl.simulator.config import SimulationConfigError

SIGN_ATTACKS = ("none", "gaussian", "sign_flipping", "sample_duplicating")


@dataclass(frozen=True, kw_only=True)
class SignAttack:
    """One of :data:`SIGN_ATTACKS` with its options (see the module table).

    Raises:
        SimulationConfigError: an unknown name, option or value.
    """

    name: str = "none"
    std: float = 1e4
    shared: bool = True
    scale: float = -5.0
    source: int = 0
    message: str = "raw"

    def __post_init__(self) -> None:
        if self.name not in SIGN_ATTACKS:
            raise SimulationConfigError(f"attack.name for the dp_rsa loop: one of {SIGN_ATTACKS}")
        if not self.std > 0:
            raise SimulationConfigError("attack.options.std must be > 0")
        if self.message not in ("raw", "sent"):
            raise SimulationConfigError('attack.options.message must be "raw" or "sent"')
        if self.source < 0:
            raise SimulationConfigError("attack.options.source must be >= 0")

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

    def gradients(self, count: int, honest: Tensor, generator: torch.Generator) -> Tensor:
        """``[count, d]`` Byzantine gradients given the regular ones ``[r, d]``."""
        if count == 0 or self.name == "none":
            return honest.new_zeros(0, honest.shape[1])
        if self.name == "gaussian":
            return self._gaussian(count, honest, generator).clone()
        if self.name == "sign_flipping":
            return (self.scale * honest.mean(dim=0)).expand(count, -1).clone()
        return honest[self._source(len(honest))].expand(count, -1).clone()

    def _source(self, regular: int) -> int:
        if self.source >= regular:
            raise SimulationConfigError(
                f"attack.options.source must be < {regular} regular workers"
            )
        return self.source
