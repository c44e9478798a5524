"""Byzantine attacks for the simulator, with the attacker's knowledge made explicit.

An *update attack* returns the ``[b, d]`` vectors that the ``b`` Byzantine workers upload in
one round, from an :class:`AttackView` of what they know:

* ``own`` — the honest updates the Byzantine workers computed on their own data
  (:attr:`Knowledge.OWN`);
* ``honest`` — the honest workers' uploads of the round (:attr:`Knowledge.OMNISCIENT`, the
  strongest attacker of the papers: it also knows the aggregation rule).

Each attack declares the knowledge it needs in :attr:`Attack.knowledge` and raises
:class:`AttackError` (a ``ValueError``) when the view lacks it. Randomised attacks take an
explicit :class:`torch.Generator`. Tensors keep the views' device and dtype.

The attacks (what every Byzantine worker sends; source paper):

* :class:`LabelFlipping` — data poisoning, trains on ``y -> C - 1 - y`` (seeds 000, 001);
* :class:`SignFlipping` — ``-k Δ_own``, ``k = 1``, or 10 and 100 scaled (001, 002);
* :class:`GaussianAttack` — ``N(μ, std² I)``, optionally around the honest mean (000, 002,
  004);
* :class:`FallOfEmpires` — ``β · mean`` of the Byzantine or the honest updates; the latter
  is inner-product manipulation, :func:`inner_product_manipulation` (001; 000);
* :class:`ALittleIsEnough` — ``μ - z σ`` coordinate-wise, ``z`` fixed or Baruch et al.'s
  ``z_max`` (000);
* :class:`OLMP` — ``-(1/sqrt(B)) Σ honest``, only when ``M > sqrt(B)`` (000, Eq. 8-10);
* :class:`MinMax` — ``μ + γ p`` with the largest ``γ`` inside the honest spread
  (Shejwalkar and Houmansadr, 2021);
* :class:`Mimic` (sample duplicating) — a copy of one honest upload (002);
* :class:`Isolation` — cancels the receiver's decentralized mix (004);
* :class:`TimeToBeByzantine` — honest until a fraction of training, then an attack (000).
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from sharefl.simulator.components import construct
from sharefl.simulator.config import SimulationConfigError
from sharefl.simulator.errors import SimulatorError


class AttackError(SimulatorError, ValueError):
    """An attack is misconfigured, lacks the knowledge it needs, or does not exist for the
    given numbers of workers (OLMP's feasibility condition)."""


class Knowledge(enum.StrEnum):
    """What an attack needs to know in one round."""

    NONE = "none"
    OWN = "own"
    OMNISCIENT = "omniscient"


Reference = Literal["honest", "byzantine"]
"""Whose updates a statistical attack imitates: the honest uploads (omniscient) or the
Byzantine workers' own honest updates (own data)."""


@dataclass(frozen=True)
class AttackView:
    """What the Byzantine workers know in one round.

    Attributes:
        num_byzantine: ``b``, the number of vectors to produce.
        own: ``[b, d]`` honest updates the Byzantine workers computed on their own data.
        honest: ``[h, d]`` the honest workers' uploads this round (omniscient attacker).
        round: the current round (0-based), for time-dependent attacks.
        num_rounds: the number of rounds of training, for time-dependent attacks.
        dim: ``d`` when neither ``own`` nor ``honest`` is given (pure-noise attacks).
    """

    num_byzantine: int
    own: Tensor | None = None
    honest: Tensor | None = None
    round: int = 0
    num_rounds: int | None = None
    dim: int | None = None

    def __post_init__(self) -> None:
        if self.num_byzantine < 0:
            raise AttackError(f"num_byzantine must be >= 0, got {self.num_byzantine}")
        for name, value in (("own", self.own), ("honest", self.honest)):
            if value is not None and (not isinstance(value, Tensor) or value.dim() != 2):
                raise AttackError(f"{name} must be a [rows, d] tensor")
        if self.own is not None and self.own.shape[0] != self.num_byzantine:
            raise AttackError(
                f"own has {self.own.shape[0]} rows but num_byzantine = {self.num_byzantine}"
            )
        dims = {t.shape[1] for t in (self.own, self.honest) if t is not None}
        if self.dim is not None:
            dims.add(self.dim)
        if len(dims) > 1:
            raise AttackError(f"own, honest and dim disagree on d: {sorted(dims)}")
        if not dims:
            raise AttackError("the view needs own, honest or dim to know the dimension d")

    @property
    def d(self) -> int:
        """The dimension of the updates."""
        for t in (self.own, self.honest):
            if t is not None:
                return t.shape[1]
        assert self.dim is not None
        return self.dim

    @property
    def num_workers(self) -> int | None:
        """``h + b`` when the honest uploads are known."""
        return None if self.honest is None else self.honest.shape[0] + self.num_byzantine

    def template(self) -> Tensor:
        """An empty tensor with the views' dtype and device (float32 on CPU if unknown)."""
        for t in (self.own, self.honest):
            if t is not None:
                return t.new_empty(0)
        return torch.empty(0)

    def require_own(self, attack: str) -> Tensor:
        """The Byzantine workers' own updates, or :class:`AttackError`."""
        if self.own is None:
            raise AttackError(f"{attack} needs the Byzantine workers' own updates (view.own)")
        return self.own

    def require_honest(self, attack: str) -> Tensor:
        """The honest uploads (omniscient attacker), or :class:`AttackError`."""
        if self.honest is None or self.honest.shape[0] == 0:
            raise AttackError(f"{attack} is omniscient: it needs the honest uploads (view.honest)")
        return self.honest

    def reference(self, which: Reference, attack: str) -> Tensor:
        """The honest uploads or the own updates, as ``which`` says."""
        if which == "honest":
            return self.require_honest(attack)
        if which == "byzantine":
            own = self.require_own(attack)
            if own.shape[0] == 0:
                raise AttackError(f"{attack} with reference='byzantine' needs b >= 1")
            return own
        raise AttackError(f"reference must be 'honest' or 'byzantine', got {which!r}")


def _need_generator(generator: torch.Generator | None, attack: str) -> torch.Generator:
    if generator is None:
        raise AttackError(f"{attack} is randomised: pass an explicit torch.Generator")
    return generator


def _repeat(vector: Tensor, b: int) -> Tensor:
    """``b`` copies of ``vector`` as a fresh ``[b, d]`` tensor."""
    return vector.unsqueeze(0).repeat(b, 1)


class Attack(ABC):
    """An update attack: ``attack(view, generator) -> Tensor[b, d]``."""

    @property
    @abstractmethod
    def knowledge(self) -> Knowledge:
        """What the attack needs to know (:class:`Knowledge`)."""

    @abstractmethod
    def __call__(self, view: AttackView, generator: torch.Generator | None = None) -> Tensor:
        """The ``[view.num_byzantine, d]`` vectors the Byzantine workers upload."""


@dataclass(frozen=True)
class LabelFlipping:
    """Data poisoning: Byzantine workers train honestly on labels ``y -> C - 1 - y``
    (SHARE: ``9 - y`` on CIFAR-10; Xiang et al.: ``H - 1 - I``). Apply it to the labels of
    their batches; the simulator then runs the normal training step."""

    num_classes: int

    def __post_init__(self) -> None:
        if self.num_classes < 2:
            raise AttackError(f"num_classes must be at least 2, got {self.num_classes}")

    def __call__(self, labels: Tensor) -> Tensor:
        """The flipped labels (a new tensor); labels must lie in ``[0, C)``."""
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= self.num_classes):
            raise AttackError(f"labels must lie in [0, {self.num_classes})")
        return (self.num_classes - 1) - labels


