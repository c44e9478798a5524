"""README and docs/ stay true.

- every Python example runs, and where a ```text block follows it, prints exactly that;
- every relative link points at a file that exists (and a heading that exists, for
  ``#anchors``);
- every ``sharefl`` command parses with the real parser, and every repository file a
  command names exists (``experiments/...``, ``benchmarks/...``);
- CI runs README's test command, and that command installs what the main job needs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from sharefl.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TEXT = {page: page.read_text() for page in PAGES}
README = TEXT[ROOT / "README.md"]

# A ```python block, optionally followed (after at most one line of prose) by the ```text
# block of what it prints.
_EXAMPLE = re.compile(r"```python\n(.*?)```\n(?:\n?[^\n`]*\n\n```text\n(.*?)```)?", re.S)
EXAMPLES = [
    (page, i, code, printed)
    for page in PAGES
    for i, (code, printed) in enumerate(_EXAMPLE.findall(TEXT[page]))
]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_PLACEHOLDER = re.compile(r"[<\[|]|^\.\.\.$|^[A-Z][A-Z_]+(:[A-Z]+)?$")
"""A word of a command template: <file>, [--json], cpu|cuda, FILE, HOST:PORT."""
_REPO_DIRS = ("experiments/", "benchmarks/", "examples/", "tests/", "docs/", "sharefl/")


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_readme_is_short_and_has_a_checked_example():
    assert len(README.splitlines()) <= 160
    assert any(page.name == "README.md" and printed for page, _, _, printed in EXAMPLES)
    assert len(EXAMPLES) >= 6


@pytest.mark.parametrize(
    "page, index, code, printed",
    EXAMPLES,
    ids=[f"{_name(p)}:{i}" for p, i, _, _ in EXAMPLES],
)
def test_example_runs_and_prints_what_the_page_says(page, index, code, printed, monkeypatch):
    monkeypatch.chdir(ROOT)  # examples name repository files (experiments/...)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"{_name(page)} example {index}", "exec"), {})
    if printed:
        assert out.getvalue() == printed


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    body = re.sub(r"```.*?```", "", TEXT[page], flags=re.S)
    return {_slug(m) for m in re.findall(r"^#+ (.*)$", body, flags=re.M)}


LINKS = [
    (page, target)
    for page in PAGES
    for target in _LINK.findall(re.sub(r"```.*?```", "", TEXT[page], flags=re.S))
    if not target.startswith(("http://", "https://", "mailto:"))
]


def test_pages_have_links():
    assert len(LINKS) >= 15


@pytest.mark.parametrize("page, target", LINKS, ids=[f"{_name(p)}->{t}" for p, t in LINKS])
def test_link_points_at_something_that_exists(page, target):
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    assert file.exists(), f"{_name(page)} links to {target}: no such file"
    if anchor:
        assert file.suffix == ".md"
        assert anchor in _anchors(file), f"{_name(page)} links to {target}: no such heading"


def _commands(text: str) -> list[tuple[str, bool]]:
    """``sharefl ...`` and ``python ...`` commands as (command, complete): lines of ```bash
    blocks (split at ``&&``) are complete command lines; inline code spans may be fragments
    that mention a subcommand and some of its options."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            found += [(part.strip(), True) for part in line.split("&&")]
    body = re.sub(r"```.*?```", "", text, flags=re.S)
    found += [(" ".join(span.split()), False) for span in re.findall(r"`([^`]+)`", body)]
    return [(c, whole) for c, whole in found if c.startswith(("sharefl ", "python "))]


COMMANDS = sorted({(page, *found) for page in PAGES for found in _commands(TEXT[page])})


def test_pages_have_commands():
    assert sum(whole for _, _, whole in COMMANDS) >= 15


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


@pytest.mark.parametrize(
    "page, command, whole", COMMANDS, ids=[f"{_name(p)}:{c[:60]}" for p, c, _ in COMMANDS]
)
def test_command_is_valid(page, command, whole):
    words = shlex.split(command)
    template = [i for i, w in enumerate(words) if _PLACEHOLDER.search(w)]
    if template:  # e.g. `sharefl simulate FILE`, experiments/<file>: check the words before
        words = words[: template[0]]
    for word in words:
        path = word.split(":", 1)[0]
        if path.startswith(_REPO_DIRS):
            assert (ROOT / path).exists(), f"{_name(page)}: `{command}` names {path}: missing"
    if words[0] != "sharefl":
        return
    parser = build_parser()
    if whole and not template:
        try:
            parser.parse_args(words[1:])
        except SystemExit as exc:  # --help / --version exit 0, a bad command line exits 2
            assert exc.code == 0, f"{_name(page)}: `{command}` does not parse"
        return
    # A fragment: its subcommand exists and has every option the fragment names.
    if words[1:2] == ["--debug"]:  # the one option before the subcommand
        words = [words[0], *words[2:]]
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    if len(words) < 2 or words[1].startswith("-"):
        assert set(words[1:]) <= _options(parser), f"{_name(page)}: `{command}`"
        return
    assert words[1] in subparsers.choices, f"{_name(page)}: `{command}`: no such subcommand"
    named = {w.split("=", 1)[0] for w in words[2:] if w.startswith("--")}
    missing = named - _options(subparsers.choices[words[1]])
    assert not missing, f"{_name(page)}: `{command}`: sharefl {words[1]} has no {missing}"


def _block(marker: str) -> str:
    block = README.split(f"<!-- {marker} -->", 1)[1].split(f"<!-- /{marker} -->", 1)[0]
    return re.search(r"```bash\n(.*?)\n```", block, flags=re.S).group(1)


def _main_command() -> str:
    return next(c for c in re.findall(r"```bash\n(.*?)\n```", README) if "sharefl simulate" in c)


def _installs(command: str) -> list[str]:
    return [part.strip() for part in command.split("&&") if part.strip().startswith("pip ")]


def test_ci_runs_the_readme_test_command():
    command = _block("test-command")
    assert "pip install torch==2.13.0" in command and command.endswith("pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "README.md" in ci and "<!-- test-command -->" in ci


def test_ci_runs_the_slow_tests_with_the_documented_command():
    """After the default run, CI runs the tests marked slow, with the command that
    docs/contributing.md and tests/conftest.py give (the slow hypothesis profile)."""
    command = "SHAREFL_HYPOTHESIS_PROFILE=slow pytest -m slow"
    ci = (ROOT / ".ci" / "run").read_text()
    assert f'slow_command="{command}"' in ci and 'bash -euo pipefail -c "$slow_command"' in ci
    assert f"`{command}`" in (ROOT / "docs" / "contributing.md").read_text()
    assert f"``{command}``" in (ROOT / "tests" / "conftest.py").read_text()


def test_test_command_installs_what_the_main_job_needs():
    """After CI (which starts from a fresh .venv), the main job runs in that .venv."""
    test, main = _block("test-command"), _main_command()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert "sharefl[all]" in extras["test"] and "sim" in extras["all"][0]
    for install in _installs(main):
        expected = install.replace('".[sim]"', '".[test]"')
        assert expected in _installs(test), f"the test command lacks `{install}`"


def test_a_missing_reference_library_skips_locally_and_fails_under_ci(monkeypatch):
    from needs import needs

    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        needs("sharefl_no_such_module")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        needs("sharefl_no_such_module")
