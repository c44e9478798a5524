"""Simulation of federated runs on real data, in one process or across processes.

Laid out by loop (``[algorithm] name``); each loop's folder holds its loop, attacks and
what only it uses:

* :mod:`~sharefl.simulator.federated` — the federated loop
  (:class:`~sharefl.simulator.federated.loop.Simulation`), its populations, attacks and
  server, and SHARE (Velicheti et al.);
* :mod:`~sharefl.simulator.dp_rsa` — the DP-RSA loop (Zhu and Ling) and its attacks;
* :mod:`~sharefl.simulator.decentralized` — decentralized learning (Ye, Zhu and Ling);
* :mod:`~sharefl.simulator.leakage` — gradient-leakage attacks (DLG, iDLG, CPL; Fed-αCDP).

The parts every loop shares, from the data up:

* :mod:`~sharefl.simulator.datasets` — MNIST, Fashion-MNIST, CIFAR-10, USPS, LFW loaders
  (standard files, no torchvision) and synthetic data;
* :mod:`~sharefl.simulator.partition` — iid, Dirichlet, k-labels shards and the papers'
  own splits;
* :mod:`~sharefl.simulator.models` — the papers' models and a registry;
  :mod:`~sharefl.simulator.names` — their names and codename aliases (papers:
  :mod:`sharefl.papers`);
* :mod:`~sharefl.simulator.training`, :mod:`~sharefl.simulator.worker_models` — many
  clients or workers trained at once (``torch.func``), plain, DP-SGD or the DP filter's
  normalised DP-SGD;
* :mod:`~sharefl.simulator.config`, :mod:`~sharefl.simulator.components` — the TOML
  schema and what it builds; :mod:`~sharefl.simulator.loop_keys` — the keys each loop reads;
* :mod:`~sharefl.simulator.setup` (every loop's device and data),
  :mod:`~sharefl.simulator.stepped` (the round clock and evaluation),
  :mod:`~sharefl.simulator.results` and :mod:`~sharefl.simulator.final_model` (the results
  format), :mod:`~sharefl.simulator.checkpoint` (resume);
* :mod:`~sharefl.simulator.report` — tables and plots.

Above the loops, importing every loop's folder: :mod:`~sharefl.simulator.loops` (the
loops by name, imported statically), :mod:`~sharefl.simulator.preflight` (what is checked
before any data loads, each loop's own check included) and
:mod:`~sharefl.simulator.runner` (grids of runs). An import contract in ``pyproject.toml``
keeps this layout: the loop folders import none of each other, the shared parts none of
them. :mod:`~sharefl.simulation_bridge` runs a federated file over gRPC
(``sharefl launch``).
"""
