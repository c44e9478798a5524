"""The named exception of :mod:`sharefl.simulator.leakage`."""

from __future__ import annotations


class LeakageError(ValueError):
    """A gradient-leakage call got bad input: gradients that do not match the model's
    trainable parameters, an unknown attack method or defence, a batch gradient given to
    iDLG's single-example label inference, images of the wrong shape for a metric... The
    message says what to change."""
