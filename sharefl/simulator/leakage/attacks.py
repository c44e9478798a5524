"""Gradient inversion: DLG, iDLG and CPL reconstruct training inputs from a leaked gradient.

All three minimise the gradient distance

    D(x', y') = Σ_layers ‖∇_w ℓ(f_w(x'), y') − g_leaked‖²      (sum of squared differences)

over a dummy input x' with L-BFGS, where ℓ is the mean softmax cross-entropy (the loss
:func:`~sharefl.simulator.leakage.leaked_gradient` differentiates):

* ``"dlg"`` — Zhu et al. 2019: dummy input ~ N(0, 1) and dummy label logits ~ N(0, 1),
  both optimised; the loss for a soft label is −Σ_c softmax(y')_c log softmax(f(x'))_c.
* ``"idlg"`` — Zhao et al. 2020: the label is read off the leaked gradient
  (:func:`infer_label`); dummy input ~ N(0, 1); only the input is optimised.
* ``"cpl"`` — Wei et al. 2020 (Fed-αCDP's attack): iDLG's label and a *patterned*
  initialisation: one random patch ~ U(0, 1) of ⌈H/2⌉×⌈W/2⌉ (1×14×14 for MNIST, 3×16×16
  for 32×32 images) tiled 2×2.

Iterations are L-BFGS outer steps (``optimizer.step(closure)``, each up to ``lbfgs_max_iter``
inner iterations), counted like the paper's τ (at most 300). The attack stops early when
D ≤ ``tolerance``·‖g_leaked‖² (converged), when L-BFGS is at a stationary point, when D is
no longer finite, or, if ``patience`` is set, when the best D has improved by less than a
relative ``min_improvement`` over the last ``patience`` steps (stalled: a noised gradient
cannot be matched, Fed-αCDP Table III). It returns the outer-step iterate with the lowest D.
Optimisation runs on a float64 copy of the model by default, which L-BFGS needs to bring D
down to ~1e-10·‖g‖².

Deviation from the authors' code: L-BFGS uses the strong-Wolfe line search by default
(``line_search=False`` gives their fixed step lr = 1), which keeps noisy runs finite.
"""

from __future__ import annotations

import copy
import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sharefl.machine import torch_threads
from sharefl.privacy.per_example import trainable_parameters

from .errors import GradientLeakageError, enum_member
from .leak import LeakedGradient
from .metrics import DEFAULT_SUCCESS_MSE, match_reconstructions, reconstruction_mse
from .network import check_input_shape

#: Default relative tolerance: stop when D ≤ DEFAULT_TOLERANCE·‖g_leaked‖².
DEFAULT_TOLERANCE = 1e-8
#: The paper's attack termination τ.
DEFAULT_MAX_ITERATIONS = 300


class Method(enum.StrEnum):
    """The gradient-inversion attacks."""

    DLG = "dlg"
    IDLG = "idlg"
    CPL = "cpl"


class StopReason(enum.StrEnum):
    """Why :func:`reconstruct` stopped."""

    CONVERGED = "converged"  # D ≤ tolerance·‖g‖²
    STATIONARY = "stationary"  # L-BFGS made no move (gradient of D below its tolerance)
    STALLED = "stalled"  # no relative improvement ≥ min_improvement within `patience` steps
    DIVERGED = "diverged"  # D or the dummy became non-finite
    MAX_ITERATIONS = "max_iterations"


def check_method(method: str | Method) -> Method:
    """``method`` as a :class:`Method`, or :class:`GradientLeakageError` naming the valid ones."""
    return enum_member(Method, method, "attack method")


