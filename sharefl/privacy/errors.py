"""Named exceptions of :mod:`sharefl.privacy`.

Every error a caller can cause raises a subclass of :class:`PrivacyError` whose message says
what to change. Errors that are also bad arguments derive from :class:`ValueError` too, so
generic handlers keep working.
"""

from __future__ import annotations

from sharefl.errors import ConfigurationError


class PrivacyError(ConfigurationError):
    """Base class of every error raised by :mod:`sharefl.privacy`: a configuration error
    (exit status 2)."""


class PrivacyConfigError(PrivacyError, ValueError):
    """A privacy parameter is out of range or two parameters contradict each other
    (negative noise, a sampling rate outside [0, 1], noise without a clipping bound...)."""


class UnsupportedModuleError(PrivacyError, ValueError):
    """The model contains a layer that couples the examples of a batch (BatchNorm), so
    per-example gradients, and therefore the per-example sensitivity, are undefined."""


class ScheduleError(PrivacyConfigError):
    """A noise schedule would reach σ_t ≤ 0 (no privacy) or has invalid constants."""


class AccountantStateError(PrivacyError, ValueError):
    """A saved accountant state is malformed, of another format version, or does not match
    the accountant it is loaded into."""


class CalibrationError(PrivacyError):
    """No noise multiplier within the search range reaches the target ε."""