@dataclass(frozen=True)
class SignFlipping(Attack):
    """Each Byzantine worker sends ``-scale · Δ`` for its own honest update ``Δ``: the sign
    flip (``scale = 1``) and the scaled sign flip of SHARE (``-10Δ``, ``-100Δ``)."""

    scale: float = 1.0

    @property
    def knowledge(self) -> Knowledge:
        return Knowledge.OWN

    def __call__(self, view: AttackView, generator: torch.Generator | None = None) -> Tensor:
        return -self.scale * view.require_own("SignFlipping")


@dataclass(frozen=True)
class GaussianAttack(Attack):
    """Each Byzantine worker sends an independent draw of ``N(mean, std² I)`` (all the same
    draw with ``shared=True``), centred at the mean of the honest uploads with
    ``around_honest_mean=True``.

    The papers' settings: Xiang et al. ``std = σ / b_c`` (noise matched to honest DP
    uploads); Ye et al. ``std = 30`` (code: around the honest mean); Zhu and Ling
    ``std = 10⁴`` on models, one draw shared by all.
    """

    std: float
    mean: float = 0.0
    around_honest_mean: bool = False
    shared: bool = False

    def __post_init__(self) -> None:
        if not self.std >= 0:
            raise AttackError(f"std must be >= 0, got {self.std}")

    @property
    def knowledge(self) -> Knowledge:
        return Knowledge.OMNISCIENT if self.around_honest_mean else Knowledge.NONE

    def __call__(self, view: AttackView, generator: torch.Generator | None = None) -> Tensor:
        gen = _need_generator(generator, "GaussianAttack")
        like = view.template()
        rows = 1 if self.shared else view.num_byzantine
        noise = torch.randn(rows, view.d, generator=gen, device=gen.device, dtype=like.dtype)
        out = (self.mean + self.std * noise).to(like.device)
        if self.around_honest_mean:
            out = out + view.require_honest("GaussianAttack(around_honest_mean)").mean(dim=0)
        return out.expand(view.num_byzantine, -1).clone() if self.shared else out