@dataclass(frozen=True)
class Reconstruction:
    """The result of :func:`reconstruct`.

    Attributes:
        input: ``[B, C, H, W]`` reconstructed inputs (raw, not clamped), detached, in the
            attack's dtype on the model's device.
        label: ``[B]`` int64 labels used (given, inferred, or DLG's argmax of its soft label).
        label_inferred: True when the label came from the gradient (iDLG/CPL inference or
            DLG's optimisation), False when given by the caller.
        method: the attack.
        iterations: L-BFGS outer steps run (≤ max_iterations).
        distance: gradient distance D of the returned input.
        relative_distance: D / ‖g_leaked‖².
        stop_reason: why it stopped.
        distance_history: D after each outer step (length ``iterations``).
        mse_history: if a reference was given, the MSE between :attr:`image` after each
            outer step and the reference (evaluation only: the attack never sees it), the
            images of a batch matched to the reference by
            :func:`~sharefl.simulator.leakage.match_reconstructions`.
    """

    input: torch.Tensor
    label: torch.Tensor
    label_inferred: bool
    method: Method
    iterations: int
    distance: float
    relative_distance: float
    stop_reason: StopReason
    distance_history: tuple[float, ...]
    mse_history: tuple[float, ...] | None = None

    @property
    def image(self) -> torch.Tensor:
        """:attr:`input` clamped to the pixel range [0, 1] (what an image viewer shows; the
        metrics of :func:`~sharefl.simulator.leakage.run_leakage_trials` use it)."""
        return self.input.clamp(0.0, 1.0)

    def first_success(self, threshold: float = DEFAULT_SUCCESS_MSE) -> int | None:
        """The first outer step (1-based) whose image had MSE ≤ ``threshold`` against the
        reference, or None (also when no reference was given)."""
        if self.mse_history is None:
            return None
        for step, mse in enumerate(self.mse_history, start=1):
            if mse <= threshold:
                return step
        return None


def infer_label(grads: Sequence[torch.Tensor] | LeakedGradient) -> int:
    """iDLG's label inference from one example's gradient.

    With softmax cross-entropy, row c of the last linear layer's weight gradient is
    (p_c − 1[c = y])·h for the penultimate features h. When h ≥ 0 (sigmoid, ReLU) only the
    true label's row is non-positive, so the label is the argmin of the row sums: exact for
    an undefended single-example gradient (unless h = 0 or p_y rounds to 1).

    Args:
        grads: the gradients (or a :class:`LeakedGradient`) of a model whose last 2-D
            parameter is the final linear layer's ``[num_classes, features]`` weight.

    Raises:
        GradientLeakageError: a :class:`LeakedGradient` of more than one example, or no 2-D tensor.
    """
    if isinstance(grads, LeakedGradient):
        if grads.batch_size != 1:
            raise GradientLeakageError(
                f"iDLG label inference needs one example's gradient, this one averages "
                f"{grads.batch_size}: pass label= (one per example) or use method='dlg'"
            )
        grads = grads.grads
    weights = [g for g in grads if g.dim() == 2]
    if not weights:
        raise GradientLeakageError(
            "no 2-D gradient found: iDLG needs the model to end with a linear layer whose "
            "weight gradient is [num_classes, features]"
        )
    return int(torch.argmin(weights[-1].sum(dim=-1)))


