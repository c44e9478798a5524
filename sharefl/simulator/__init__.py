"""Simulation of federated runs on real data, in one process or across processes.

Modules, from the data up:

* :mod:`~sharefl.simulator.datasets` — MNIST, Fashion-MNIST, CIFAR-10, USPS, LFW loaders
  (standard files, no torchvision) and synthetic data;
* :mod:`~sharefl.simulator.partition` — iid, Dirichlet, k-labels shards and the papers'
  own splits;
* :mod:`~sharefl.simulator.models` — the papers' models and a registry;
* :mod:`~sharefl.simulator.training` — many clients trained at once (``torch.func``),
  plain, DP-SGD or seed000's normalised DP-SGD;
* :mod:`~sharefl.simulator.attacks` — the Byzantine attacks of the five papers;
* :mod:`~sharefl.simulator.leakage` — gradient-leakage attacks (DLG, iDLG, CPL);
* :mod:`~sharefl.simulator.config`, :mod:`~sharefl.simulator.components` — the TOML
  schema and what it builds;
* :mod:`~sharefl.simulator.engine` — one run's federated loop
  (:class:`~sharefl.simulator.engine.Simulation`);
* :mod:`~sharefl.simulator.runner`, :mod:`~sharefl.simulator.report` — grids of runs,
  their results, tables and plots;
* :mod:`~sharefl.simulation_bridge` — the same run over gRPC (``sharefl launch``).
"""