@dataclass(frozen=True)
class FallOfEmpires(Attack):
    """Every Byzantine worker sends ``beta · mean(reference updates)``.

    * ``reference="byzantine"``: SHARE's modified Fall of Empires, the mean of the
      Byzantine workers' own updates with ``beta ∈ {-1, -10}``;
    * ``reference="honest"``: inner-product manipulation (Xie et al., 2020), ``-ε`` times
      the honest mean (``beta = -ε``; see :func:`inner_product_manipulation`).
    """

    beta: float
    reference: Reference = "byzantine"

    @property
    def knowledge(self) -> Knowledge:
        return Knowledge.OMNISCIENT if self.reference == "honest" else Knowledge.OWN

    def __call__(self, view: AttackView, generator: torch.Generator | None = None) -> Tensor:
        mean = view.reference(self.reference, "FallOfEmpires").mean(dim=0)
        return _repeat(self.beta * mean, view.num_byzantine)


def inner_product_manipulation(epsilon: float) -> FallOfEmpires:
    """Inner-product manipulation (Xie et al., 2020): ``-ε`` times the mean honest upload."""
    return FallOfEmpires(beta=-epsilon, reference="honest")


def alie_z_max(num_workers: int, num_byzantine: int) -> float:
    """Baruch et al.'s ``z_max``: with ``s = ⌊n/2 + 1⌋ - b`` honest workers to win over,
    ``z_max = Φ^{-1}((n - s) / n)`` (negative when the Byzantine workers are few)."""
    n, b = num_workers, num_byzantine
    if not 0 <= b < n:
        raise AttackError(f"need 0 <= num_byzantine < num_workers, got {b} and {n}")
    s = math.floor(n / 2 + 1) - b
    p = (n - s) / n
    if p >= 1:
        return math.inf
    return float(torch.special.ndtri(torch.tensor(p, dtype=torch.float64)))


