"""What every transport does around the protocol's drive loop, written once (numpy only).

- :mod:`~sharefl.rounds.model_plans`: plan reuse per model (one model, one plan), with the
  journal's hooks; the gRPC server and the Flower workflow build their coordinators here.
- :mod:`~sharefl.rounds.released`: a round's released cluster sums, in the one shape every
  server step takes (the simulator's federated round, the deployment strategies, Flower).
- :mod:`~sharefl.rounds.round_seed`: the round's public seed.
- :mod:`~sharefl.rounds.keyfiles`: the one checked reader of ``sharefl keygen``'s files.
- :mod:`~sharefl.rounds.model_step`: the model step ``w ← w − η·v``.
- :mod:`~sharefl.rounds.updates`: the weighted update codec (arrays ↔ one clipped vector).

It sits between :mod:`sharefl.protocol` and the transports (``deploy``, ``integrations``,
the simulator): it imports the protocol, never a transport, torch or an accounting stack.
"""

from sharefl.rounds.model_plans import ModelPlan, ModelPlans
from sharefl.rounds.released import Released

__all__ = ["ModelPlan", "ModelPlans", "Released"]
