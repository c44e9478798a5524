"""What every robust aggregator shares: the call contract, input checks and the error type.

An *aggregator* maps the ``n`` rows of a floating tensor ``X`` of shape ``[n, d]`` (one
update per row) to one vector of shape ``[d]``; a *pre-aggregator* maps them to ``n'``
rows of the same width, to be fed to an aggregator. Both are frozen, typed dataclasses
configured by keyword (``Krum(f=2)``), callable on any device and any floating dtype:

* the result has the input's device and dtype; internal sums accumulate in at least
  float32 and the selection rules compute distances in float64;
* the input is never modified (kernels read it and write to their own buffers);
* the rules are not differentiable: they run under :func:`torch.no_grad`.

``f`` is the number of arbitrary ("Byzantine") rows a rule is configured to tolerate.
Each rule states its breakdown point and raises :class:`AggregationError` (a
:class:`ValueError`) when ``n`` is too small for ``f``; the message says what to change.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sharefl.errors import ConfigurationError


class AggregationError(ConfigurationError):
    """Bad parameters or inputs of a robust rule: f too large for n, a negative threshold,
    a non-2-D or non-floating input, weights of the wrong shape or sign (a configuration
    error: exit status 2)."""


def check_matrix(X: object, *, name: str = "X") -> Tensor:
    """Return ``X`` if it is a floating tensor of shape ``[n, d]`` with ``n >= 1``."""
    if not isinstance(X, Tensor):
        raise AggregationError(f"{name} must be a torch.Tensor of shape [n, d], got {type(X)}")
    if X.dim() != 2:
        raise AggregationError(
            f"{name} must have shape [n, d] (one update per row), got shape {tuple(X.shape)}; "
            "stack the updates with torch.stack(updates)"
        )
    if not X.is_floating_point():
        raise AggregationError(f"{name} must have a floating dtype, got {X.dtype}")
    if X.shape[0] == 0:
        raise AggregationError(f"{name} has no rows: aggregation needs at least one update")
    return X


def check_vector(v: object, d: int, like: Tensor, *, name: str) -> Tensor:
    """Return ``v`` as a tensor of shape ``[d]`` on ``like``'s device and dtype."""
    if not isinstance(v, Tensor):
        raise AggregationError(f"{name} must be a torch.Tensor of shape [{d}], got {type(v)}")
    if v.shape != (d,):
        raise AggregationError(f"{name} must have shape [{d}], got {tuple(v.shape)}")
    return v.to(device=like.device, dtype=like.dtype)


def check_weights(weights: object, n: int, like: Tensor) -> Tensor:
    """Validate per-row weights: shape ``[n]``, finite, non-negative, positive sum.

    Returned as float64 on ``like``'s device (weights are few, precision is free).
    """
    if not isinstance(weights, Tensor):
        weights = torch.as_tensor(weights)
    w = weights.to(device=like.device, dtype=torch.float64)
    if w.shape != (n,):
        raise AggregationError(f"weights must have shape [{n}] (one per row), got {tuple(w.shape)}")
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise AggregationError("weights must be finite and non-negative")
    if not float(w.sum()) > 0:
        raise AggregationError("weights must not all be zero")
    return w


def check_nonnegative_int(value: object, name: str) -> int:
    """``value`` as an int if it is a non-negative integer (bool excluded)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AggregationError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def check_positive(value: object, name: str, *, allow_zero: bool = False) -> float:
    """``value`` as a float if it is a finite number > 0 (or >= 0 with ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AggregationError(f"{name} must be a number, got {value!r}")
    v = float(value)
    ok = v >= 0 if allow_zero else v > 0
    if not (ok and v < float("inf")):
        bound = ">= 0" if allow_zero else "> 0"
        raise AggregationError(f"{name} must be finite and {bound}, got {value!r}")
    return v


def max_tolerated(n: int, per_f: int, offset: int) -> int:
    """The largest ``f`` with ``n >= per_f * f + offset`` (-1 if even f = 0 fails)."""
    if n < offset:
        return -1
    return n if per_f == 0 else (n - offset) // per_f


def require_rows(rule: str, f: int, n: int, per_f: int = 2, offset: int = 1) -> None:
    """Raise :class:`AggregationError` unless ``n >= per_f * f + offset``."""
    need = per_f * f + offset
    if n >= need:
        return
    largest = max_tolerated(n, per_f, offset)
    fix = (
        f"lower f to at most {largest} or aggregate more updates"
        if largest >= 0
        else f"aggregate at least {offset} updates"
    )
    raise AggregationError(
        f"{rule}(f={f}) needs n >= {per_f}f + {offset} = {need} rows, got n = {n}: {fix}"
    )


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype kernels compute in: float64 stays, everything narrower becomes float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass(frozen=True, kw_only=True)
class Aggregator(ABC):
    """Base class of the rules ``[n, d] -> [d]``.

    Subclasses implement :meth:`_aggregate` and set the class constants ``_ROWS_PER_F``
    and ``_ROWS_OFFSET``: the rule needs ``n >= _ROWS_PER_F * f + _ROWS_OFFSET`` rows (its
    breakdown point, stated as the fewest rows it accepts for ``f``).

    Attributes:
        f: the number of arbitrary rows the rule is configured to tolerate.
    """

    f: int = 0

    #: whether ``__call__`` takes per-row ``weights`` (hierarchical aggregation uses them)
    accepts_weights: ClassVar[bool] = False
    #: the rule accepts n >= _ROWS_PER_F * f + _ROWS_OFFSET rows
    _ROWS_PER_F: ClassVar[int] = 2
    _ROWS_OFFSET: ClassVar[int] = 1

    def __post_init__(self) -> None:
        check_nonnegative_int(self.f, "f")

    def min_rows(self) -> int:
        """The smallest ``n`` this rule accepts with its ``f``."""
        return self._ROWS_PER_F * self.f + self._ROWS_OFFSET

    @classmethod
    def max_f(cls, n: int) -> int:
        """The largest ``f`` the rule accepts with ``n`` rows (-1: none, n is too small)."""
        return max_tolerated(n, cls._ROWS_PER_F, cls._ROWS_OFFSET)

    def check_rows(self, n: int) -> None:
        """Raise :class:`AggregationError` if ``n`` rows are too few for ``f``."""
        require_rows(type(self).__name__, self.f, n, self._ROWS_PER_F, self._ROWS_OFFSET)

    @torch.no_grad()
    def __call__(self, X: Tensor) -> Tensor:
        """Aggregate the rows of ``X`` (shape ``[n, d]``) into one vector of shape ``[d]``."""
        X = check_matrix(X)
        self.check_rows(X.shape[0])
        return self._aggregate(X)

    @abstractmethod
    def _aggregate(self, X: Tensor) -> Tensor:
        """The rule itself, on a validated input."""


@dataclass(frozen=True, kw_only=True)
class PreAggregator(ABC):
    """Base class of the maps ``[n, d] -> [n', d]`` applied before an aggregator."""

    @torch.no_grad()
    def __call__(self, X: Tensor) -> Tensor:
        """Transform the rows of ``X`` (shape ``[n, d]``); returns a new ``[n', d]`` tensor."""
        X = check_matrix(X)
        return self._transform(X)

    @abstractmethod
    def _transform(self, X: Tensor) -> Tensor:
        """The map itself, on a validated input."""
