"""The command that installs a missing extra of sharefl, written so that it works from where
the user runs it.

sharefl is not on the package index: ``pip install "sharefl[grpc]"`` fails. A hint names
the source tree this sharefl runs from (an editable install or a clone on ``sys.path``),
or the folder a regular install was made from, and the ``pip`` of the interpreter that
runs sharefl. Standard library only: every extra's modules may use it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

EXTRA_OF_MODULE = {
    "grpc": "grpc",
    "google": "grpc",
    "torch": "sim",
    "scipy": "sim",
    "dp_accounting": "sim",
    "matplotlib": "sim",
    "PIL": "sim",
    "flwr": "flower",
}
"""Top-level module → the extra of ``pyproject.toml`` that installs it."""

_UNSAFE_IN_DOUBLE_QUOTES = frozenset('$`\\"!')


def install_command(extra: str) -> str:
    """A shell command that installs sharefl's ``extra`` (``"grpc"``, ``"sim"``,
    ``"flower"``, ``"all"``) into the environment running this sharefl: ``pip install -e
    "<source tree>[extra]"`` (``"."`` when that is the working directory), or, where no
    source folder is known, the README's command and the folder to run it from."""
    pip = _pip()
    source = _source_tree()
    if source is not None:
        return f"{pip} install -e {_quoted(f'{_shown(source)}[{extra}]')}"
    installed_from = _installed_from()
    if installed_from is not None:
        return f"{pip} install {_quoted(f'{_shown(installed_from)}[{extra}]')}"
    return f'{pip} install -e ".[{extra}]" in the root of a clone of the sharefl repository'


def missing_module_hint(module: str | None) -> str | None:
    """``"needs <module>, which is not installed: <install command>"`` for a module that an
    extra installs (a dotted name counts by its top-level package); ``None`` otherwise."""
    extra = EXTRA_OF_MODULE.get((module or "").split(".")[0])
    if extra is None:
        return None
    return f"needs {module}, which is not installed: {install_command(extra)}"


def _source_tree() -> Path | None:
    """The folder holding sharefl's ``pyproject.toml`` when the package runs from it."""
    root = Path(__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return None
    try:
        is_sharefl = 'name = "sharefl"' in pyproject.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return root if is_sharefl else None


def _installed_from() -> Path | None:
    """The local folder a non-editable install was made from (PEP 610's direct_url.json)."""
    try:
        text = metadata.distribution("sharefl").read_text("direct_url.json")
        url = json.loads(text or "{}").get("url", "")
    except (metadata.PackageNotFoundError, ValueError, AttributeError):
        return None
    parsed = urlparse(url)
    folder = Path(unquote(parsed.path))
    return folder if parsed.scheme == "file" and (folder / "pyproject.toml").is_file() else None


def _pip() -> str:
    """``pip`` where the ``pip`` on PATH belongs to this interpreter, else ``<python> -m
    pip`` (a sharefl started from a virtual environment that is not activated)."""
    found = shutil.which("pip")
    if found is not None and Path(found).parent == Path(sys.executable).parent:
        return "pip"
    return f"{shlex.quote(sys.executable)} -m pip"


def _shown(folder: Path) -> str:
    """``"."`` for the working directory, else the absolute path."""
    try:
        here = Path(os.getcwd()).resolve()
    except OSError:  # the working directory was removed
        return str(folder)
    return "." if folder == here else str(folder)


def _quoted(word: str) -> str:
    """``word`` in double quotes, as README writes requirements, or single-quoted when it
    holds a character that double quotes do not protect."""
    return shlex.quote(word) if set(word) & _UNSAFE_IN_DOUBLE_QUOTES else f'"{word}"'
