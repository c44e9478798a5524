"""Weighted multi-tensor updates as one vector for secure aggregation, and back.

FedAvg averages each client's tensors weighted by its number of examples ``n_i``. A secure
sum adds vectors, so a client uploads one float vector that carries both its weighted
update and its weight::

    v_i = [ w_i · clip_c(x_i) (all tensors, flattened in order),  c · w_i ]
    w_i = n_i / max_weight ∈ (0, 1],   c = the per-coordinate clip

Every coordinate stays within [-c, c], the bound the ring encoding is chosen for
(:class:`~sharefl.crypto.encoding.RingEncoding`). The sum of the v_i over any set of
clients (a cluster, all clusters) gives the weighted mean of their tensors and their total
weight (:meth:`WeightedUpdateCodec.decode_sum`). Sans-IO; numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sharefl.protocol.errors import ConfigurationError


class UpdateError(ConfigurationError):
    """An update does not fit the codec: other shapes, a non-finite value, a weight outside
    (0, max_weight], or a sum whose total weight is not positive."""


@dataclass(frozen=True)
class WeightedUpdateCodec:
    """Encodes ``(tensors, weight)`` into one float64 vector and decodes sums of them.

    Attributes:
        shapes: the tensors' shapes, in order.
        clip: per-coordinate bound c of the tensors (> 0): values are clipped to [-c, c].
        max_weight: the largest weight a client may give (> 0); weights are divided by it.

    Raises :class:`UpdateError` for a non-positive clip or max_weight.
    """

    shapes: tuple[tuple[int, ...], ...]
    clip: float
    max_weight: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "shapes", tuple(tuple(int(n) for n in s) for s in self.shapes))
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise UpdateError(f"clip must be a finite number > 0, got {self.clip}")
        if not (math.isfinite(self.max_weight) and self.max_weight > 0):
            raise UpdateError(f"max_weight must be a finite number > 0, got {self.max_weight}")

    @classmethod
    def like(
        cls, arrays: Sequence[np.ndarray], clip: float, max_weight: float = 1.0
    ) -> WeightedUpdateCodec:
        """A codec for tensors shaped like ``arrays``."""
        return cls(tuple(np.shape(a) for a in arrays), clip, max_weight)

    @property
    def size(self) -> int:
        """d, the number of tensor coordinates."""
        return sum(math.prod(s) for s in self.shapes)

    @property
    def length(self) -> int:
        """d + 1: the length of an encoded vector (the weight is the last coordinate)."""
        return self.size + 1

    def encode(self, arrays: Sequence[np.ndarray], weight: float) -> np.ndarray:
        """The float64 vector of ``arrays`` weighted by ``weight``.

        Raises :class:`UpdateError` for other shapes, non-finite values, or a weight
        outside (0, max_weight] (raise max_weight, or cap the weight).
        """
        if len(arrays) != len(self.shapes) or any(
            np.shape(a) != s for a, s in zip(arrays, self.shapes, strict=True)
        ):
            raise UpdateError(
                f"the update's shapes {[np.shape(a) for a in arrays]} differ from the "
                f"model's {list(self.shapes)}"
            )
        if not (math.isfinite(weight) and 0 < weight <= self.max_weight):
            raise UpdateError(
                f"weight {weight} is outside (0, max_weight = {self.max_weight}]: raise "
                "max_weight to the largest number of examples a client may have"
            )
        w = weight / self.max_weight
        out = np.empty(self.length, dtype=np.float64)
        start = 0
        for a in arrays:
            flat = np.asarray(a, dtype=np.float64).reshape(-1)
            if not np.isfinite(flat).all():
                raise UpdateError("the update has non-finite values")
            view = out[start : start + flat.size]
            np.clip(flat, -self.clip, self.clip, out=view)
            view *= w
            start += flat.size
        out[-1] = self.clip * w
        return out

    def split(self, vector: np.ndarray) -> list[np.ndarray]:
        """The tensor part of a vector (length d + 1, or d: the tensors alone), reshaped,
        as float64. Raises :class:`UpdateError` for another length."""
        vector = np.asarray(vector, dtype=np.float64)
        if vector.shape not in ((self.length,), (self.size,)):
            raise UpdateError(f"expected a vector of length {self.length}, got {vector.shape}")
        arrays, start = [], 0
        for shape in self.shapes:
            n = math.prod(shape)
            arrays.append(vector[start : start + n].reshape(shape).copy())
            start += n
        return arrays

    def total_weight(self, total: np.ndarray) -> float:
        """Σ n_i of the clients a summed vector covers (in the weights' own unit)."""
        return float(np.asarray(total)[-1]) * self.max_weight / self.clip

    def cluster_means(self, sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For ``[c, d + 1]`` sums (one per cluster): the ``[c, d]`` weighted means of each
        cluster's tensors (flat) and the ``[c]`` total weights. A row whose weight is not
        positive (only a Byzantine client can cause it) gets weight 0 and mean 0."""
        sums = np.asarray(sums, dtype=np.float64)
        if sums.ndim != 2 or sums.shape[1] != self.length:
            raise UpdateError(f"expected [c, {self.length}] sums, got {sums.shape}")
        weights = sums[:, -1] * (self.max_weight / self.clip)
        ok = weights > 0
        means = np.zeros((sums.shape[0], self.size))
        means[ok] = sums[ok, :-1] * (self.max_weight / weights[ok])[:, None]
        return means, np.where(ok, weights, 0.0)

    def decode_sum(self, total: np.ndarray) -> tuple[list[np.ndarray], float]:
        """The weighted mean of the tensors that ``total`` (a sum of encoded vectors, e.g. a
        decoded cluster sum) adds up, and their total weight Σ n_i.

        Raises :class:`UpdateError` when the total weight is not positive.
        """
        weight = self.total_weight(total)
        if not weight > 0:
            raise UpdateError(f"the sum's total weight is {weight}; nothing to average")
        scale = self.clip / float(np.asarray(total)[-1])
        return [a * scale for a in self.split(total)], weight
