"""Other FL stacks driving sharefl's round coordinator.

Flower: :mod:`sharefl.integrations.flower` (needs the ``[flower]`` extra).
"""
