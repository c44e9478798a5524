"""A finished run's model as plain arrays: what ``model.npz`` / ``model.json`` hold.

Every loop trains a flat parameter vector ``[d]`` evaluated through one ``nn.Module``
(:class:`~sharefl.simulator.training.FlatModel`); :class:`FinalModel` turns that vector back
into the module's ``state_dict`` (one array per entry, keyed by its name, in the dtype the
loop trains in), so a user can load it without the simulator::

    meta = json.load(open("model.json"))
    model = build_model(meta["model"], num_classes=meta["num_classes"],
                        input_shape=meta["input_shape"], **meta["options"])
    model = model.to(getattr(torch, meta["dtype"]))
    model.load_state_dict({k: torch.from_numpy(v) for k, v in np.load("model.npz").items()})

Contract of :meth:`FinalModel.from_flat`: for every trainable parameter ``p`` of the module
(``FlatModel.names``), ``state[p]`` is the slice of the flat vector that
``FlatModel.unflatten`` gives it, so the loaded module's logits equal
``FlatModel(flat, inputs)``; the other entries (buffers, frozen parameters) are the module's
own values, which the loops never change. The arrays are copies: later steps of the loop do
not alter them.

The decentralized loop's record is x̄ (the mean of the honest agents' models, the model
every evaluation reports); its agents' models travel in :attr:`FinalModel.agents` (each
entry stacked ``[R, *shape]``) and are written to a separate ``agents.npz``, so
``model.npz`` stays loadable with ``strict=True``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor

    from sharefl.simulator.training import FlatModel

MODEL_FORMAT = 1
"""Version of ``model.json``'s layout (raised when a key changes meaning)."""


@dataclass(frozen=True)
class FinalModel:
    """A trained model as arrays plus what rebuilds its module.

    Attributes:
        loop: the ``[algorithm] name`` that trained it (``federated``, ``dp_rsa``,
            ``decentralized``).
        describes: which model of the loop this is (e.g. ``"global model w"``).
        model: the registered model name (:data:`~sharefl.simulator.models.MODELS`, aliases
            resolved).
        options: the model's options (``model.options``), JSON values.
        input_shape: the shape of one example (e.g. ``(1, 28, 28)``).
        num_classes: the number of logits.
        init_seed: ``model.init_seed``, the initialisation the run started from.
        round: rounds (iterations) finished when the model was taken.
        state: the module's ``state_dict`` as numpy arrays, in its order.
        agents: per-agent parameters, each stacked ``[R, *shape]`` (decentralized), else
            ``None``.
    """

    loop: str
    describes: str
    model: str
    options: Mapping[str, Any]
    input_shape: tuple[int, ...]
    num_classes: int
    init_seed: int
    round: int
    state: Mapping[str, np.ndarray]
    agents: Mapping[str, np.ndarray] | None = field(default=None)

    @property
    def dtype(self) -> str:
        """The numpy name of the floating dtype of the parameters (``"float32"``, …)."""
        floats = [a.dtype for a in self.state.values() if np.issubdtype(a.dtype, np.floating)]
        return str(floats[0]) if floats else "float32"

    def metadata(self) -> dict[str, Any]:
        """The ``model.json`` object (JSON values only)."""
        return {
            "format": MODEL_FORMAT,
            "loop": self.loop,
            "describes": self.describes,
            "model": self.model,
            "options": dict(self.options),
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "init_seed": self.init_seed,
            "dtype": self.dtype,
            "round": self.round,
            "parameters": [
                {"name": k, "shape": list(v.shape), "dtype": str(v.dtype)}
                for k, v in self.state.items()
            ],
            "agents": None if self.agents is None else _agent_count(self.agents),
        }

    @classmethod
    def from_flat(
        cls,
        flat_model: FlatModel,
        flat: Tensor,
        *,
        loop: str,
        describes: str,
        run: Any,
        input_shape: tuple[int, ...],
        num_classes: int,
        round: int,
        agents: Tensor | None = None,
    ) -> FinalModel:
        """The model whose trainable parameters are ``flat`` ``[d]`` (``agents``: ``[R, d]``)
        for ``flat_model``'s module; ``run`` is the :class:`~sharefl.simulator.config.
        RunConfig` (its ``model`` section names and configures the module).

        Raises:
            ValueError: ``flat`` is not ``[d]`` or ``agents`` not ``[R, d]``.
        """
        from sharefl.simulator.names import model_name

        if tuple(flat.shape) != (flat_model.dim,):
            raise ValueError(f"flat model must be [{flat_model.dim}], got {tuple(flat.shape)}")
        state = {
            k: v.detach().cpu().numpy().copy() for k, v in flat_model.module.state_dict().items()
        }
        for name, value in flat_model.unflatten(flat.detach()).items():
            state[name] = value.cpu().numpy().copy()
        stacked = None
        if agents is not None:
            if agents.ndim != 2 or agents.shape[1] != flat_model.dim:
                raise ValueError(f"agents must be [R, {flat_model.dim}], got {tuple(agents.shape)}")
            stacked = {
                k: v.cpu().numpy().copy() for k, v in flat_model.unflatten(agents.detach()).items()
            }
        return cls(
            loop=loop,
            describes=describes,
            model=model_name(run.model.name),
            options=_json_options(run.model.options),
            input_shape=tuple(int(s) for s in input_shape),
            num_classes=int(num_classes),
            init_seed=int(run.model.init_seed),
            round=int(round),
            state=state,
            agents=stacked,
        )


def _agent_count(agents: Mapping[str, np.ndarray]) -> int:
    return int(next(iter(agents.values())).shape[0]) if agents else 0


def _json_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with tuples as lists (what ``json`` writes and reads back)."""

    def plain(value: Any) -> Any:
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        return value

    return {str(k): plain(v) for k, v in options.items()}
