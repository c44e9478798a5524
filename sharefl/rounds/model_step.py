"""The server's model step ``w ← w − η·v``: the one sign convention of sharefl.

Every loop steps *against* the aggregate of what the clients upload: in simulation the
uploads are (pseudo-)gradients, and a deployment's trainer returns the same kind of vector
(``old model − trained model`` for local training; a gradient for one step). One place
writes the step for all of them:

- :func:`descend`, ``w − η·v``: every deployment strategy (the gRPC server's
  :class:`~sharefl.deploy.strategy.AveragingStrategy` and
  :class:`~sharefl.robust_strategy.RobustStrategy`, a deployment's robust rule);
- :func:`server_step`, the simulator's :meth:`~sharefl.simulator.federated.server.Server.step`:
  :func:`descend` of the aggregate, or of its heavy-ball momentum (:func:`heavy_ball`,
  ``server.momentum``), in the model's dtype.

NumPy only (sans-IO), so that the deployment, which imports no torch, and the simulator,
which hands in its tensors as arrays, share it. Each function states the dtype it computes
in: the results are those of the same IEEE operations in the same order, whichever array
library ran them before (NumPy 2 treats the Python float ``η`` or ``μ`` as the arrays'
dtype, as torch does with a Python scalar).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import DTypeLike

from sharefl.protocol.errors import ConfigurationError


class ModelStepError(ConfigurationError):
    """A server momentum outside [0, 1), or a momentum without the velocity it updates."""


def descend(
    model: np.ndarray, learning_rate: float, direction: np.ndarray, *, dtype: DTypeLike = np.float32
) -> np.ndarray:
    """``model − learning_rate · direction`` as a new array of ``dtype``.

    Shapes: ``model`` and ``direction`` ``[d]`` (or any pair NumPy broadcasts). Computed in
    NumPy's promotion of the two arrays' dtypes (a float32 model and a float64 aggregate:
    float64, with ``learning_rate`` in that dtype), product first, then the difference,
    each rounded once; the result is then cast to ``dtype`` (default float32, the dtype of
    every deployment's model).
    """
    stepped: np.ndarray = model - learning_rate * direction
    return stepped.astype(dtype, copy=False)  # already new: no second copy


def heavy_ball(velocity: np.ndarray, momentum: float, aggregate: np.ndarray) -> np.ndarray:
    """Server momentum, in place: ``velocity ← momentum · velocity + aggregate``.

    ``velocity`` (``[d]``, written in place and returned) keeps its dtype: the product is
    computed in it, the sum in the promotion of its dtype and ``aggregate``'s, rounded once
    into it (as torch's ``velocity.mul_(μ).add_(aggregate)``).
    """
    np.multiply(velocity, momentum, out=velocity)
    np.add(velocity, aggregate, out=velocity)
    return velocity


def server_step(
    model: np.ndarray,
    learning_rate: float,
    aggregate: np.ndarray,
    *,
    momentum: float = 0.0,
    velocity: np.ndarray | None = None,
) -> np.ndarray:
    """One step of a server that keeps its state in the model's dtype (the simulator's):
    ``w ← w − η·v`` with ``v = aggregate`` (``momentum`` 0) or ``v = velocity`` after
    :func:`heavy_ball` (``momentum`` in (0, 1); ``velocity`` ``[d]`` is updated in place).

    ``v`` is cast to the model's dtype before :func:`descend`, so the step is computed in
    the model's dtype and returned as a new array of it. Raises :class:`ModelStepError`
    for a momentum outside [0, 1) or a positive momentum without ``velocity``.
    """
    if not (math.isfinite(momentum) and 0.0 <= momentum < 1.0):
        raise ModelStepError(f"server momentum must be in [0, 1), got {momentum}")
    direction = aggregate
    if momentum:
        if velocity is None:
            raise ModelStepError(
                "server momentum needs the velocity it updates: pass velocity (zeros at the "
                "start of the run, the model's shape and dtype)"
            )
        direction = heavy_ball(velocity, momentum, aggregate)
    return descend(model, learning_rate, direction.astype(model.dtype), dtype=model.dtype)