@dataclass(frozen=True)
class ALittleIsEnough(Attack):
    """A little is enough (Baruch et al., 2019): every Byzantine worker sends
    ``μ - z σ``, with ``μ`` and ``σ`` the coordinate-wise mean and (population) standard
    deviation of the reference updates.

    ``z`` is fixed when given (ByzFL's ``tau``, with the opposite sign) and otherwise
    :func:`alie_z_max` of the ``num_workers`` workers and ``b`` Byzantine ones
    (``num_workers`` defaults to ``h + b`` when the honest uploads are known).
    """

    z: float | None = None
    reference: Reference = "honest"
    num_workers: int | None = None

    @property
    def knowledge(self) -> Knowledge:
        return Knowledge.OMNISCIENT if self.reference == "honest" else Knowledge.OWN

    def z_for(self, view: AttackView) -> float:
        """The ``z`` used for this view."""
        if self.z is not None:
            return self.z
        n = self.num_workers or view.num_workers
        if n is None:
            raise AttackError("ALittleIsEnough needs num_workers (or the honest uploads)")
        return alie_z_max(n, view.num_byzantine)

    def __call__(self, view: AttackView, generator: torch.Generator | None = None) -> Tensor:
        ref = view.reference(self.reference, "ALittleIsEnough")
        mean = ref.mean(dim=0)
        std = ref.std(dim=0, correction=0)
        return _repeat(mean - self.z_for(view) * std, view.num_byzantine)


@dataclass(frozen=True)
class OLMP(Attack):
    """Optimised local model poisoning as adapted by Xiang et al. (Eq. 8-10): with ``B``
    honest uploads ``g_j`` and ``M`` Byzantine workers, every Byzantine worker sends

        g_M = -(1 + λ) / M · Σ_j g_j  with  λ = M / sqrt(B) - 1,  i.e.  -Σ_j g_j / sqrt(B),

    which drives the aggregate against the honest sum while each upload's noise part stays
    ``N(0, σ²)`` (it passes the norm and KS tests). The attack exists only when
    ``M > sqrt(B)`` (λ > 0); otherwise :class:`AttackError`.
    """

    @property
    def knowledge(self) -> Knowledge:
        return Knowledge.OMNISCIENT

    def __call__(self, view: AttackView, generator: torch.Generator | None = None) -> Tensor:
        honest = view.require_honest("OLMP")
        B, M = honest.shape[0], view.num_byzantine
        if math.sqrt(B) >= M:
            raise AttackError(
                f"OLMP needs more Byzantine workers than sqrt(honest workers): M = {M}, "
                f"sqrt(B) = {math.sqrt(B):.3f}; the attack does not exist for these numbers"
            )
        return _repeat(-honest.sum(dim=0) / math.sqrt(B), M)


@dataclass(frozen=True)
class MinMax(Attack):
    """AGR-agnostic Min-Max (Shejwalkar and Houmansadr, NDSS 2021): every Byzantine worker
    sends ``μ + γ p``, with ``μ`` the mean of the reference updates, ``p`` the perturbation
    (``"unit"``: ``-μ/‖μ‖``; ``"std"``: minus the coordinate-wise standard deviation;
    ``"sign"``: ``-sign(μ)``) and ``γ`` the largest value such that the malicious vector
    is no farther from any reference update than the two farthest reference updates are
    from each other. The paper finds ``γ`` by bisection; ``‖μ + γp - x_i‖²`` is quadratic
    in ``γ``, so it is solved exactly here.
    """

    perturbation: Literal["unit", "std", "sign"] = "unit"
    reference: Reference = "honest"

    @property
    def knowledge(self) -> Knowledge:
        return Knowledge.OMNISCIENT if self.reference == "honest" else Knowledge.OWN

    def direction(self, ref: Tensor) -> Tensor:
        """The perturbation ``p`` for the reference updates ``ref``."""
        mean = ref.mean(dim=0)
        if self.perturbation == "unit":
            norm = mean.norm()
            return -mean / norm if norm > 0 else torch.zeros_like(mean)
        if self.perturbation == "std":
            return -ref.std(dim=0, correction=0)
        if self.perturbation == "sign":
            return -torch.sign(mean)
        raise AttackError(
            f"perturbation must be 'unit', 'std' or 'sign', got {self.perturbation!r}"
        )

    def gamma(self, ref: Tensor) -> float:
        """The largest ``γ >= 0`` keeping ``μ + γp`` within the reference diameter."""
        work = ref.to(torch.float64)
        mean = work.mean(dim=0)
        p = self.direction(work)
        a = float(p.square().sum())
        if a == 0:
            return 0.0
        diameter_sq = float(torch.cdist(work, work).max() ** 2)
        offsets = mean - work  # [h, d]
        b = 2.0 * (offsets @ p)
        c = offsets.square().sum(dim=1) - diameter_sq  # <= 0: the mean is inside the hull
        roots = (-b + (b.square() - 4.0 * a * c).clamp_min(0.0).sqrt()) / (2.0 * a)
        return max(0.0, float(roots.min()))

    def __call__(self, view: AttackView, generator: torch.Generator | None = None) -> Tensor:
        ref = view.reference(self.reference, "MinMax")
        mean = ref.mean(dim=0)
        malicious = mean + self.gamma(ref) * self.direction(ref)
        return _repeat(malicious.to(ref.dtype), view.num_byzantine)