def reconstruct(
    model: nn.Module,
    leaked: LeakedGradient | Sequence[torch.Tensor],
    *,
    method: str | Method = Method.CPL,
    input_shape: Sequence[int],
    num_classes: int | None = None,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    tolerance: float = DEFAULT_TOLERANCE,
    patience: int | None = None,
    min_improvement: float = 1e-6,
    label: int | Sequence[int] | torch.Tensor | None = None,
    batch_size: int | None = None,
    seed: int = 0,
    generator: torch.Generator | None = None,
    reference: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
    line_search: bool = True,
    lbfgs_max_iter: int = 20,
    history_size: int = 100,
    num_threads: int | None = 1,
) -> Reconstruction:
    """Reconstruct the input(s) behind a leaked gradient of ``model``.

    Args:
        model: the model the gradient was computed on (same parameter values); a copy in
            ``dtype`` is attacked, the model itself is not modified.
        leaked: a :class:`LeakedGradient` or one tensor per trainable parameter of
            ``model`` (module order, matching shapes).
        method: ``"dlg"``, ``"idlg"`` or ``"cpl"``.
        input_shape: ``(C, H, W)`` of one example.
        num_classes: number of classes (default: rows of the last 2-D gradient).
        max_iterations: τ, the most L-BFGS outer steps (≥ 1).
        tolerance: stop when D ≤ tolerance·‖g_leaked‖² (≥ 0).
        patience: stop when the best D improved by a relative factor < ``min_improvement``
            over the last ``patience`` steps; None runs until another criterion.
        min_improvement: see ``patience``.
        label: the label(s) of the batch; None infers it (iDLG/CPL, one example only) or
            optimises it (DLG).
        batch_size: examples behind the gradient (default: ``leaked.batch_size``, else 1).
        seed: seeds the initialisation when no ``generator`` is given.
        generator: CPU generator for the dummy initialisation.
        reference: ``[B, C, H, W]`` true inputs, only to record :attr:`Reconstruction.
            mse_history` (the attack does not use it).
        dtype: floating dtype of the attack.
        line_search: strong-Wolfe line search (True) or the fixed step lr = 1 (False).
        lbfgs_max_iter: inner L-BFGS iterations per outer step.
        history_size: L-BFGS memory.
        num_threads: torch intra-op threads while the attack runs (restored afterwards;
            None leaves the setting alone). The attack's tensors are tiny, so one thread is
            fastest: with two threads on two busy cores it ran 5-30× slower.

    Raises:
        GradientLeakageError: unknown method; gradients whose count or shapes differ from the
            model's trainable parameters; a label inference asked for a batch gradient;
            labels out of range; bad numbers.
    """
    method = check_method(method)
    shape = check_input_shape(input_shape)
    grads, batch = _check_leaked(leaked, batch_size)
    net = copy.deepcopy(model).to(dtype)
    params = [p for _, p in trainable_parameters(net)]
    _check_against_model(grads, params)
    target = [g.detach().to(dtype=dtype, device=params[0].device) for g in grads]
    classes = _num_classes(target, num_classes)
    _check_run(max_iterations, tolerance, patience, min_improvement)
    labels = _labels(label, method, leaked, target, batch, classes, params[0].device)
    gen = generator if generator is not None else torch.Generator().manual_seed(seed)
    dummy = _initial_input(method, batch, shape, gen, dtype).to(params[0].device)
    dummy.requires_grad_(True)
    _check_forward(net, dummy, classes)
    soft: torch.Tensor | None = None
    if labels is None:
        soft = torch.randn(batch, classes, generator=gen, dtype=dtype).to(dummy.device)
        soft.requires_grad_(True)
    ref = None if reference is None else _check_reference(reference, batch, shape, dummy)
    if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
        raise GradientLeakageError(f"num_threads must be None or an int ≥ 1, got {num_threads!r}")
    with torch_threads(num_threads):
        result = _Optimiser(net, params, target, dummy, labels, soft, line_search).run(
            lbfgs_max_iter,
            history_size,
            max_iterations,
            tolerance,
            patience,
            min_improvement,
            ref,
        )
    out_label = labels if labels is not None else result.soft_label.argmax(dim=1)
    return Reconstruction(
        input=result.best_input,
        label=out_label.to(torch.int64),
        label_inferred=label is None,
        method=method,
        iterations=result.iterations,
        distance=result.best_distance,
        relative_distance=result.best_distance / max(_squared_norm(target), 1e-300),
        stop_reason=result.stop_reason,
        distance_history=tuple(result.distances),
        mse_history=None if ref is None else tuple(result.mses),
    )


@dataclass
class _RunResult:
    best_input: torch.Tensor
    best_distance: float
    soft_label: torch.Tensor
    iterations: int
    stop_reason: StopReason
    distances: list[float]
    mses: list[float]


