"""Byzantine-robust aggregators (not yet implemented)."""
