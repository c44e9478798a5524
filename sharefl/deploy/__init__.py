"""The gRPC deployment of the secure layer: real server and client processes.

- :mod:`~sharefl.deploy.config` — the deployment TOML file (:class:`DeploymentConfig`);
- :mod:`~sharefl.deploy.wire` — the one conversion between protobuf and the protocol's
  typed messages, with every size and range checked before use;
- :mod:`~sharefl.deploy.server` — the aggregation server: authenticated streams feeding the
  transport-neutral :class:`~sharefl.protocol.coordinator.RoundCoordinator`;
- :mod:`~sharefl.deploy.client` — a client process running the sans-IO
  :class:`~sharefl.protocol.client.ClientSession`;
- :mod:`~sharefl.deploy.keygen` — TLS certificates and Ed25519 identities for a deployment;
- :mod:`~sharefl.deploy.errors` — :class:`DeployError`, the base of the transport's own errors.

This package imports :mod:`sharefl.protocol` and :mod:`sharefl.crypto`, never the simulator.
"""
