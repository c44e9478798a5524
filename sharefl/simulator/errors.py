"""The base exception of :mod:`sharefl.simulator`.

Every error a user of the simulator can cause (a configuration that does not fit together,
a dataset that cannot be loaded, a model, partition, attack or report that cannot be made as
asked, bad arguments to a gradient-leakage attack) raises a subclass of
:class:`SimulatorError` whose message says what to change. The subclasses also derive from
``ValueError``, so generic handlers keep working.
"""

from __future__ import annotations

from sharefl.errors import ConfigurationError


class SimulatorError(ConfigurationError):
    """Base class of every error defined by :mod:`sharefl.simulator`: a configuration
    error (exit status 2) unless a subclass states another status."""
