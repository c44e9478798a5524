"""The DP-RSA loop of Zhu and Ling: a model per worker, a master model moved by
the *sum of signs*, and the paper's baselines.

State: the master model ``x_0`` ``[d]`` and the r regular workers' models ``x_k``, stacked
``[r, d]`` (flat parameters of the run's model). One iteration t of the RSA family
(``method`` = ``rsa``, ``dp_rsa_f``, ``dp_rsa_g``), vectorised over workers:

    u_k = x_0 − x_k                                   (x_k before its local step)
    s_k = F/G(sign(u_k))  (sign(u_k) for plain RSA)   the message worker k sends
    g_k = ∇f_k(x_k; one batch of worker k)            (one vmap(grad) call, all workers)
    x_k ← x_k − α (g_k − λ s_k)                       eq. 5 with the *sent* sign
    x_0 ← x_0 − α (∇f_0(x_0) + λ (Σ_k s_k + Σ_j b_j)),  f_0 = 0.002‖x‖²   eq. 11

with b_j the Byzantine messages (:mod:`sharefl.simulator.dp_rsa.attacks`); the steps are
:func:`~sharefl.robust.rsa.rsa_worker_step` and :class:`~sharefl.robust.rsa.RSAMaster`.
``sign`` is the paper's (sign(0) = +1, :func:`~sharefl.sign.rsa_sign`). With
``secure_aggregation.cluster_size >= 2`` the master receives Σ s + Σ b only, from
:func:`~sharefl.protocol.driver.secure_sum` over the K = r + b workers' messages as ring
vectors (±1 mod 2^bits, summed exactly, one reclustering's cluster sums added), with every
key of ``[secure_aggregation]`` as parsed (:func:`secure_sign_sum`); its seed comes from a
separate generator, so the trajectory is bit-identical in the clear.

The choices of the note's §6, as this loop makes them (``[dp_rsa]`` keys in brackets):

1. the worker steps with the sign it *sent* (analysis and code) [worker_sign = "sent";
   "true" gives eq. 5];
2. sign(0) = +1, the paper's (the code's torch.sign gives 0);
3. x_k^0 = x_0^0, the model at ``model.init_seed`` [init = "same"]. The MNIST code's
   independent initialisations per worker [init = "independent"] were measured here not
   to reach consensus: DP-RSA(F) at ε = 0.4 under the Gaussian attack kept x_0 at 8.9%
   accuracy after 2,500 of 5,000 iterations, mean ‖x_k − x_0‖₂ stuck at ~6 (permuted
   hidden units have no useful coordinate-wise median); "perturbed" is the CIFAR-10 code's
   x_0 + 0.01(U − 0.5);
4. Sign-Gaussian's σ: per coordinate, σ_i just above max(2|u_i|/3, 4Δu/ε) with |u_i|
   [sigma_rule = "coordinate"; "scalar" is Theorem 2's one σ per worker, "code" the
   signed u_i], Δu = 2αM with the code's M = 0.01 [grad_bound], not enforced unless
   clip_gradients (the code does not clip);
5. ε is nominal, per round and per coordinate (Theorems 1, 2); the composed ε over the run
   (:mod:`sharefl.privacy.sign_accounting`) is per coordinate too, at ``dp_rsa.delta``;
6. K includes the Byzantine workers; the data are split over all K and the regular
   workers use shards 0 … r − 1 (the code; the last b shards go unused);
7. the attacks as the table of :mod:`sharefl.simulator.dp_rsa.attacks` (Gaussian vector shared
   by the Byzantine workers; sign-flipping's "true model" = x_0; sample-duplicating copies
   regular worker 0's raw sign);
8. baselines on one shared model x, all workers' gradients at x: ``sgd`` steps with the
   mean, ``signsgd`` with the *mean* of the element-wise signs (the code's commented
   line), ``sgd_gm`` with the geometric median (smoothed Weiszfeld from
   :class:`~sharefl.robust.GeometricMedian`, at most 80 iterations, relative tolerance
   1e-5; the code starts from the mean and uses an absolute one), no f_0 unless
   baseline_regularization;
9. batches: each worker walks its own shuffled shard (B per step, all redrawn when one runs
   out: :class:`~sharefl.simulator.worker_models.EpochSampler`).

Evaluation (every ``eval_every`` iterations and at the end): accuracy and loss of x_0 (the
shared x for baselines) on the test set; RSA runs also log ``disagreement`` = mean_k
‖x_k − x_0‖₂.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from sharefl.privacy.sign import SignFlip, SignGaussian, rsa_sensitivity
from sharefl.privacy.sign_accounting import composed_epsilon
from sharefl.protocol.driver import secure_sum
from sharefl.robust import GeometricMedian, RSAMaster, rsa_sign, rsa_worker_step
from sharefl.simulator.config import RunConfig, SecureAggregationConfig, SimulationConfigError
from sharefl.simulator.datasets import Dataset
from sharefl.simulator.dp_rsa.attacks import build_attack
from sharefl.simulator.final_model import FinalModel
from sharefl.simulator.models import build_model
from sharefl.simulator.partition import partition
from sharefl.simulator.results import RoundRecord
from sharefl.simulator.stepped import SteppedLoop
from sharefl.simulator.training import FlatModel
from sharefl.simulator.worker_models import EpochSampler, WorkerGradients

RSA_FAMILY = ("rsa", "dp_rsa_f", "dp_rsa_g")
RING = 2**32
"""The default ring Z_2^32 of the sign sums (``secure_aggregation.bits``)."""
_DTYPES = {32: np.uint32, 64: np.uint64}


def ring_signs(messages: Tensor, bits: int = 32) -> dict[int, np.ndarray]:
    """Worker index → its ±1 message as a ring vector of Z_2^bits (uint32 or uint64;
    −1 ↦ 2^bits − 1)."""
    signs = messages.detach().to(torch.int64).cpu().numpy()
    ring = signs.astype(_DTYPES[bits])  # two's complement: -1 wraps to 2^bits - 1
    return {k: ring[k] for k in range(len(ring))}


def signed_ring_sum(sums: list[np.ndarray], bits: int = 32) -> np.ndarray:
    """Σ of ring sums of Z_2^bits (wrapping), read as signed integers in
    [−2^(bits−1), 2^(bits−1)) (int64)."""
    total = np.zeros_like(sums[0], dtype=_DTYPES[bits])
    for s in sums:
        total += s.astype(_DTYPES[bits])  # unsigned arithmetic wraps modulo 2^bits
    return total.view(np.int32 if bits == 32 else np.int64).astype(np.int64)


def secure_sign_sum(
    messages: Tensor, settings: SecureAggregationConfig, seed: int, round: int
) -> Tensor:
    """Σ_k messages[k] ``[d]`` of the ``[K, d]`` ±1 messages through
    :func:`~sharefl.protocol.secure_sum` with the run's settings as parsed: every key
    reaches the protocol (``clip`` bounds float inputs only, and sign messages are ring
    elements of Z_2^bits; ``enabled = false`` adds them in the clear). With R > 1
    reclusterings every reclustering sums the same messages, so each gives the total;
    the first is used and the others must agree.

    Raises:
        RuntimeError: a cluster produced no sum (cannot happen without drop-outs), or two
            reclusterings disagree."""
    bits = settings.bits
    result = secure_sum(
        ring_signs(messages, bits),
        settings.as_settings(),
        seed=seed,
        round=round,
        protocol=settings.enabled,
    )
    totals = []
    for reclustering in result.reclusterings:
        if reclustering.failed or reclustering.corrupted:
            raise RuntimeError(f"round {round}: a cluster of the sign sum failed")
        totals.append(signed_ring_sum([c.ring_sum for c in reclustering.clusters], bits))
    if any(not np.array_equal(totals[0], t) for t in totals[1:]):
        raise RuntimeError(f"round {round}: the reclusterings' sign sums disagree")
    return torch.as_tensor(totals[0], device=messages.device).to(messages.dtype)


class RSALoop(SteppedLoop):
    """One run of the dp_rsa loop (``[algorithm] name = "dp_rsa"``) in this process.

    Args:
        run: the resolved configuration (``run.dp_rsa`` holds the loop's parameters).
        device: overrides ``run.device``.
        train, test: preloaded datasets (default: loaded from the configuration).

    Raises:
        SimulationConfigError: an attack or option the loop does not know, privacy.enabled (DP here
            is on the sign messages), secure aggregation for a gradient baseline.
    """

    algorithm = "dp_rsa"

    def __init__(
        self,
        run: RunConfig,
        *,
        device: str | None = None,
        train: Dataset | None = None,
        test: Dataset | None = None,
    ) -> None:
        self.device, train, test = self.begin(run, device, train, test)
        self.train_set, self.test_set = train, test
        self.algo = algo = run.dp_rsa
        self.generator = torch.Generator(device=self.device).manual_seed(run.seed)
        self.rng = np.random.default_rng([run.seed, 2])  # secure_sum's plans only
        self.regular = run.clients.honest
        self.byzantine = run.clients.byzantine
        self.attack = build_attack(run.attack.name, run.attack.options)
        self.rsa_family = algo.method in RSA_FAMILY
        self.clustered = run.secure_aggregation.cluster_size >= 2
        if self.clustered and not self.rsa_family:
            raise SimulationConfigError(
                f"dp_rsa.method = {algo.method!r} sends gradients: secure aggregation of "
                "sign sums is for the RSA family; set secure_aggregation.cluster_size = 1"
            )

        parts = partition(
            train.targets.cpu().numpy(),
            run.clients.total,
            run.data.partition,
            seed=run.partition_seed,
            **run.data.partition_options,
        )
        shape = tuple(train.inputs.shape[1:])
        self.model = FlatModel(self._module(run.model.init_seed, shape).to(self.device))
        sampler = EpochSampler(parts[: self.regular], run.training.batch_size, self.device)
        self.gradients = WorkerGradients(self.model, train.inputs, train.targets, sampler)
        self.x0 = self.model.initial().to(self.device)
        self.xk = self._initial_workers(shape) if self.rsa_family else None
        self.master = RSAMaster(
            lr=algo.lr, penalty=algo.penalty, regularization=algo.regularization
        )
        self.mechanism = self._mechanism()
        self.median = GeometricMedian(tol=algo.gm_tol, max_iter=algo.gm_max_iter)
        self.start_clock()

    # -- setup -------------------------------------------------------------------------

    def _module(self, seed: int, shape: tuple[int, ...]) -> torch.nn.Module:
        cfg = self.run.model
        classes = self.train_set.num_classes
        return build_model(
            cfg.name, num_classes=classes, input_shape=shape, seed=seed, **cfg.options
        )

    def _initial_workers(self, shape: tuple[int, ...]) -> Tensor:
        """x_k^0 ``[r, d]`` as ``dp_rsa.init`` says."""
        init, r = self.algo.init, self.regular
        if init == "same":
            return self.x0.unsqueeze(0).repeat(r, 1)
        if init == "perturbed":
            u = torch.rand(r, self.model.dim, generator=self.generator, device=self.device)
            return self.x0 + 0.01 * (u - 0.5)
        seeds = np.random.SeedSequence([self.run.seed, self.run.model.init_seed]).generate_state(r)
        flat = [FlatModel(self._module(int(s), shape)).initial() for s in seeds]
        return torch.stack(flat).to(self.device)

    def _mechanism(self) -> SignFlip | SignGaussian | None:
        algo = self.algo
        if algo.method == "dp_rsa_f":
            return SignFlip(algo.epsilon)
        if algo.method == "dp_rsa_g":
            return SignGaussian(
                algo.epsilon,
                rsa_sensitivity(algo.lr, algo.grad_bound),
                per_coordinate=algo.sigma_rule != "scalar",
                signed_u=algo.sigma_rule == "code",
            )
        return None

    # -- one iteration -------------------------------------------------------------------

    def _clip(self, g: Tensor) -> Tensor:
        if not self.algo.clip_gradients:
            return g
        norms = torch.linalg.vector_norm(g, dim=1, keepdim=True)
        return g * (self.algo.grad_bound / norms.clamp_min(1e-12)).clamp_max(1.0)

    def sign_sum(self, messages: Tensor) -> Tensor:
        """Σ_k messages[k] ``[d]`` (float) from the ``[K, d]`` ±1 messages: in the clear,
        or through :func:`secure_sign_sum` (every key of ``[secure_aggregation]``) when
        clustered.

        Raises:
            RuntimeError: a cluster produced no sum (cannot happen without drop-outs)."""
        if not self.clustered:
            return messages.sum(dim=0)
        seed = int(self.rng.integers(2**63))
        return secure_sign_sum(messages, self.run.secure_aggregation, seed, self.round)

    def _rsa_step(self) -> None:
        assert self.xk is not None
        x0, xk, gen = self.x0, self.xk, self.generator
        u = x0.unsqueeze(0) - xk
        raw = rsa_sign(u)
        sent = raw if self.mechanism is None else self.mechanism(u, gen)
        grads = self._clip(self.gradients.gradients(xk, gen))
        own = sent if self.algo.worker_sign == "sent" else raw
        self.xk = rsa_worker_step(xk, grads, own, lr=self.algo.lr, penalty=self.algo.penalty)
        byzantine = self.attack.messages(self.byzantine, x0, raw, sent, gen)
        self.x0 = self.master.step(x0, self.sign_sum(torch.cat([sent, byzantine])))

    def _gradient_step(self) -> None:
        x, algo = self.x0, self.algo
        honest = self._clip(self.gradients.gradients(x.expand(self.regular, -1), self.generator))
        byzantine = self.attack.gradients(self.byzantine, x, honest, self.generator)
        rows = torch.cat([honest, byzantine])
        if algo.method == "sgd":
            step = rows.mean(dim=0)
        elif algo.method == "signsgd":
            step = rsa_sign(rows).mean(dim=0)
        else:
            step = self.median(rows)
        if algo.baseline_regularization:
            step = step + 2.0 * algo.regularization * x
        self.x0 = x - algo.lr * step

    def step(self) -> RoundRecord:
        """One iteration; evaluates x_0 when due. Returns the iteration's record."""
        with torch.no_grad():
            if self.rsa_family:
                self._rsa_step()
            else:
                self._gradient_step()
        self.round += 1
        if not self.evaluation_due():
            return RoundRecord(self.round, None, None, None, self.elapsed())
        accuracy, loss = self.model.evaluate(self.x0, self.test_set.inputs, self.test_set.targets)
        extra: dict[str, Any] = {}
        if self.xk is not None:
            gap = torch.linalg.vector_norm(self.xk - self.x0, dim=1).mean()
            extra["disagreement"] = float(gap)
        if self.mechanism is not None:
            extra["epsilon_round"] = self.algo.epsilon
        return RoundRecord(self.round, accuracy, loss, self.epsilon(), self.elapsed(), extra)

    # -- reporting -----------------------------------------------------------------------

    def epsilon(self) -> float | None:
        """Composed per-coordinate ε after the iterations so far (``None`` without DP)."""
        if self.mechanism is None or self.round == 0:
            return None
        return composed_epsilon(self.algo.epsilon, self.round, self.algo.delta, discretization=1e-3)

    def final_model(self) -> FinalModel:
        """The model every evaluation reports, after the iterations so far: the master model
        x_0 (RSA family) or the shared model x (baselines), as the module's ``state_dict``
        (:class:`~sharefl.simulator.final_model.FinalModel`, float32)."""
        return FinalModel.from_flat(
            self.model,
            self.x0,
            loop="dp_rsa",
            describes="the master model x_0" if self.rsa_family else "the shared model x",
            run=self.run,
            input_shape=tuple(self.train_set.inputs.shape[1:]),
            num_classes=self.train_set.num_classes,
            round=self.round,
        )

    def privacy_summary(self) -> tuple[float | None, dict[str, Any]]:
        """(δ of the reported ε or ``None``, the JSON-ready privacy parameters)."""
        algo = self.algo
        if self.mechanism is None:
            return None, {"mechanism": None, "method": algo.method}
        info: dict[str, Any] = {
            "method": algo.method,
            "epsilon_round": algo.epsilon,
            "delta": algo.delta,
            "scope": "per round and per coordinate of one worker's sign message (nominal)",
            "vector_epsilon_round": self.model.dim * algo.epsilon,
            "composition": "PLD of randomised response (dp-accounting), replace-one",
        }
        if isinstance(self.mechanism, SignFlip):
            info |= {
                "mechanism": "sign_flip",
                "keep_probability": self.mechanism.gamma,
                "guarantee": "Theorem 1 per coordinate; the composition is exact for "
                "randomised response",
            }
        else:
            info |= {
                "mechanism": "sign_gaussian",
                "sigma_rule": algo.sigma_rule,
                "sensitivity": self.mechanism.sensitivity,
                "noise_floor": self.mechanism.noise_floor,
                "gradient_bound_enforced": algo.clip_gradients,
                "guarantee": self._gaussian_guarantee(),
            }
        return algo.delta, info

    def _gaussian_guarantee(self) -> str:
        """What the Sign-Gaussian ε means in this run (note §6.4-5)."""
        text = (
            "nominal: Theorem 2's ε (its proof treats all coordinates as one sign, drops a "
            "cross term and bounds Σ|v_i| by √2Δu), with σ depending on u; the composition "
            "takes that ε as a pure binary mechanism and inherits these gaps"
        )
        if not self.algo.clip_gradients:
            text += (
                "; M is not enforced (clip_gradients = false), so Δu = 2αM bounds no "
                "sensitivity and no ε is guaranteed"
            )
        return text
