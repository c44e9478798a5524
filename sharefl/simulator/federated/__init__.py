"""The federated loop (``[algorithm] name = "federated"``) and what only it uses.

- :mod:`.loop` — :class:`~.loop.Simulation`, one run's rounds: local training, the
  Byzantine uploads, aggregation, the server step, evaluation; its one server round
  (:meth:`~.loop.Simulation.server_round`) is also what a deployment's server runs on the
  sums its protocol released (:mod:`.released`);
- :mod:`.populations` — the honest clients (vectorised local training) and the Byzantine
  ones (what the attack makes them upload);
- :mod:`.attacks` — the Byzantine attacks on uploads, by name (:data:`~.attacks.ATTACKS`,
  :func:`~.attacks.build_attack`);
- :mod:`.server` — the rule, the step, evaluation and the accountant;
- :mod:`.share` — SHARE (Velicheti et al.): secure aggregation in clusters under the rule;
  :mod:`.clustering_schedule` — which clusters each round uses; :mod:`.cluster_zeno` —
  Zeno++ over the cluster sums.
"""
