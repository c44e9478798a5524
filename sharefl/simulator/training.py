"""Local training of many clients at once: one ``torch.func`` call per local step.

The model's parameters travel as one flat vector ``w`` of length ``d`` (:class:`FlatModel`).
:class:`VectorizedClients` trains ``K`` clients from the same global ``w`` together: their
parameters are stacked into ``[K, d]`` and a nested ``vmap`` (clients, then examples) of
``grad`` computes every client's per-example gradients in one call, so there is no Python
loop over clients or examples on the hot path. Per step and per client it then

* samples a batch: Poisson with rate ``q = B / n_k`` (every example independently, the
  sampling the accountant analyses; batches are padded to the round's largest and masked)
  or ``B`` examples without replacement (``sampling = "shuffle"``), or the DP filter's loader as
  the authors' code runs it (``sampling = "replay"``: per client, ⌈E/2⌉ batches of ``B``
  drawn with replacement once, ``E = ⌊n_k/B⌋`` steps per epoch; global step ``s`` uses
  batch ``⌊(s mod E)/2⌋``, so every batch comes twice in a row and the same batches come
  back every epoch — for comparing with published numbers only: the accountant's Poisson
  assumption does not hold);
* privatises: applies a :class:`~sharefl.privacy.clipping.ClippingMode` to the
  per-example gradients (flat, per-layer, Fed-αCDP's l2-max or the DP filter's normalisation with
  per-example momentum), sums them, adds ``N(0, σ_t² S²)`` and divides by ``B`` — the same
  arithmetic as :class:`sharefl.privacy.DPSGD`, vectorised over clients; without
  privacy (``clipping=None``) it takes the plain mean gradient of the batch. The adaptive
  modes of :mod:`sharefl.privacy.adaptive_clipping` (Fed-αCDP's Table X baselines) keep
  their state here: quantile clipping one bound C for every client (each step also
  releases every client's noisy centred count of unclipped examples; C takes the geometric
  update once per :meth:`VectorizedClients.train` call, i.e. once per round, from all the
  counts of that call), AdaClip a running mean and variance per client (``[N, d]`` each,
  updated at every local step of that client);
* steps: ``w_k ← w_k − η_c g_k``.

The upload of client ``k`` is a *pseudo-gradient*: the private gradient itself for one
local step (``upload = "gradient"``, the DP filter's protocol), or ``w − w_k`` after the local
steps (``upload = "delta"``, FedAvg). The server always steps ``w ← w − η_s · aggregate``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from sharefl.privacy.adaptive_clipping import (
    AdaClip,
    AdaClipState,
    AdaptiveClipping,
    QuantileClipping,
    QuantileState,
)
from sharefl.privacy.clipping import ClippingMode, Normalization
from sharefl.privacy.noise import standard_normal
from sharefl.privacy.schedules import NoiseSchedule
from sharefl.simulator.errors import SimulatorError
from sharefl.simulator.models import dropout_generator

Sampling = Literal["poisson", "shuffle", "replay"]
SAMPLINGS: tuple[str, ...] = ("poisson", "shuffle", "replay")
Upload = Literal["gradient", "delta"]

#: memory budget of one chunk of per-example gradients (clients are processed in chunks)
CHUNK_BYTES = 256 * 2**20
#: Poisson batches come from Binomial counts once K × n keys reach this many (see sample)
SPARSE_POISSON_KEYS = 2**20
#: examples per forward pass when FlatModel.evaluate runs on CPU
CPU_FORWARD_BATCH = 500


class TrainingError(SimulatorError, ValueError):
    """Inconsistent local-training parameters (what to change is in the message)."""


class FlatModel:
    """A module evaluated from a flat parameter vector (``torch.func.functional_call``).

    Args:
        model: the architecture; its parameters' current values are the initial ``w``.
            Buffers are kept fixed; models with BatchNorm are not supported (per-example
            gradients need example-independent layers).
    """

    def __init__(self, model: nn.Module) -> None:
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            raise TrainingError("BatchNorm couples examples; use GroupNorm or LayerNorm")
        self.module = model
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.names = tuple(n for n, _ in named)
        self.shapes = tuple(p.shape for _, p in named)
        self.numels = tuple(p.numel() for _, p in named)
        self.dim = sum(self.numels)
        self.buffers = dict(model.named_buffers())

    def initial(self) -> Tensor:
        """The model's current parameters as one flat float32 vector ``[d]``."""
        params = dict(self.module.named_parameters())
        return torch.cat([params[n].detach().reshape(-1) for n in self.names]).float()

    def unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        """Views of ``flat`` (shape ``[..., d]``) as a parameter dict (shapes ``[..., *p]``)."""
        lead = flat.shape[:-1]
        parts = torch.split(flat, list(self.numels), dim=-1)
        return {
            n: part.reshape(*lead, *shape)
            for n, part, shape in zip(self.names, parts, self.shapes, strict=True)
        }

    def __call__(self, flat: Tensor, inputs: Tensor) -> Tensor:
        """Outputs of the model with parameters ``flat`` (``[d]``) on a batch ``inputs``."""
        return functional_call(self.module, (self.unflatten(flat), self.buffers), (inputs,))

    @torch.no_grad()
    def evaluate(
        self, flat: Tensor, inputs: Tensor, targets: Tensor, batch_size: int = 2000
    ) -> tuple[float, float]:
        """(accuracy in [0, 1], mean cross-entropy) of ``flat`` on ``(inputs, targets)``,
        the loss summed per ``batch_size`` examples. On CPU the forward pass runs in pieces
        of :data:`CPU_FORWARD_BATCH` examples (the outputs are the same: every example's
        forward pass is its own; a 2,000-example convolution spills the caches and ran
        1.6× slower than four of 500 on a 2-core CPU)."""
        self.module.eval()
        piece = CPU_FORWARD_BATCH if inputs.device.type == "cpu" else batch_size
        correct, loss = 0, 0.0
        for start in range(0, len(targets), batch_size):
            x = inputs[start : start + batch_size]
            y = targets[start : start + batch_size]
            out = torch.cat([self(flat, x[i : i + piece]) for i in range(0, len(x), piece)])
            loss += float(nn.functional.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(1) == y).sum())
        self.module.train()
        n = max(1, len(targets))
        return correct / n, loss / n


