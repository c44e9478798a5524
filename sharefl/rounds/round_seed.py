"""The round's public seed: 48 bytes both sides of a round derive from what they both hold.

Ring inputs (:mod:`sharefl.privacy`) rotate each update with it before they encode it. It
is public: a server that grinds models or round names to pick it changes no client's
privacy (the rotation is orthogonal, and the clip and the rounding bound are checked after
it), only how evenly a vector spreads over the coordinates.
"""

from __future__ import annotations

import hashlib

ROUND_SEED_TAG = b"sharefl/round-seed/v1"
ROUND_SEED_BYTES = 48


def public_round_seed(binding: bytes, model_digest: bytes) -> bytes:
    """The round's seed (:data:`ROUND_SEED_BYTES` bytes) from ``binding``, the bytes that
    name the round on its transport (the gRPC run id and round number, or Flower's plan
    digest), and ``model_digest``, the :func:`~sharefl.protocol.memory.model_digest` of
    the model the clients received."""
    h = hashlib.sha512(ROUND_SEED_TAG)
    h.update(binding)
    h.update(model_digest)
    return h.digest()[:ROUND_SEED_BYTES]
