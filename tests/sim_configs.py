"""Helper for tests that build small simulation configurations: a base table with some
sections replaced or extended."""

from __future__ import annotations

from typing import Any


def with_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with each override applied: a table (dict) given for a table section is
    merged into it key by key, any other value replaces the entry."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out
