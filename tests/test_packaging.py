"""The package's dependency promises: the secure layer imports only numpy and cryptography,
and a command whose extra is missing says what to install instead of a traceback."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ("torch", "grpc", "google.protobuf", "scipy", "matplotlib", "dp_accounting", "flwr")


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)


def test_the_core_imports_no_optional_dependency():
    done = _python(
        "import sys\n"
        "import sharefl.crypto, sharefl.protocol\n"
        "from sharefl.protocol import secure_sum, RoundCoordinator, ClientRound\n"
        f"print([m for m in {OPTIONAL!r} if m in sys.modules])\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_core_needs_only_numpy_and_cryptography():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = sorted(d.split(">")[0].split("=")[0].strip() for d in project["dependencies"])
    assert names == ["cryptography", "numpy"]
    extras = project["optional-dependencies"]
    assert {"grpc", "sim", "flower", "all", "test"} <= extras.keys()
    assert "sharefl[all]" in extras["test"]


def test_a_command_without_its_extra_says_what_to_install(tmp_path):
    done = _python(
        "import sys\n"
        "sys.modules['grpc'] = None  # as if sharefl[grpc] were not installed\n"
        "from sharefl.cli import main\n"
        f"sys.exit(main(['serve', '--config', {str(tmp_path / 'x.toml')!r}]))\n"
    )
    assert done.returncode == 2
    # sharefl is not on the package index: the hint names this source tree, never
    # "sharefl[grpc]" (tests/test_install_hint.py runs the command it names)
    assert 'install -e ".[grpc]"' in done.stderr and "Traceback" not in done.stderr
    assert "sharefl[" not in done.stderr


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_has_one_source():
    """pyproject reads sharefl.__version__; no other file states it."""
    config = _pyproject()
    assert "version" not in config["project"]
    assert "version" in config["project"]["dynamic"]
    assert config["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "sharefl.__version__"}
    from setuptools.config.pyprojecttoml import read_configuration

    import sharefl

    expanded = read_configuration(ROOT / "pyproject.toml", expand=True)
    assert expanded["project"]["version"] == sharefl.__version__


def test_the_package_ships_its_annotations():
    assert (ROOT / "sharefl" / "py.typed").is_file()
    assert "py.typed" in _pyproject()["tool"]["setuptools"]["package-data"]["sharefl"]


def test_the_checking_tools_are_pinned_and_installed_at_their_pins():
    """CI enforces ruff, import-linter and mypy: their versions come from pyproject alone."""
    from importlib.metadata import version

    test_extra = _pyproject()["project"]["optional-dependencies"]["test"]
    pins = dict(r.split("==") for r in test_extra if "==" in r)
    for tool in ("ruff", "import-linter", "mypy"):
        assert tool in pins, f"pin {tool} exactly in the [test] extra"
        assert version(tool) == pins[tool], f"installed {tool} {version(tool)} != {pins[tool]}"


def test_mypy_is_strict_for_the_secure_layer_and_the_transport():
    """.ci/run runs mypy; pyproject makes it strict for crypto and protocol, and types the
    gRPC transport (the code that parses hostile bytes) fully; every body is checked."""
    mypy = _pyproject()["tool"]["mypy"]
    assert mypy["packages"] == ["sharefl"] and mypy["check_untyped_defs"] is True
    strict = {
        module: o
        for o in mypy["overrides"]
        if o.get("disallow_untyped_defs")
        for module in o["module"]
    }
    secure = strict["sharefl.protocol.*"]
    assert strict["sharefl.crypto.*"] is secure
    for flag in ("disallow_any_generics", "warn_return_any", "no_implicit_reexport"):
        assert secure[flag] is True
    for flag in ("disallow_any_generics", "warn_return_any", "disallow_incomplete_defs"):
        assert strict["sharefl.deploy.*"][flag] is True
    assert "\nmypy\n" in (ROOT / ".ci" / "run").read_text()


def test_hypothesis_budgets_come_from_the_profiles():
    """No test fixes its own budget: each passes it through ``conftest.examples`` (or
    ``SEARCH_EXAMPLES``), so the ``slow`` profile raises every search to >= 10,000."""
    import re

    fixed = [
        f"{path.name}:{number}"
        for path in sorted((ROOT / "tests").glob("test_*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"max_examples\s*=\s*\d", line)
    ]
    assert not fixed, f"hard-coded hypothesis budgets (use conftest.examples(n)): {fixed}"
