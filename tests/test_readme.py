"""README and docs/ stay true.

- every Python example runs, and where a ```text block follows it, prints exactly that;
- every relative link points at a file that exists (and a heading that exists, for
  ``#anchors``);
- every ``sharefl`` command parses with the real parser, and every repository file a
  command names exists (``experiments/...``, ``benchmarks/...``);
- CI runs README's test command, and that command installs what the main job needs.
"""

from __future__ import annotations

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


def _commands(text: str) -> list[str]:
    """``sharefl ...`` and ``python ...`` commands: lines of ```bash blocks (split at
    ``&&``) and inline code spans."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            found += [part.strip() for part in line.split("&&")]
    body = re.sub(r"```.*?```", "", text, flags=re.S)
    found += [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", body)]
    return [c for c in found if c.startswith(("sharefl ", "python ", "python3.11 "))]


COMMANDS = sorted({(page, command) for page in PAGES for command in _commands(TEXT[page])})


def test_pages_have_commands():
    assert len(COMMANDS) >= 20


@pytest.mark.parametrize(
    "page, command", COMMANDS, ids=[f"{_name(p)}:{c[:60]}" for p, c in COMMANDS]
)
def test_command_is_valid(page, command):
    words = shlex.split(command)
    if "<" in command:  # a template such as experiments/<file>: check the words before it
        words = words[: next(i for i, w in enumerate(words) if "<" in w)]
    files = [w for w in words if w.startswith(_REPO_DIRS)]
    for word in files:
        path = word.split(":", 1)[0]
        assert (ROOT / path).exists(), f"{_name(page)}: `{command}` names {path}: missing"
    if words[0] == "sharefl" and "<" not in command:
        try:
            build_parser().parse_args(words[1:])
        except SystemExit as exc:  # --help / --version exit 0, a bad command line exits 2
            assert exc.code == 0, f"{_name(page)}: `{command}` does not parse"


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


def test_test_command_installs_what_the_main_job_needs():
    """After CI (which starts from a fresh .venv), the main job runs in that .venv."""
    test, main = _block("test-command"), _main_command()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert "sharefl[all]" in extras["test"]
    for install in _installs(main):
        expected = install.replace('".[all]"', '".[test]"')
        assert expected in _installs(test), f"the test command lacks `{install}`"


def test_a_missing_reference_library_skips_locally_and_fails_under_ci(monkeypatch):
    from needs import needs

    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        needs("sharefl_no_such_module")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        needs("sharefl_no_such_module")
