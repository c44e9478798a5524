"""Privacy accounting of sampled Gaussian mechanisms, on top of Google's ``dp-accounting``.

Every DP-SGD step (example level) or FedAvg round (client level) is one Poisson-sampled
Gaussian mechanism with noise multiplier σ (noise std / l2 sensitivity) and sampling rate
q, under add/remove-one adjacency. :class:`PrivacyAccountant` records them in the style of
Opacus (``step(noise_multiplier, sample_rate, steps)``, ``get_epsilon(delta)``, a history,
a state that can be saved) and composes them with one of two backends:

- ``"rdp"`` — Rényi DP (``dp_accounting.rdp.RdpAccountant``), converted to (ε, δ) with
  ``conversion="improved"`` (Balle et al. 2020 / Canonne et al. 2020, dp-accounting's
  default) or ``conversion="classic"`` (ε = min_α RDP_α + ln(1/δ)/(α − 1), Mironov 2017:
  what TF-Privacy's moments accountant and papers of its era, e.g. Fed-αCDP, report);
- ``"pld"`` — privacy loss distributions (``dp_accounting.pld.PLDAccountant``), the
  tightest of the three.

Steps with different σ_t compose: consecutive identical (σ, q) steps are merged into one
history entry; composition is done lazily, when ε is asked for. ``dp_accounting`` (and
SciPy) are imported on first use, so importing :mod:`sharefl.privacy` stays cheap.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from os import PathLike
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import AccountantStateError, PrivacyConfigError
from .vocabulary import Backend, Conversion

if TYPE_CHECKING:
    import dp_accounting


#: Version tag of :meth:`PrivacyAccountant.state_dict`.
STATE_FORMAT = "sharefl.privacy.accountant/1"


def check_sample_rate(sample_rate: float) -> float:
    """``sample_rate`` as a float, or :class:`PrivacyConfigError` if it is outside [0, 1]."""
    rate = float(sample_rate)
    if not 0.0 <= rate <= 1.0:
        raise PrivacyConfigError(f"sample_rate must be in [0, 1], got {sample_rate!r}")
    return rate


@dataclass(frozen=True)
class AccountantStep:
    """``steps`` consecutive sampled Gaussian mechanisms with the same σ and q."""

    noise_multiplier: float
    sample_rate: float
    steps: int

    def event(self) -> dp_accounting.DpEvent:
        """The ``dp_accounting`` event of this entry."""
        import dp_accounting

        if self.sample_rate == 0.0:
            return dp_accounting.NoOpDpEvent()
        if self.noise_multiplier == 0.0:
            return dp_accounting.NonPrivateDpEvent()
        one: dp_accounting.DpEvent = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        if self.sample_rate < 1.0:
            one = dp_accounting.PoissonSampledDpEvent(self.sample_rate, one)
        return dp_accounting.SelfComposedDpEvent(one, self.steps)


class _ExcludedOrderFilter(logging.Filter):
    """Drops dp-accounting's ``WARNING:absl`` line about an RDP order α whose bound did not
    converge ("Excluding this order from the epsilon computation"): expected for large α at
    small q, one line per order and composition (136 for README's simulator example), and
    harmless, since ε is the minimum over the remaining orders and so still an upper bound."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to converge" not in str(record.msg)


def quiet_excluded_orders() -> None:
    """Install :class:`_ExcludedOrderFilter` on the ``absl`` logger (once; after absl is
    imported, so that absl keeps its own logger class)."""
    logger = logging.getLogger("absl")
    if not any(isinstance(f, _ExcludedOrderFilter) for f in logger.filters):
        logger.addFilter(_ExcludedOrderFilter())


def check_delta(delta: float) -> float:
    """``delta`` as a float, or :class:`PrivacyConfigError` unless 0 < δ < 1."""
    value = float(delta)
    if not 0.0 < value < 1.0:
        raise PrivacyConfigError(f"delta must be in (0, 1), got {delta!r}")
    return value


def check_step(noise_multiplier: float, sample_rate: float, steps: int) -> AccountantStep:
    """Validated :class:`AccountantStep` (σ ≥ 0 finite, q in [0, 1], steps an int ≥ 1)."""
    sigma = float(noise_multiplier)
    if not (math.isfinite(sigma) and sigma >= 0):
        raise PrivacyConfigError(
            f"noise_multiplier must be finite and ≥ 0, got {noise_multiplier!r}"
        )
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 1:
        raise PrivacyConfigError(f"steps must be an integer ≥ 1, got {steps!r}")
    return AccountantStep(sigma, check_sample_rate(sample_rate), int(steps))


class PrivacyAccountant:
    """(ε, δ) spent by a sequence of sampled Gaussian mechanisms.

    Args:
        backend: ``"rdp"`` or ``"pld"``.
        conversion: RDP → (ε, δ) conversion, ``"improved"`` or ``"classic"`` (RDP only).
        orders: RDP orders (default: dp-accounting's, 1.01 … 1024).
        pld_discretization: value discretisation interval of the PLD backend (smaller is
            tighter and slower; the result is always an upper bound).

    Raises:
        PrivacyConfigError: unknown backend or conversion, or a classic PLD conversion.
    """

    def __init__(
        self,
        backend: Backend = "rdp",
        *,
        conversion: Conversion = "improved",
        orders: Sequence[float] | None = None,
        pld_discretization: float = 1e-4,
    ) -> None:
        if backend not in ("rdp", "pld"):
            raise PrivacyConfigError(f"backend must be 'rdp' or 'pld', got {backend!r}")
        if conversion not in ("improved", "classic"):
            raise PrivacyConfigError(
                f"conversion must be 'improved' or 'classic', got {conversion!r}"
            )
        if backend == "pld" and conversion != "improved":
            raise PrivacyConfigError(
                "the classic conversion is an RDP → (ε, δ) bound: use backend='rdp' with it"
            )
        if orders is not None and (not orders or min(orders) <= 1):
            raise PrivacyConfigError("RDP orders must be a non-empty list of values > 1")
        if not pld_discretization > 0:
            raise PrivacyConfigError(f"pld_discretization must be > 0, got {pld_discretization!r}")
        self.backend: Backend = backend
        self.conversion: Conversion = conversion
        self.orders: tuple[float, ...] | None = None if orders is None else tuple(orders)
        self.pld_discretization = float(pld_discretization)
        self._history: list[AccountantStep] = []
        self._reset_backend()

    def _reset_backend(self) -> None:
        from dp_accounting.pld import pld_privacy_accountant
        from dp_accounting.rdp import rdp_privacy_accountant

        if self.backend == "rdp":
            self._backend: dp_accounting.PrivacyAccountant = rdp_privacy_accountant.RdpAccountant(
                self.orders
            )
        else:
            self._backend = pld_privacy_accountant.PLDAccountant(
                value_discretization_interval=self.pld_discretization
            )
        self._pending: list[AccountantStep] = list(self._history)

    @staticmethod
    def _append(entries: list[AccountantStep], entry: AccountantStep) -> None:
        last = entries[-1] if entries else None
        if last is not None and (last.noise_multiplier, last.sample_rate) == (
            entry.noise_multiplier,
            entry.sample_rate,
        ):
            entries[-1] = AccountantStep(
                last.noise_multiplier, last.sample_rate, last.steps + entry.steps
            )
        else:
            entries.append(entry)

    def step(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Record ``steps`` sampled Gaussian mechanisms with noise multiplier σ =
        ``noise_multiplier`` (0 means no noise: ε = ∞) and Poisson rate q = ``sample_rate``
        (0 means the data is never used: no cost)."""
        entry = check_step(noise_multiplier, sample_rate, steps)
        self._append(self._history, entry)
        self._append(self._pending, entry)

    @property
    def history(self) -> tuple[AccountantStep, ...]:
        """The recorded steps, consecutive identical (σ, q) merged."""
        return tuple(self._history)

    @property
    def steps(self) -> int:
        """Total number of recorded mechanisms."""
        return sum(entry.steps for entry in self._history)

    def _composed(self) -> dp_accounting.PrivacyAccountant:
        import dp_accounting

        quiet_excluded_orders()

        if self._pending:
            events = [entry.event() for entry in self._pending]
            self._backend.compose(
                events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(events)
            )
            self._pending = []
        return self._backend

    def get_epsilon(self, delta: float) -> float:
        """ε such that everything recorded so far is (ε, δ)-DP (0 if nothing was recorded,
        ∞ if a step had no noise)."""
        delta = check_delta(delta)
        backend = self._composed()
        if self.conversion == "classic":
            return classic_rdp_epsilon(backend.orders, backend.rdp, delta)
        return float(backend.get_epsilon(delta))

    def rdp_curve(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(orders, RDP at each order) of everything recorded so far (``inf`` where a
        step had no noise). Raises :class:`PrivacyConfigError` with the PLD backend, which
        keeps no RDP curve: build the accountant with ``backend="rdp"``."""
        if self.backend != "rdp":
            raise PrivacyConfigError(
                "rdp_curve needs the RDP backend: build PrivacyAccountant(backend='rdp')"
            )
        backend = self._composed()
        orders = tuple(float(a) for a in backend.orders)
        return orders, tuple(float(r) for r in backend.rdp)

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot: configuration and history."""
        return {
            "format": STATE_FORMAT,
            "backend": self.backend,
            "conversion": self.conversion,
            "orders": None if self.orders is None else list(self.orders),
            "pld_discretization": self.pld_discretization,
            "history": [[e.noise_multiplier, e.sample_rate, e.steps] for e in self._history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the history by the one in ``state`` (from an accountant configured alike).

        Raises:
            AccountantStateError: wrong format version, a different configuration (use
                :meth:`from_state_dict` to adopt it), or a malformed history.
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise AccountantStateError(
                f"not an accountant state of format {STATE_FORMAT!r}; save it with "
                "PrivacyAccountant.state_dict()"
            )
        mine = self.state_dict()
        for key in ("backend", "conversion", "orders", "pld_discretization"):
            if state.get(key) != mine[key]:
                raise AccountantStateError(
                    f"the state's {key} is {state.get(key)!r} but this accountant's is "
                    f"{mine[key]!r}; build the accountant with PrivacyAccountant."
                    "from_state_dict(state) instead"
                )
        try:
            history = [check_step(*entry) for entry in state["history"]]
        except (KeyError, TypeError, PrivacyConfigError) as exc:
            raise AccountantStateError(f"malformed accountant history: {exc}") from exc
        self._history = []
        for entry in history:
            self._append(self._history, entry)
        self._reset_backend()

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> PrivacyAccountant:
        """A new accountant with the configuration and history of ``state``."""
        try:
            accountant = cls(
                state["backend"],
                conversion=state["conversion"],
                orders=state["orders"],
                pld_discretization=state["pld_discretization"],
            )
        except (KeyError, TypeError, PrivacyConfigError) as exc:
            raise AccountantStateError(f"malformed accountant state: {exc}") from exc
        accountant.load_state_dict(state)
        return accountant

    def save(self, path: str | PathLike[str]) -> None:
        """Write :meth:`state_dict` as JSON to ``path``."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.state_dict(), f, indent=1)

    @classmethod
    def load(cls, path: str | PathLike[str]) -> PrivacyAccountant:
        """Read an accountant written by :meth:`save`."""
        try:
            with open(path, encoding="utf-8") as f:
                state = json.load(f)
        except json.JSONDecodeError as exc:
            raise AccountantStateError(f"{path} is not a JSON accountant state: {exc}") from exc
        return cls.from_state_dict(state)

    def __repr__(self) -> str:
        return (
            f"PrivacyAccountant(backend={self.backend!r}, conversion={self.conversion!r}, "
            f"steps={self.steps}, entries={len(self._history)})"
        )


def classic_rdp_epsilon(orders: Sequence[float], rdp: Sequence[float], delta: float) -> float:
    """The classic conversion ε = min_α RDP_α + ln(1/δ)/(α − 1) (Mironov 2017, Prop. 3)."""
    rdp_arr = np.asarray(rdp, dtype=np.float64)
    if not np.any(rdp_arr):
        return 0.0  # nothing composed (or only unsampled steps)
    eps = rdp_arr + math.log(1.0 / delta) / (np.asarray(orders, dtype=np.float64) - 1.0)
    return max(0.0, float(np.min(eps)))