@dataclass(frozen=True)
class Mimic(Attack):
    """Every Byzantine worker sends a copy of honest upload ``target`` (Zhu and Ling's
    sample-duplicating attack copies regular worker 0; ByzFL's ``Mimic(epsilon)``). In
    DP-RSA the copied message is the target's *unperturbed* sign (the code's choice)."""

    target: int = 0

    @property
    def knowledge(self) -> Knowledge:
        return Knowledge.OMNISCIENT

    def __call__(self, view: AttackView, generator: torch.Generator | None = None) -> Tensor:
        honest = view.require_honest("Mimic")
        if not 0 <= self.target < honest.shape[0]:
            raise AttackError(f"target {self.target} is not one of the {honest.shape[0]} honest")
        return _repeat(honest[self.target], view.num_byzantine)


SampleDuplicating = Mimic
"""Zhu and Ling's name for :class:`Mimic`."""


@dataclass(frozen=True)
class Isolation:
    """Ye et al.'s isolation attack on decentralized SGD: the Byzantine neighbours of agent
    ``n`` all send ``b = (x_n - Σ_{m ∈ R_n ∪ {n}} w'_nm x_m) / Σ_{b ∈ B_n} w'_nb``, so the
    Metropolis-Hastings mix of agent ``n`` returns its own model: it learns nothing from its
    neighbours. Omniscient: it needs the receiver's and its honest neighbours' models.
    """

    @property
    def knowledge(self) -> Knowledge:
        return Knowledge.OMNISCIENT

    def __call__(
        self,
        receiver: Tensor,
        honest_neighbours: Tensor,
        honest_weights: Tensor,
        byzantine_weights: Tensor,
        self_weight: float | None = None,
    ) -> Tensor:
        """The ``[len(byzantine_weights), d]`` messages sent to the receiver.

        ``self_weight`` defaults to ``1 - Σ honest_weights - Σ byzantine_weights`` (MH).
        """
        hw = torch.as_tensor(honest_weights, dtype=torch.float64)
        bw = torch.as_tensor(byzantine_weights, dtype=torch.float64)
        if bw.numel() == 0 or float(bw.sum()) <= 0:
            raise AttackError("Isolation needs at least one Byzantine neighbour with weight > 0")
        if hw.shape != (honest_neighbours.shape[0],):
            raise AttackError("honest_weights must have one weight per honest neighbour")
        w_self = 1.0 - float(hw.sum() + bw.sum()) if self_weight is None else self_weight
        work = receiver.to(torch.float64)
        mixed = w_self * work + hw.to(receiver.device) @ honest_neighbours.to(torch.float64)
        message = (work - mixed) / float(bw.sum())
        return _repeat(message.to(receiver.dtype), bw.numel())


