"""Differential privacy for clients and its accounting (not yet implemented)."""
