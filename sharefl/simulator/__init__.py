"""Simulation: datasets, models, attacks and training loops.

Built so far: :mod:`sharefl.simulator.attacks` (the Byzantine attacks of the five papers).
"""
