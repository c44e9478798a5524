"""Packages whose names load on first use: ``sharefl.privacy`` (so that its torch-free
modules import without torch) and ``sharefl.integrations.flower`` (so that a ClientApp
process, which needs only the mod, starts without torch). The names a type checker sees
(the ``TYPE_CHECKING`` imports) are the names the package serves, each the object of its
module; and the client side really imports no torch."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _type_checking_imports(package: str) -> dict[str, str]:
    """name → submodule, from the ``if TYPE_CHECKING:`` block of ``package``'s __init__."""
    path = ROOT / package.replace(".", "/") / "__init__.py"
    names: dict[str, str] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.level == 1
                names.update({alias.name: stmt.module for alias in stmt.names})
    return names


def test_privacy_serves_exactly_what_type_checkers_see():
    privacy = importlib.import_module("sharefl.privacy")
    seen = _type_checking_imports("sharefl.privacy")
    served = {name: module for module, names in privacy.EXPORTS.items() for name in names}
    assert seen == served
    assert privacy.__all__ == sorted(served)
    for name, module in served.items():
        owner = importlib.import_module(f"sharefl.privacy.{module}")
        assert getattr(privacy, name) is getattr(owner, name), name
    assert set(privacy.__all__) <= set(dir(privacy))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = privacy.Nope


def test_flower_serves_its_server_side_as_type_checkers_see_it():
    pytest.importorskip("flwr")
    flower = importlib.import_module("sharefl.integrations.flower")
    workflow = importlib.import_module("sharefl.integrations.flower.workflow")
    seen = _type_checking_imports("sharefl.integrations.flower")
    assert set(seen.values()) == {"workflow"}
    assert set(seen) == set(flower.SERVER_SIDE)
    for name in flower.__all__:
        assert getattr(flower, name) is not None, name
    for name in flower.SERVER_SIDE:
        assert getattr(flower, name) is getattr(workflow, name), name


@pytest.mark.parametrize(
    "statement",
    [
        "from sharefl.integrations.flower import sharefl_mod, make_sharefl_mod",
        "import sharefl.privacy.distributed, sharefl.privacy.distributed_accounting",
    ],
)
def test_the_client_side_imports_no_torch(statement):
    if "flower" in statement:
        pytest.importorskip("flwr")
    code = (
        f"import sys; {statement}; print(sorted(m for m in ('torch', 'scipy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
