"""Hostile protocol messages for the tests: a message whose fields its constructor would
refuse (:class:`~sharefl.protocol.errors.MalformedMessage`), built without running the
check — what a hostile peer's own code could put on the wire. The codecs and the state
machines must refuse it all the same."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def unchecked(cls: type[T], *args: Any, **kwargs: Any) -> T:
    """``cls(*args, **kwargs)`` for a frozen dataclass ``cls``, ``__post_init__`` skipped."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    values = dict(zip((f.name for f in fields), args, strict=False))
    values.update(kwargs)
    instance = object.__new__(cls)
    for f in fields:
        if f.name in values:
            value = values[f.name]
        elif f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            raise TypeError(f"{cls.__name__} needs {f.name}")
        object.__setattr__(instance, f.name, value)
    return instance


def unchecked_replace(instance: T, **changes: Any) -> T:
    """``dataclasses.replace(instance, **changes)`` without the constructor's check."""
    fields = {f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)}  # type: ignore[arg-type]
    return unchecked(type(instance), **{**fields, **changes})