@dataclass(frozen=True, kw_only=True)
class LocalTraining:
    """What every client does in one round.

    Attributes:
        batch_size: B, the (expected) batch size of each local step.
        local_steps: L, local steps per round (1 for the DP filter's gradient protocol).
        learning_rate: η_c, the clients' step size (only matters when ``local_steps > 1``
            or ``upload = "delta"``).
        upload: ``"gradient"`` (the private gradient; needs ``local_steps = 1``) or
            ``"delta"`` (``w − w_k`` after the local steps).
        sampling: ``"poisson"``, ``"shuffle"`` or ``"replay"`` (see the module docstring).
        clipping: a clipping mode, an adaptive one (:class:`~sharefl.privacy.
            adaptive_clipping.QuantileClipping`, :class:`~sharefl.privacy.
            adaptive_clipping.AdaClip`), or ``None`` for non-private training (then σ must
            be 0).
        noise: σ, or a schedule σ_t indexed by the global local-step count.
        denominator: what the noisy sum is divided by (default ``batch_size``); the DP filter's
            label-flipping workers use one example but divide by the honest B.
        momentum: μ of local SGD with heavy-ball momentum (SHARE's clients: 0.9), a
            velocity ``v ← μ v + g`` started at zero every round, step ``w_k ← w_k − η_c v``;
            0 is plain SGD. Needs ``upload = "delta"``.
    """

    batch_size: int
    local_steps: int = 1
    learning_rate: float = 0.1
    upload: Upload = "delta"
    sampling: Sampling = "poisson"
    clipping: ClippingMode | AdaptiveClipping | None = None
    noise: float | NoiseSchedule = 0.0
    denominator: float | None = None
    momentum: float = 0.0

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.local_steps < 1:
            raise TrainingError("batch_size and local_steps must be >= 1")
        if not 0 <= self.momentum < 1:
            raise TrainingError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.upload not in ("gradient", "delta"):
            raise TrainingError(f'upload must be "gradient" or "delta", got {self.upload!r}')
        if self.upload == "gradient" and self.local_steps != 1:
            raise TrainingError('upload = "gradient" needs local_steps = 1; use "delta"')
        if self.sampling not in SAMPLINGS:
            raise TrainingError(f"sampling must be one of {SAMPLINGS}, not {self.sampling!r}")
        if self.clipping is None and not isinstance(self.noise, NoiseSchedule) and self.noise:
            raise TrainingError("noise without clipping has unbounded sensitivity: set clipping")
        if not isinstance(self.noise, NoiseSchedule) and not self.noise >= 0:
            raise TrainingError(f"noise multiplier must be >= 0, got {self.noise}")
        if isinstance(self.clipping, QuantileClipping):
            try:  # σ_Δ exists (2σ_b > σ) for the base σ, or the largest σ_t of a schedule
                self.clipping.update_sigma(self.sigma(0))
            except ValueError as exc:
                raise TrainingError(str(exc)) from exc

    def sigma(self, step: int) -> float:
        """σ at global local-step index ``step``."""
        return self.noise(step) if isinstance(self.noise, NoiseSchedule) else float(self.noise)


