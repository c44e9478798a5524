"""The command a missing-extra hint names installs that extra from where the user stands:
sharefl is not on the package index, so the hint names this source tree (``"."`` from its
root, the absolute path elsewhere) and the ``pip`` of the interpreter running sharefl.

Each command is run by pip itself (``--dry-run``, offline: everything is installed in the
test environment), which resolves the path and the extra exactly as the user's run would."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sharefl import install_hint
from sharefl.install_hint import install_command, missing_module_hint

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = sorted(
    tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
)


def _dry_run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` run by bash in ``cwd`` with pip's offline dry-run options appended."""
    offline = " --dry-run --no-index --no-build-isolation --disable-pip-version-check"
    return subprocess.run(
        ["bash", "-c", command + offline], cwd=cwd, capture_output=True, text=True, env=os.environ
    )


@pytest.mark.parametrize("extra", ["grpc", "sim", "flower", "all"])
def test_the_hint_installs_its_extra_from_another_folder(extra, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    command = install_command(extra)
    assert str(ROOT) in command and extra in EXTRAS
    done = _dry_run(command, tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Would install sharefl" in done.stdout, output
    assert "does not provide the extra" not in output


def test_from_the_repository_root_the_hint_is_readmes_command(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(install_hint, "_pip", lambda: "pip")
    assert install_command("grpc") == 'pip install -e ".[grpc]"'
    done = _dry_run(install_command("grpc"), ROOT)
    assert done.returncode == 0 and "Would install sharefl" in done.stdout, done.stderr


def test_a_pip_on_path_of_another_environment_is_not_named(tmp_path, monkeypatch):
    """sharefl started as .venv/bin/sharefl without activating the environment: the bare
    ``pip`` on PATH would install elsewhere, so the hint runs this interpreter's pip."""
    foreign = tmp_path / "bin"
    foreign.mkdir()
    (foreign / "pip").write_text("#!/bin/sh\nexit 1\n")
    (foreign / "pip").chmod(0o755)
    monkeypatch.setenv("PATH", f"{foreign}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.chdir(tmp_path)
    command = install_command("grpc")
    assert command.startswith(f"{shlex.quote(sys.executable)} -m pip install -e ")
    done = _dry_run(command, tmp_path)
    assert done.returncode == 0 and "Would install sharefl" in done.stdout, done.stderr


def test_without_a_source_folder_the_hint_says_where_to_run_readmes_command(monkeypatch):
    monkeypatch.setattr(install_hint, "_source_tree", lambda: None)
    monkeypatch.setattr(install_hint, "_installed_from", lambda: None)
    monkeypatch.setattr(install_hint, "_pip", lambda: "pip")
    assert install_command("sim") == (
        'pip install -e ".[sim]" in the root of a clone of the sharefl repository'
    )


def test_a_path_with_shell_characters_is_quoted_so_that_bash_keeps_it(tmp_path, monkeypatch):
    odd = tmp_path / 'a "b" $c'
    odd.mkdir()
    monkeypatch.setattr(install_hint, "_source_tree", lambda: odd)
    monkeypatch.setattr(install_hint, "_pip", lambda: "pip")
    words = shlex.split(install_command("grpc"))
    assert words == ["pip", "install", "-e", f"{odd}[grpc]"]


def test_only_modules_of_an_extra_get_a_hint():
    assert missing_module_hint("google.protobuf") == (
        f"needs google.protobuf, which is not installed: {install_command('grpc')}"
    )
    assert missing_module_hint("PIL") is not None and "[sim]" in missing_module_hint("PIL")
    assert missing_module_hint("yaml") is None and missing_module_hint(None) is None


def test_no_page_tells_users_to_install_sharefl_from_the_index():
    pages = [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("examples/**/*.md")]
    offenders = [p.name for p in pages if 'install "sharefl[' in p.read_text(encoding="utf-8")]
    assert offenders == []
