"""Datasets, models, attacks and training loops (not yet implemented)."""
