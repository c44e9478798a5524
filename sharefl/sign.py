"""The sign of RSA and DP-RSA (Zhu and Ling): +1 for an input ≥ 0, −1 otherwise.

One definition for both of its users, below them: :mod:`sharefl.robust.rsa` (a regular
worker's message sign(x_0 − x_k), the master's step) and :mod:`sharefl.privacy.sign` (the
local randomisers of that message). ``robust`` and ``privacy`` stay independent of each
other (an import contract in ``pyproject.toml``); both import this module, which imports
nothing of sharefl.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rsa_sign(v: Tensor) -> Tensor:
    """Element-wise sign with the paper's convention ``sign(0) = +1`` (``torch.sign`` gives
    0, which the authors' code uses); NaN maps to -1. Same dtype and device as ``v``.

    A regular worker's plain RSA message is ``rsa_sign(x_0 - x_k)``."""
    one = torch.ones((), dtype=v.dtype, device=v.device)
    return torch.where(v >= 0, one, -one)
