"""Typed dataclasses from parsed TOML tables, with errors that name the offending key.

Both configuration files of sharefl go through :func:`build_dataclass`: the deployment file
(:mod:`sharefl.deploy.config`) and the simulation file (:mod:`sharefl.simulator.config`).
Each passes its own exception class, so a bad key surfaces as that module's named error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, get_args, get_origin, get_type_hints

#: ``(dataclass, key, value) -> value``: a hook applied to every checked leaf value
LeafHook = Callable[[type, str, Any], Any]


def check_value(where: str, value: Any, hint: Any, error: type[Exception]) -> Any:
    """Type-check one leaf against its annotation ``hint`` (ints widen to floats; bools are
    not ints). Returns the value (a float for float fields). Raises ``error`` naming
    ``where`` and the expected type."""

    def require(condition: bool, message: str) -> None:
        if not condition:
            raise error(message)

    if hint is Any:
        return value
    origin = get_origin(hint)
    if origin is dict:
        require(isinstance(value, dict), f"{where} must be a table, got {value!r}")
        return value
    if origin is list:
        require(isinstance(value, list), f"{where} must be a list, got {value!r}")
        return value
    args = get_args(hint)
    if args and type(None) in args:  # Optional[X]
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is float:
        require(
            isinstance(value, int | float) and not isinstance(value, bool),
            f"{where} must be a number, got {value!r}",
        )
        return float(value)
    if hint is bool:
        require(isinstance(value, bool), f"{where} must be true or false, got {value!r}")
    elif hint is int:
        require(
            isinstance(value, int) and not isinstance(value, bool),
            f"{where} must be an integer, got {value!r}",
        )
    elif hint is str:
        require(isinstance(value, str), f"{where} must be a string, got {value!r}")
    return value


def build_dataclass(
    cls: type,
    table: Any,
    where: str,
    error: type[Exception],
    *,
    leaf: LeafHook | None = None,
) -> Any:
    """``cls(**table)`` after checking every key: unknown keys, wrong types and nested
    tables (fields whose type is a dataclass) raise ``error`` with the dotted key path;
    so do the ``TypeError``/``ValueError`` of ``cls`` itself. ``where`` is the table's
    name ("" for the top level); ``leaf`` may rewrite checked leaf values."""
    if not isinstance(table, dict):
        raise error(f"[{where}] must be a table")
    hints = get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - known)
    if unknown:
        table_name = where or "top level"
        raise error(f"unknown key(s) in [{table_name}]: {unknown}; known: {sorted(known)}")
    values = {}
    for key, value in table.items():
        name = f"{where}.{key}" if where else key
        hint = hints[key]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            values[key] = build_dataclass(hint, value, name, error, leaf=leaf)
            continue
        value = check_value(name, value, hint, error)
        values[key] = leaf(cls, key, value) if leaf is not None else value
    try:
        return cls(**values)
    except error:
        raise
    except (TypeError, ValueError) as exc:
        raise error(f"[{where or 'top level'}]: {exc}") from exc
