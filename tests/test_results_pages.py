"""Every generated table of docs/results equals what its committed run folders give
(``python experiments/results_pages.py --check``), and no page grows a table by hand.

The tables are rebuilt from the committed ``config.json``/``rounds.jsonl``/``summary.json``
files and compared with the page text between its markers; nothing is trained.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pages() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "results_pages", ROOT / "experiments" / "results_pages.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


PAGES = _pages()


@pytest.mark.parametrize("block", PAGES.BLOCKS, ids=lambda b: f"{b.page}:{b.name}")
def test_each_generated_block_is_what_its_run_folders_give(block) -> None:
    text = (ROOT / PAGES.PAGES / block.page).read_text(encoding="utf-8")
    on_page = PAGES.current(text, block.name)
    assert on_page is not None, f"{block.page} lacks the markers of {block.name!r}"
    assert on_page == block.build(ROOT).strip("\n"), (
        f"{block.page}: {block.name!r} differs from {block.sources}; run "
        f"`{PAGES.COMMAND}` and commit the page"
    )


def test_every_page_is_listed_and_no_page_grows_hand_written_tables() -> None:
    pages = sorted(p.name for p in (ROOT / PAGES.PAGES).glob("*.md"))
    assert pages == sorted(PAGES.HAND_WRITTEN), "list each docs/results page in HAND_WRITTEN"
    for page in pages:
        count = PAGES.tables_outside_blocks((ROOT / PAGES.PAGES / page).read_text("utf-8"))
        allowed = PAGES.HAND_WRITTEN[page][0]
        assert count <= allowed, (
            f"{page}: {count} tables outside generated blocks, {allowed} allowed: generate the "
            f"new one from committed run folders ({PAGES.COMMAND})"
        )


def test_check_names_a_block_whose_page_was_edited_by_hand(tmp_path: Path) -> None:
    block = PAGES.BLOCKS[0]
    pages = tmp_path / PAGES.PAGES
    pages.mkdir(parents=True)
    for entry in (ROOT / PAGES.PAGES).iterdir():  # the run folders, as they are committed
        if entry.is_dir():
            (pages / entry.name).symlink_to(entry)
    text = (ROOT / PAGES.PAGES / block.page).read_text(encoding="utf-8")
    (pages / block.page).write_text(text, encoding="utf-8")
    assert PAGES.check(tmp_path, (block,)) == []
    body = PAGES.current(text, block.name)
    digit = re.search(r"[0-9]", body)
    assert digit is not None
    edited = body[: digit.start()] + str((int(digit.group()) + 1) % 10) + body[digit.end() :]
    (pages / block.page).write_text(PAGES.splice(text, block.name, edited), encoding="utf-8")
    (problem,) = PAGES.check(tmp_path, (block,))
    assert block.name in problem and block.page in problem
    # what the command writes back is the page as committed
    assert PAGES.write(tmp_path, (block,)) == [f"{block.page}: {block.name}"]
    assert (pages / block.page).read_text(encoding="utf-8") == text


def test_markers_and_table_counting() -> None:
    start, end = PAGES.markers("x y")
    text = f"a\n\n| h |\n|---|\n| 1 |\n\n{start}\n| g |\n|---|\n{end}\nb\n"
    assert PAGES.current(text, "x y") == "| g |\n|---|"
    assert PAGES.tables_outside_blocks(text) == 1
    assert PAGES.current(PAGES.splice(text, "x y", "new"), "x y") == "new"
    assert PAGES.current("no markers", "x y") is None