class _Optimiser:
    """L-BFGS on the gradient distance; records D at every evaluated point."""

    def __init__(
        self,
        net: nn.Module,
        params: Sequence[torch.Tensor],
        target: list[torch.Tensor],
        dummy: torch.Tensor,
        labels: torch.Tensor | None,
        soft: torch.Tensor | None,
        line_search: bool,
    ) -> None:
        self.net, self.params, self.target = net, params, target
        self.dummy, self.labels, self.soft = dummy, labels, soft
        self.variables = [dummy] if soft is None else [dummy, soft]
        self.line_search = line_search
        self.evaluated: list[tuple[float, list[torch.Tensor]]] = []

    def distance(self, create_graph: bool) -> torch.Tensor:
        logits = self.net(self.dummy)
        if self.soft is None:
            assert self.labels is not None  # hard labels whenever there are no soft ones
            loss = F.cross_entropy(logits, self.labels)
        else:
            probs = F.softmax(self.soft, dim=-1)
            loss = -(probs * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()
        grads = torch.autograd.grad(loss, self.params, create_graph=create_graph)
        distance: torch.Tensor = sum(  # type: ignore[assignment]  # a sum of tensors
            ((g - t) ** 2).sum() for g, t in zip(grads, self.target, strict=True)
        )
        return distance

    def closure(self) -> torch.Tensor:
        value = self.distance(create_graph=True)
        grads = torch.autograd.grad(value, self.variables)
        for v, g in zip(self.variables, grads, strict=True):
            v.grad = g
        self.evaluated.append((float(value.detach()), [v.detach().clone() for v in self.variables]))
        return value.detach()

    def current_distance(self) -> float:
        """D at the current variables, reusing an evaluation of this step if there is one."""
        for value, snapshot in reversed(self.evaluated):
            if all(torch.equal(s, v) for s, v in zip(snapshot, self.variables, strict=True)):
                return value
        with torch.enable_grad():
            return float(self.distance(create_graph=False))

    def run(
        self,
        lbfgs_max_iter: int,
        history_size: int,
        max_iterations: int,
        tolerance: float,
        patience: int | None,
        min_improvement: float,
        reference: torch.Tensor | None,
    ) -> _RunResult:
        optimizer = torch.optim.LBFGS(
            self.variables,
            lr=1.0,
            max_iter=lbfgs_max_iter,
            history_size=history_size,
            line_search_fn="strong_wolfe" if self.line_search else None,
        )
        threshold = tolerance * _squared_norm(self.target)
        best = self.current_distance()
        best_vars = [v.detach().clone() for v in self.variables]
        distances: list[float] = []
        mses: list[float] = []
        stop = StopReason.MAX_ITERATIONS
        last_improvement, improvement_base = 0, best
        for step in range(1, max_iterations + 1):
            before = [v.detach().clone() for v in self.variables]
            self.evaluated.clear()
            optimizer.step(self.closure)
            value = self.current_distance()
            finite = math.isfinite(value) and all(
                bool(torch.isfinite(v).all()) for v in self.variables
            )
            distances.append(value if finite else math.inf)
            if finite and value < best:
                best, best_vars = value, [v.detach().clone() for v in self.variables]
            if reference is not None:
                image = best_vars[0].clamp(0.0, 1.0)
                matched = match_reconstructions(image, reference)
                mses.append(reconstruction_mse(matched, reference))
            if not finite:
                stop = StopReason.DIVERGED
            elif best <= threshold:
                stop = StopReason.CONVERGED
            elif all(torch.equal(b, v) for b, v in zip(before, self.variables, strict=True)):
                stop = StopReason.STATIONARY
            elif patience is not None:
                if best < improvement_base * (1.0 - min_improvement):
                    last_improvement, improvement_base = step, best
                elif step - last_improvement >= patience:
                    stop = StopReason.STALLED
            if stop != StopReason.MAX_ITERATIONS or step == max_iterations:
                break
        soft = best_vars[1] if len(best_vars) > 1 else torch.empty(0)
        return _RunResult(best_vars[0], best, soft, step, stop, distances, mses)


def _initial_input(
    method: Method,
    batch: int,
    shape: tuple[int, int, int],
    generator: torch.Generator,
    dtype: torch.dtype,
) -> torch.Tensor:
    """CPL's patterned seed (a U(0, 1) patch of ⌈H/2⌉×⌈W/2⌉ tiled 2×2), else N(0, 1)."""
    channels, height, width = shape
    if method != Method.CPL:
        return torch.randn(batch, *shape, generator=generator, dtype=dtype)
    patch = torch.rand(
        batch, channels, -(-height // 2), -(-width // 2), generator=generator, dtype=dtype
    )
    return patch.repeat(1, 1, 2, 2)[:, :, :height, :width].contiguous()


def _check_forward(net: nn.Module, dummy: torch.Tensor, classes: int) -> None:
    """The model must map ``[B, C, H, W]`` inputs of ``input_shape`` to ``[B, classes]``."""
    try:
        with torch.no_grad():
            out = net(dummy)
    except RuntimeError as error:
        raise GradientLeakageError(
            f"the model does not accept inputs of shape {tuple(dummy.shape[1:])}: pass the "
            f"input_shape of its training examples ({error})"
        ) from None
    if tuple(out.shape) != (dummy.shape[0], classes):
        raise GradientLeakageError(
            f"the model's output has shape {tuple(out.shape)}, expected "
            f"{(dummy.shape[0], classes)} logits"
        )


def _check_leaked(
    leaked: LeakedGradient | Sequence[torch.Tensor], batch_size: int | None
) -> tuple[list[torch.Tensor], int]:
    if isinstance(leaked, LeakedGradient):
        grads, default = list(leaked.grads), leaked.batch_size
    elif isinstance(leaked, torch.Tensor) or not isinstance(leaked, Sequence):
        raise GradientLeakageError(
            "leaked must be a LeakedGradient or a sequence of tensors, one per trainable "
            "parameter of the model (a flat vector is not accepted: split it per parameter)"
        )
    else:
        grads, default = list(leaked), 1
    if not all(isinstance(g, torch.Tensor) for g in grads):
        raise GradientLeakageError("every leaked gradient must be a torch tensor")
    batch = default if batch_size is None else batch_size
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise GradientLeakageError(f"batch_size must be an int ≥ 1, got {batch_size!r}")
    return grads, batch


def _check_against_model(grads: list[torch.Tensor], params: Sequence[torch.Tensor]) -> None:
    if len(grads) != len(params):
        raise GradientLeakageError(
            f"got {len(grads)} gradients but the model has {len(params)} trainable parameter "
            "tensors: pass one gradient per parameter of model.parameters(), in order"
        )
    for i, (g, p) in enumerate(zip(grads, params, strict=True)):
        if g.shape != p.shape:
            raise GradientLeakageError(
                f"gradient {i} has shape {tuple(g.shape)} but parameter {i} of the model has "
                f"shape {tuple(p.shape)}: the gradients must come from this model"
            )
        if not g.is_floating_point() or not bool(torch.isfinite(g).all()):
            raise GradientLeakageError(f"gradient {i} must be a finite floating-point tensor")


def _num_classes(target: list[torch.Tensor], num_classes: int | None) -> int:
    weights = [g for g in target if g.dim() == 2]
    inferred = weights[-1].shape[0] if weights else None
    if num_classes is None:
        if inferred is None:
            raise GradientLeakageError(
                "pass num_classes: the gradients have no 2-D last-layer weight"
            )
        return inferred
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise GradientLeakageError(f"num_classes must be an int ≥ 2, got {num_classes!r}")
    if inferred is not None and inferred != num_classes:
        raise GradientLeakageError(
            f"num_classes={num_classes} but the last-layer weight gradient has {inferred} rows"
        )
    return num_classes


def _labels(
    label: int | Sequence[int] | torch.Tensor | None,
    method: Method,
    leaked: LeakedGradient | Sequence[torch.Tensor],
    target: list[torch.Tensor],
    batch: int,
    classes: int,
    device: torch.device,
) -> torch.Tensor | None:
    """The labels to use, or None when DLG optimises them."""
    if label is None:
        if method == Method.DLG:
            return None
        if batch != 1:
            raise GradientLeakageError(
                f"{method.value} infers the label from one example's gradient, but the "
                f"gradient averages {batch} examples: pass label= (one per example) or use "
                "method='dlg'"
            )
        source = leaked if isinstance(leaked, LeakedGradient) else target
        return torch.tensor([infer_label(source)], dtype=torch.int64, device=device)
    labels = torch.as_tensor(label, dtype=torch.int64).reshape(-1).to(device)
    if labels.numel() != batch:
        raise GradientLeakageError(
            f"got {labels.numel()} labels for a gradient of {batch} examples"
        )
    if bool(((labels < 0) | (labels >= classes)).any()):
        raise GradientLeakageError(f"labels must lie in [0, {classes}), got {labels.tolist()}")
    return labels


def _check_run(
    max_iterations: int, tolerance: float, patience: int | None, min_improvement: float
) -> None:
    if isinstance(max_iterations, bool) or not isinstance(max_iterations, int):
        raise GradientLeakageError(f"max_iterations must be an int ≥ 1, got {max_iterations!r}")
    if max_iterations < 1:
        raise GradientLeakageError(f"max_iterations must be ≥ 1, got {max_iterations}")
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise GradientLeakageError(f"tolerance must be a finite number ≥ 0, got {tolerance!r}")
    if patience is not None and (not isinstance(patience, int) or patience < 1):
        raise GradientLeakageError(f"patience must be None or an int ≥ 1, got {patience!r}")
    if not (math.isfinite(min_improvement) and 0 <= min_improvement < 1):
        raise GradientLeakageError(f"min_improvement must be in [0, 1), got {min_improvement!r}")


def _check_reference(
    reference: torch.Tensor, batch: int, shape: tuple[int, int, int], like: torch.Tensor
) -> torch.Tensor:
    if not isinstance(reference, torch.Tensor) or tuple(reference.shape) != (batch, *shape):
        got = tuple(reference.shape) if isinstance(reference, torch.Tensor) else reference
        raise GradientLeakageError(f"reference must have shape {(batch, *shape)}, got {got}")
    return reference.detach().to(dtype=like.dtype, device=like.device)


def _squared_norm(tensors: Sequence[torch.Tensor]) -> float:
    return float(sum(t.pow(2).sum() for t in tensors))
