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
* :mod:`~sharefl.simulator.names` — the model and partition names and their codename
  aliases (papers: :mod:`sharefl.papers`);
* the parts loops share: :mod:`~sharefl.simulator.setup` (data, partitions, model,
  privacy plan — pure), :mod:`~sharefl.simulator.populations` (honest and Byzantine
  clients), :mod:`~sharefl.simulator.server` (rule, step, evaluation, accountant),
  :mod:`~sharefl.simulator.stepped` (the round loop), :mod:`~sharefl.simulator.results`
  (the results format: writer and reader);
* :mod:`~sharefl.simulator.engine` — one run's federated loop
  (:class:`~sharefl.simulator.engine.Simulation`, a composition of the parts);
  :mod:`~sharefl.simulator.rsa_loop` — the DP-RSA loop; :mod:`~sharefl.simulator.loops`
  picks one;
* :mod:`~sharefl.simulator.runner`, :mod:`~sharefl.simulator.report` — grids of runs,
  tables and plots;
* :mod:`~sharefl.simulation_bridge` — the same run over gRPC (``sharefl launch``).
"""
