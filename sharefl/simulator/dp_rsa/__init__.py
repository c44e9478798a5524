"""The DP-RSA loop (Zhu and Ling, ``[algorithm] name = "dp_rsa"``) and its attacks.

- :mod:`.loop` — :class:`~.loop.RSALoop`: per-worker models, the sign messages with their
  privacy mechanism, and the gradient baselines;
- :mod:`.attacks` — the attacks of the paper's figures on sign messages and on the
  baselines' gradients (:data:`~.attacks.ATTACKS`, :func:`~.attacks.build_attack`).
"""
