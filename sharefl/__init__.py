"""sharefl: private and Byzantine-robust federated learning.

Subpackages (arrows point one way: ``crypto`` ← ``protocol`` ← ``simulator``/CLI;
``robust`` and ``privacy`` depend on neither ``protocol`` nor ``simulator``):

- :mod:`sharefl.crypto` — key agreement, KDF, AEAD, signatures, PRG masks, Shamir, ring encoding.
- :mod:`sharefl.protocol` — sans-IO secure-aggregation state machines and drivers.
- :mod:`sharefl.proto` — wire formats (protobuf/gRPC).
- :mod:`sharefl.robust` — Byzantine-robust aggregators.
- :mod:`sharefl.privacy` — differential privacy for clients and its accounting.
- :mod:`sharefl.simulator` — datasets, models, attacks, training loops.
"""

__version__ = "0.1.0"