LabelMap = Callable[[Tensor], Tensor]


class VectorizedClients:
    """Trains any subset of clients from one global model in lock-step (see module doc).

    Args:
        model: the :class:`FlatModel`.
        inputs, targets: the whole training set, on the training device (``[N, ...]``,
            ``[N]``).
        partitions: the training-set indices of every client (client id = list index).
        training: :class:`LocalTraining`.
        label_map: optional map applied to the targets of every batch (label flipping).
        held: a client process's own client: ``inputs``/``targets`` hold its examples
            only (in its partition's order) and the other ``partitions`` give their sizes
            alone, so that its batches are drawn as the whole run draws them from the same
            generator state; training another client raises :class:`TrainingError`.
            ``None``: ``inputs``/``targets`` are the whole training set.
    """

    def __init__(
        self,
        model: FlatModel,
        inputs: Tensor,
        targets: Tensor,
        partitions: Sequence[Sequence[int] | np.ndarray],
        training: LocalTraining,
        *,
        label_map: LabelMap | None = None,
        held: int | None = None,
    ) -> None:
        if not partitions or any(len(p) == 0 for p in partitions):
            raise TrainingError("every client needs at least one training example")
        if held is not None and not (
            0 <= held < len(partitions) and len(partitions[held]) == len(targets)
        ):
            raise TrainingError(
                f"client {held} is not one of the {len(partitions)} partitions, or the "
                f"{len(targets)} examples given are not its own"
            )
        self.model = model
        self.inputs, self.targets = inputs, targets
        self.training = training
        self.label_map = label_map
        self.device = inputs.device
        sizes = [len(p) for p in partitions]
        self.sizes = torch.tensor(sizes, device=self.device)
        padded = torch.zeros(len(partitions), max(sizes), dtype=torch.long)
        if held is None:
            for k, part in enumerate(partitions):
                padded[k, : len(part)] = torch.as_tensor(list(part), dtype=torch.long)
        else:  # its examples are inputs[0 … n − 1]; the other rows are never read
            padded[held, : sizes[held]] = torch.arange(sizes[held])
        self.index = padded.to(self.device)
        self.held = held
        self.steps_done = 0  # global local-step counter (σ_t schedules, replayed batches)
        # adaptive clipping: the bound C (quantile) and its per-round history, or every
        # client's running mean and variance (AdaClip)
        self.quantile: QuantileState | None = None
        self.quantile_history: list[tuple[float, float]] = []  # (C used, b̄) per call
        self.adaclip: AdaClipState | None = None
        mode = training.clipping
        if isinstance(mode, QuantileClipping):
            self.quantile = QuantileState(mode.initial_norm)
        elif isinstance(mode, AdaClip):
            self.adaclip = mode.initial_state(len(partitions), model.dim, device=self.device)
        self._replay: Tensor | None = None  # [clients, ⌈E/2⌉, B] positions ("replay")

        module = model.module

        def example_loss(params: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
            out = functional_call(module, (params, model.buffers), (x.unsqueeze(0),))
            return nn.functional.cross_entropy(out, y.unsqueeze(0))

        def batch_loss(params: dict[str, Tensor], x: Tensor, y: Tensor, w: Tensor) -> Tensor:
            out = functional_call(module, (params, model.buffers), (x,))
            losses = nn.functional.cross_entropy(out, y, reduction="none")
            return (losses * w).sum() / w.sum().clamp_min(1.0)

        # Per-example gradients of a step's sampled examples, packed without padding, from
        # one shared w (first local step) or each from its client's parameters; full
        # batches from diverged clients go through a nested (clients × examples) vmap.
        per_example = vmap(grad(example_loss), in_dims=(None, 0, 0), randomness="different")
        self._per_example_shared = per_example
        self._per_example_own = vmap(grad(example_loss), in_dims=(0, 0, 0), randomness="different")
        self._per_example_nested = vmap(per_example, in_dims=(0, 0, 0), randomness="different")
        self._batch = vmap(grad(batch_loss), in_dims=(0, 0, 0, 0), randomness="different")

    @property
    def num_clients(self) -> int:
        return self.index.shape[0]

    def sample(self, clients: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Batch indices ``[K, b]`` (into the training set) and a 0/1 mask ``[K, b]``."""
        sizes = self.sizes[clients]
        B = self.training.batch_size
        if self.training.sampling == "replay":
            order = self._replayed_batch(clients, generator)
            mask = torch.ones_like(order, dtype=torch.bool)
        elif self.training.sampling == "poisson" and self._sparse(sizes):
            order, mask = self._sparse_poisson(sizes, generator)
        else:
            width = self.index.shape[1]
            keys = torch.rand(len(clients), width, generator=generator, device=self.device)
            valid = torch.arange(width, device=self.device)[None, :] < sizes[:, None]
            if self.training.sampling == "poisson":
                rate = (B / sizes.to(keys.dtype)).clamp_max(1.0)
                chosen = (keys < rate[:, None]) & valid
                b = max(1, int(chosen.sum(1).max()))
                order = torch.argsort((~chosen).to(torch.int8), dim=1, stable=True)[:, :b]
                mask = torch.gather(chosen, 1, order)
            else:
                if int(sizes.min()) < B:
                    raise TrainingError(f"a client holds fewer than batch_size = {B} examples")
                keys = torch.where(valid, keys, 2.0)
                order = torch.topk(keys, B, dim=1, largest=False).indices
                mask = torch.ones_like(order, dtype=torch.bool)
        return self.index[clients[:, None], order], mask

    def _sparse(self, sizes: Tensor) -> bool:
        """Whether Poisson batches are drawn as Binomial counts of distinct positions: for
        large partitions (``K × n`` keys would cost more than the batch) at small rates
        (few expected collisions to reject)."""
        rate = (self.training.batch_size / sizes.double()).clamp_max(1.0)
        keys = len(sizes) * self.index.shape[1]
        return keys >= SPARSE_POISSON_KEYS and float((rate**2 * sizes).max()) <= 0.5

    def _sparse_poisson(self, sizes: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Poisson sampling in O(K·b): client k takes ``c_k ~ Binomial(n_k, B/n_k)`` examples,
        a uniform ``c_k``-subset of its positions (the same law as one coin per example)."""
        rate = (self.training.batch_size / sizes.double()).clamp_max(1.0)
        counts = torch.binomial(sizes.double(), rate, generator=generator).long()
        b = max(1, int(counts.max()))
        live = torch.arange(b, device=self.device)[None, :] < counts[:, None]
        spare = -1 - torch.arange(b, device=self.device)[None, :]  # distinct, never a position
        todo = torch.arange(len(sizes), device=self.device)
        order = torch.empty(len(sizes), b, dtype=torch.long, device=self.device)
        for _ in range(1000):  # rejection: a row is redrawn while its live positions repeat
            u = torch.rand(len(todo), b, generator=generator, device=self.device)
            order[todo] = (u * sizes[todo, None]).long()
            marked = torch.where(live[todo], order[todo], spare).sort(dim=1).values
            todo = todo[(marked[:, 1:] == marked[:, :-1]).any(dim=1)]
            if len(todo) == 0:
                return order, live
        raise TrainingError("Poisson sampling did not find distinct examples; report this")

    def _replayed_batch(self, clients: Tensor, generator: torch.Generator) -> Tensor:
        """Positions ``[K, B]`` into each client's examples for ``sampling = "replay"``; the
        batches of every client are drawn (with replacement) at the first call."""
        B = self.training.batch_size
        epoch = (self.sizes // B).clamp_min(1)  # E_k steps per epoch
        if self._replay is None:
            distinct = int((epoch.max() + 1) // 2)
            u = torch.rand(len(self.sizes), distinct, B, generator=generator, device=self.device)
            self._replay = (u * self.sizes[:, None, None]).long()
        batch = (self.steps_done % epoch[clients]) // 2
        return self._replay[clients, batch]

    def _chunk(self, batch: int) -> int:
        # per example: its gradient, its client's momentum state and (per-client weights)
        # its client's w
        per_client = max(1, batch) * self.model.dim * 4 * 4
        return max(1, CHUNK_BYTES // per_client)

    def train(
        self,
        w: Tensor,
        clients: Sequence[int] | Tensor,
        generator: torch.Generator,
        *,
        momentum: Tensor | None = None,
        sigma: float | None = None,
    ) -> Tensor:
        """Run one round of local training for ``clients`` from the global ``w`` (``[d]``).

        Args:
            momentum: the DP filter's per-client momentum state ``[K, d]`` (the previous upload),
                used and updated in place when the clipping mode is
                :class:`~sharefl.privacy.clipping.Normalization` with β > 0.
            sigma: σ for every step of this round (default: ``training.sigma(step)``).

        Returns:
            The ``[K, d]`` uploads (pseudo-gradients, see the module docstring).

        The model's dropout (:class:`~sharefl.simulator.models.GeneratorDropout`) draws its
        masks from ``generator`` too, so a round depends on nothing but ``generator``'s state.
        """
        with dropout_generator(self.model.module, generator):
            return self._train(w, clients, generator, momentum=momentum, sigma=sigma)

    def _train(
        self,
        w: Tensor,
        clients: Sequence[int] | Tensor,
        generator: torch.Generator,
        *,
        momentum: Tensor | None,
        sigma: float | None,
    ) -> Tensor:
        clients = torch.as_tensor(clients, dtype=torch.long, device=self.device)
        if self.held is not None and bool((clients != self.held).any()):
            raise TrainingError(
                f"this process holds client {self.held}'s examples only, not those of "
                f"clients {sorted(set(clients.tolist()) - {self.held})}"
            )
        K = len(clients)
        params = w.detach().to(self.device).unsqueeze(0).repeat(K, 1)
        adaclip = None
        if self.adaclip is not None:  # the participants' rows, written back at the end
            adaclip = AdaClipState(self.adaclip.mean[clients], self.adaclip.variance[clients])
        last = torch.empty_like(params)
        velocity = torch.zeros_like(params) if self.training.momentum > 0 else None
        for local_step in range(self.training.local_steps):
            rows, mask = self.sample(clients, generator)
            step_sigma = self.training.sigma(self.steps_done) if sigma is None else sigma
            step = self._chunk(rows.shape[1])
            for lo in range(0, K, step):
                hi = min(K, lo + step)
                state = None if momentum is None else momentum[lo:hi]
                adaptive: QuantileState | AdaClipState | None = self.quantile
                if adaclip is not None:
                    adaptive = AdaClipState(adaclip.mean[lo:hi], adaclip.variance[lo:hi])
                last[lo:hi] = self._private_gradient(
                    params[lo:hi],
                    rows[lo:hi],
                    mask[lo:hi],
                    step_sigma,
                    generator,
                    state,
                    shared=local_step == 0,
                    adaptive=adaptive,
                )
            self.steps_done += 1
            if self.training.upload == "delta":
                step_direction = last
                if velocity is not None:  # local heavy-ball momentum (SHARE's clients)
                    step_direction = velocity.mul_(self.training.momentum).add_(last)
                params.sub_(step_direction, alpha=self.training.learning_rate)
        if self.adaclip is not None and adaclip is not None:
            self.adaclip.mean[clients] = adaclip.mean
            self.adaclip.variance[clients] = adaclip.variance
        mode = self.training.clipping
        if self.quantile is not None and isinstance(mode, QuantileClipping) and K:
            used = self.quantile.norm
            fraction = self.quantile.update(mode)  # C ← C·exp(−η_C (b̄ − γ))
            self.quantile_history.append((used, fraction))
        if self.training.upload == "gradient":
            return last
        return w.to(self.device).unsqueeze(0) - params

    def _batch_data(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        x = self.inputs[rows]
        y = self.targets[rows]
        if self.label_map is not None:
            y = self.label_map(y)
        return x, y

    def _private_gradient(
        self,
        params: Tensor,
        rows: Tensor,
        mask: Tensor,
        sigma: float,
        generator: torch.Generator,
        momentum: Tensor | None,
        *,
        shared: bool = False,
        adaptive: QuantileState | AdaClipState | None = None,
    ) -> Tensor:
        """One step's (private) gradient ``[K, d]`` for a chunk of clients (``params``
        ``[K, d]``, equal rows when ``shared``). Per-example gradients are computed only for
        the sampled examples (``mask``), packed, and summed back per client. ``adaptive`` is
        the state of an adaptive clipping mode (AdaClip: the chunk's rows)."""
        mode = self.training.clipping
        if mode is None:
            x, y = self._batch_data(rows)
            grads = self._batch(self.model.unflatten(params), x, y, mask.to(params.dtype))
            return torch.cat([g.reshape(len(params), -1) for g in grads.values()], dim=1)
        K = len(params)
        owner, slot = mask.nonzero(as_tuple=True)  # [M]: the client of each sampled example
        if not len(owner):
            # Poisson sampling gave no client of the chunk an example (likely with few
            # clients at a small rate, e.g. one expected example each): every clipped sum is
            # 0, and the noise below is still added, as for one empty batch among others
            per_example = {
                n: params.new_zeros(0, k)
                for n, k in zip(self.model.names, self.model.numels, strict=True)
            }
        elif shared:
            x, y = self._batch_data(rows[owner, slot])
            per_example = self._per_example_shared(self.model.unflatten(params[0]), x, y)
        elif bool(mask.all()):  # owner = 0…0, 1…1, …: the nested order, no gather of w
            x, y = self._batch_data(rows)
            per_example = self._per_example_nested(self.model.unflatten(params), x, y)
        else:
            x, y = self._batch_data(rows[owner, slot])
            per_example = self._per_example_own(self.model.unflatten(params[owner]), x, y)
        layers = [
            per_example[n].reshape(len(owner), k)  # k, not -1: M may be 0
            for n, k in zip(self.model.names, self.model.numels, strict=True)
        ]
        if isinstance(mode, QuantileClipping):
            assert isinstance(adaptive, QuantileState), "quantile clipping without its state"
            return self._quantile_gradient(mode, adaptive, layers, owner, K, sigma, generator)
        if isinstance(mode, AdaClip):
            assert isinstance(adaptive, AdaClipState), "AdaClip without its state"
            return self._adaclip_gradient(mode, adaptive, layers, owner, K, sigma, generator)
        assert isinstance(mode, ClippingMode)
        if isinstance(mode, Normalization) and mode.momentum > 0 and momentum is not None:
            beta = mode.momentum
            state = torch.split(momentum.index_select(0, owner), list(self.model.numels), dim=1)
            for g, m in zip(layers, state, strict=True):
                g.mul_(1 - beta).add_(m, alpha=beta)
        norms = torch.stack([torch.linalg.vector_norm(g, dim=1) for g in layers])  # [L, M]
        factors = mode.factors(norms)  # [L, M] or [1, M]
        summed = _sum_per_client(factors, layers, owner, K)
        if mode.data_dependent:
            raw = torch.full((K,), -math.inf, dtype=norms.dtype, device=norms.device)
            raw.scatter_reduce_(0, owner, norms.amax(dim=0), reduce="amax")
            sens = torch.tensor(
                [
                    mode.batch_sensitivity(v if math.isfinite(v) else math.nan, self.model.numels)
                    for v in raw.tolist()
                ],
                dtype=summed.dtype,
                device=summed.device,
            )
        else:
            sens = torch.full(
                (K,), mode.sensitivity(self.model.numels), dtype=summed.dtype, device=summed.device
            )
        if sigma > 0:
            # torch.randn, or a deployment client's AES-CTR stream (SecureGenerator)
            noise = standard_normal(summed.shape, generator, device=summed.device)
            summed.add_(noise * (sigma * sens)[:, None])
        summed.div_(self.training.denominator or self.training.batch_size)
        if momentum is not None and isinstance(mode, Normalization):
            momentum.copy_(summed)  # the DP filter's Alg. 1: the state is the last noisy upload
        return summed

    def _denominator(self) -> float:
        return self.training.denominator or self.training.batch_size

    def _quantile_gradient(
        self,
        mode: QuantileClipping,
        state: QuantileState,
        layers: list[Tensor],
        owner: Tensor,
        K: int,
        sigma: float,
        generator: torch.Generator,
    ) -> Tensor:
        """Quantile clipping (Andrew et al.): every example's whole gradient clipped to the
        current C, the sum noised with σ_Δ·C (σ_Δ from σ and σ_b, so that the release is
        accounted at σ), and every client's centred count Σ(b − ½) of unclipped examples
        released with N(0, σ_b²) into ``state`` (m = B expected examples per client)."""
        norms = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g, dim=1) for g in layers]), dim=0
        )  # [M] whole-gradient norms
        bound = torch.tensor(state.norm, dtype=norms.dtype, device=norms.device)
        summed = _sum_per_client(mode.factors(norms, bound)[None, :], layers, owner, K)
        counts = norms.new_zeros(K).index_add_(0, owner, mode.centred_bits(norms, bound))
        if sigma > 0:
            noise = standard_normal(summed.shape, generator, device=summed.device)
            summed.add_(noise.to(summed.dtype), alpha=mode.update_sigma(sigma) * state.norm)
        mode.noisy_counts_(counts, generator, private=sigma > 0)
        state.add(float(counts.sum()), K * self.training.batch_size)
        return summed.div_(self._denominator())

    def _adaclip_gradient(
        self,
        mode: AdaClip,
        state: AdaClipState,
        layers: list[Tensor],
        owner: Tensor,
        K: int,
        sigma: float,
        generator: torch.Generator,
    ) -> Tensor:
        """AdaClip (Pichapati et al.): every example's gradient transformed to
        w = (g − m)/b with its client's running mean m and scale b, clipped to C, summed
        with N(0, σ²C²), divided by B and mapped back (b ⊙ · + m); the client's estimates
        are then updated in place (``state`` holds the chunk's rows)."""
        scale = mode.scale(state.variance)  # [K, d]
        numels = list(self.model.numels)
        means = torch.split(state.mean.index_select(0, owner), numels, dim=1)
        scales = torch.split(scale.index_select(0, owner), numels, dim=1)
        for g, m, b in zip(layers, means, scales, strict=True):
            g.sub_(m).div_(b)
        norms = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g, dim=1) for g in layers]), dim=0
        )
        factors = (mode.max_norm / norms.clamp_min(1e-30)).clamp_max(1.0)
        summed = _sum_per_client(factors[None, :], layers, owner, K)
        return mode.release(summed, state, scale, sigma, self._denominator(), generator)

    def adaptive_summary(self) -> dict[str, object] | None:
        """What the adaptive clipping mode did (``None`` for the other modes): quantile
        clipping's C and unclipped fraction b̄ at every round."""
        mode = self.training.clipping
        if isinstance(mode, QuantileClipping):
            return {
                "mode": "quantile",
                "count_std": mode.count_std,
                "target_quantile": mode.target_quantile,
                "learning_rate": mode.learning_rate,
                "clip_norm": [round(c, 6) for c, _ in self.quantile_history],
                "unclipped_fraction": [round(b, 6) for _, b in self.quantile_history],
            }
        if isinstance(mode, AdaClip):
            return {
                "mode": "adaclip",
                "max_norm": mode.max_norm,
                "beta1": mode.beta1,
                "beta2": mode.beta2,
                "h1": mode.h1,
                "h2": mode.h2,
            }
        return None


def _sum_per_client(factors: Tensor, layers: list[Tensor], owner: Tensor, K: int) -> Tensor:
    """Σ over each client's examples of factor · gradient (``factors`` ``[L, M]`` or
    ``[1, M]``, ``layers`` ``[M, n_l]``), as one ``[K, M] × [M, n_l]`` product per layer (the
    weights matrix holds each example's factor in its client's row)."""
    weights = factors.new_zeros(factors.shape[0], K, len(owner))
    weights[:, owner, torch.arange(len(owner), device=owner.device)] = factors
    return torch.cat(
        [weights[i if len(weights) > 1 else 0] @ g for i, g in enumerate(layers)], dim=1
    )


def sample_rate(batch_size: int, examples: int) -> float:
    """q = B / n, capped at 1 (Poisson sampling rate of a client with ``n`` examples)."""
    if examples < 1:
        raise TrainingError("a client needs at least one example")
    return min(1.0, batch_size / examples)
