"""README stays true: its Python examples run, and CI runs its test command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
EXAMPLES = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_readme_has_examples():
    assert len(EXAMPLES) >= 3


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_readme_example_runs(index, capsys):
    exec(compile(EXAMPLES[index], f"README example {index}", "exec"), {})


def test_ci_runs_the_readme_test_command():
    block = README.split("<!-- test-command -->", 1)[1].split("<!-- /test-command -->", 1)[0]
    command = re.search(r"```bash\n(.*?)\n```", block, flags=re.S).group(1)
    assert "pip install torch==2.13.0" in command and "pytest" in command
    assert "README.md" in (ROOT / ".ci" / "run").read_text()