@dataclass(frozen=True)
class TimeToBeByzantine(Attack):
    """Xiang et al.'s adaptive attacker: behave honestly until round
    ``start · num_rounds``, then run ``attack``. Honest behaviour is copying the uploads of
    random honest workers (``before="copy_honest"``, the paper's; omniscient) or sending the
    Byzantine workers' own honest updates (``before="own"``)."""

    attack: Attack
    start: float
    before: Literal["copy_honest", "own"] = "copy_honest"

    def __post_init__(self) -> None:
        if not 0 <= self.start <= 1:
            raise AttackError(f"start must be a fraction of training in [0, 1], got {self.start}")

    @property
    def knowledge(self) -> Knowledge:
        early = Knowledge.OMNISCIENT if self.before == "copy_honest" else Knowledge.OWN
        order = list(Knowledge)
        return max(early, self.attack.knowledge, key=order.index)

    def active(self, view: AttackView) -> bool:
        """Whether the attack is on in ``view.round``."""
        if view.num_rounds is None:
            raise AttackError("TimeToBeByzantine needs view.num_rounds")
        return view.round >= self.start * view.num_rounds

    def __call__(self, view: AttackView, generator: torch.Generator | None = None) -> Tensor:
        if self.active(view):
            return self.attack(view, generator)
        if self.before == "own":
            return view.require_own("TimeToBeByzantine").clone()
        honest = view.require_honest("TimeToBeByzantine")
        gen = _need_generator(generator, "TimeToBeByzantine")
        picks = torch.randint(
            honest.shape[0], (view.num_byzantine,), generator=gen, device=gen.device
        )
        return honest[picks.to(honest.device)].clone()


UPDATE_ATTACKS: dict[str, Callable[..., Attack]] = {
    "sign_flipping": SignFlipping,
    "gaussian": GaussianAttack,
    "fall_of_empires": FallOfEmpires,
    "ipm": inner_product_manipulation,
    "alie": ALittleIsEnough,
    "olmp": OLMP,
    "minmax": MinMax,
    "mimic": Mimic,
}
"""``attack.name`` → what builds the attack on uploads from ``attack`` options."""

ATTACKS = ("none", "label_flipping", *UPDATE_ATTACKS)
"""The federated loop's ``attack.name`` values (``label_flipping`` poisons the data)."""


@dataclass(frozen=True)
class AttackPlan:
    """How the Byzantine clients behave.

    Attributes:
        name: the configured attack name.
        label_flipping: they train on flipped labels (data poisoning).
        update_attack: otherwise, the update attack producing their uploads.
        batch_size: examples per step of their (poisoned) training; ``None``: the honest B.
    """

    name: str
    label_flipping: bool
    update_attack: Attack | None
    batch_size: int | None


def build_attack(name: str, options: dict[str, Any], *, noise_std: float) -> AttackPlan:
    """The attack ``name`` of :data:`ATTACKS` with ``options``; ``std = "dp"`` in a
    Gaussian attack means the honest uploads' noise level σ / B (the DP filter's choice, so the
    attack passes FirstAGG). Raises :class:`SimulationConfigError` naming the key."""
    options = dict(options)
    batch_size = options.pop("batch_size", None)
    if name not in ATTACKS:
        raise SimulationConfigError(f"attack.name must be one of {ATTACKS}, got {name!r}")
    if name in ("none", "label_flipping"):
        return AttackPlan(name, name == "label_flipping", None, batch_size)
    if name == "gaussian" and options.get("std") == "dp":
        if noise_std <= 0:
            raise SimulationConfigError('attack std = "dp" needs a private run (privacy.enabled)')
        options["std"] = noise_std
    attack = construct("attack", name, UPDATE_ATTACKS[name], options)
    return AttackPlan(name, False, attack, batch_size)


__all__ = [
    "ATTACKS",
    "OLMP",
    "UPDATE_ATTACKS",
    "ALittleIsEnough",
    "Attack",
    "AttackError",
    "AttackPlan",
    "AttackView",
    "FallOfEmpires",
    "GaussianAttack",
    "Isolation",
    "Knowledge",
    "LabelFlipping",
    "Mimic",
    "MinMax",
    "SampleDuplicating",
    "SignFlipping",
    "TimeToBeByzantine",
    "alie_z_max",
    "build_attack",
    "inner_product_manipulation",
]
