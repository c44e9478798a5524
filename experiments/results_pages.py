"""Every generated table of docs/results, from the committed run folders: one command.

    python experiments/results_pages.py            # rewrite every generated block
    python experiments/results_pages.py --check    # compare; exit 1 naming each that differs
    python experiments/results_pages.py --list     # the blocks, their pages and sources

A page marks each generated block (the text between the markers is replaced whole)::

    <!-- generated: NAME (python experiments/results_pages.py) -->
    ...
    <!-- /generated: NAME -->

:data:`BLOCKS` says, per page, which function builds which block from which committed files
(run folders with ``config.json``, ``rounds.jsonl``, ``summary.json``). The functions live
in the page's own ``experiments/*_summary.py`` script, which can also print its tables
alone. ``tests/test_results_pages.py`` runs the ``--check`` for every block (it reads the
committed folders, it trains nothing) and counts the tables each page still holds outside
generated blocks (:data:`HAND_WRITTEN`): that count may fall, never rise.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import re
import sys
from collections.abc import Callable
from contextlib import redirect_stdout
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
PAGES = Path("docs/results")
COMMAND = "python experiments/results_pages.py"


@dataclass(frozen=True)
class Block:
    page: str  # under docs/results
    name: str
    sources: str  # the committed files it reads, for --list and the page's readers
    build: Callable[[Path], str]  # repository root -> the block's Markdown


@cache
def _script(name: str) -> ModuleType:
    """``experiments/<name>.py`` as a module (experiments/ is not a package)."""
    path = ROOT / "experiments" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"experiments_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _atoms(root: Path) -> str:
    return str(_script("atoms_summary").tables(root, {}))


def _decentralized_50k(root: Path) -> str:
    summary = _script("decentralized_summary")
    out = io.StringIO()
    with redirect_stdout(out):
        summary.print_tables(summary.rows_of(root / summary.RUNS_50K, 1000, 20), 1000, 20)
    return out.getvalue().strip("\n")


@cache
def _blocks(script: str, root: Path) -> dict[str, str]:
    """``experiments/<script>.py``'s ``blocks(root)``, built once per process: a script builds
    all of its page's tables together, and its folders do not change while this runs."""
    return dict(_script(script).blocks(root))


def _block(script: str, name: str) -> Callable[[Path], str]:
    """Block ``name`` of ``experiments/<script>.py``'s ``blocks(root)``."""

    def build(root: Path) -> str:
        return str(_blocks(script, root)[name])

    return build


_DDP_RUNS = "docs/results/distributed-dp/runs-20/"
BLOCKS: tuple[Block, ...] = (
    Block(
        "README.md",
        "main job",
        "docs/results/main-job/{simulate,launch}/",
        _block("main_job_summary", "main job"),
    ),
    Block(
        "atoms.md",
        "atoms tables",
        "docs/results/atoms/{runs-200,quickstart,dropouts.json}, docs/results/share/runs-200/",
        _atoms,
    ),
    Block(
        "decentralized.md",
        "decentralized runs-50k table",
        "docs/results/decentralized/runs-50k/",
        _decentralized_50k,
    ),
    Block(
        "decentralized.md",
        "decentralized table I",
        "experiments/decentralized_table1.py (computed from the code, no folders)",
        _block("decentralized_table1", "decentralized table I"),
    ),
    Block(
        "decentralized.md",
        "decentralized privacy",
        "experiments/decentralized_privacy.py (computed from the code, no folders)",
        _block("decentralized_privacy", "decentralized privacy"),
    ),
    Block(
        "decentralized.md",
        "decentralized dlg",
        "docs/results/decentralized/dlg.json",
        _block("decentralized_dlg", "decentralized dlg"),
    ),
    *(
        Block(
            "share.md",
            f"share {fig} 200",
            f"docs/results/share/runs-200/{fig}/",
            _block("share_summary", f"share {fig} 200"),
        )
        for fig in ("figure2", "figure3b", "figure9")
    ),
    Block(
        "share.md",
        "share audit draws",
        "docs/results/share/audit-draws.json",
        _block("share_summary", "share audit draws"),
    ),
    Block(
        "share.md",
        "share dp clients",
        "docs/results/share/dp-clients/",
        _block("share_summary", "share dp clients"),
    ),
    *(
        Block(
            "share.md",
            f"share protocol {part}",
            "docs/results/share/protocol-cell/" + extra,
            _block("share_summary", f"share protocol {part}"),
        )
        for part, extra in (("cell", ""), ("stages", "stages.json"))
    ),
    *(
        Block(
            "share.md",
            f"share {fig}",
            f"docs/results/share/runs-30/{folder}/",
            _block("share_summary", f"share {fig}"),
        )
        for fig, folder in (
            ("figure2", "figure2"),
            ("figure3a", "figures-3a-3c"),
            ("figure3c", "figures-3a-3c"),
            ("figure5", "figures-5-8"),
            ("figure6", "figures-6-7"),
            ("figure7", "figures-6-7"),
            ("figure8", "figures-5-8"),
            ("leak audit", "leak-audit"),
        )
    ),
    *(
        Block(
            "distributed-dp.md",
            f"distributed-dp {part}",
            _DDP_RUNS + extra,
            _block("distributed_dp_summary", f"distributed-dp {part}"),
        )
        for part, extra in (
            ("results", ""),
            ("pooled", ""),
            ("provenance", ""),
            ("changes", ", docs/results/distributed-dp/runs.json"),
            ("seeds", ""),
        )
    ),
    Block(
        "dp-rsa.md",
        "dp-rsa eps",
        "docs/results/dp-rsa/runs-eps/",
        _block("dp_rsa_summary", "dp-rsa eps"),
    ),
    *(
        Block(
            "dp-rsa.md",
            f"dp-rsa {part}",
            f"docs/results/dp-rsa/{part}/",
            _block("dp_rsa_summary", f"dp-rsa {part}"),
        )
        for part in ("figure6", "figure7", "secure")
    ),
    *(
        Block(
            "dp-rsa.md",
            f"dp-rsa figure1 {panel}",
            "docs/results/dp-rsa/runs-eps/, docs/results/dp-rsa/baselines/",
            _block("dp_rsa_summary", f"dp-rsa figure1 {panel}"),
        )
        for panel in ("gaussian", "sign-flipping", "sample-duplicating")
    ),
    Block(
        "dp-rsa.md",
        "dp-rsa figure3-4 gaussian",
        "docs/results/dp-rsa/runs-eps/",
        _block("dp_rsa_summary", "dp-rsa figure3-4 gaussian"),
    ),
    *(
        Block(
            "dp-filter.md",
            f"dp-filter {part}",
            "docs/results/dp-filter/, experiments/dp_filter_mnist_*.toml",
            _block("dp_filter_summary", f"dp-filter {part}"),
        )
        for part in ("main", "figure1 levels", "table5", "belief", "table2 attacks")
    ),
    Block(
        "fed-cdp.md",
        "fed-cdp table III",
        "docs/results/fed-cdp/table3-leakage.json",
        _block("fed_cdp_summary", "fed-cdp table III"),
    ),
    Block(
        "fed-cdp.md",
        "fed-cdp sigma arithmetic",
        "docs/results/fed-cdp/sigma-arithmetic.json",
        _block("fed_cdp_summary", "fed-cdp sigma arithmetic"),
    ),
    Block(
        "fed-cdp.md",
        "fed-cdp sigma probe",
        "docs/results/fed-cdp/sigma-probe/",
        _block("fed_cdp_summary", "fed-cdp sigma probe"),
    ),
    Block(
        "fed-cdp.md",
        "fed-cdp layer noise",
        "docs/results/fed-cdp/layer-noise/",
        _block("fed_cdp_summary", "fed-cdp layer noise"),
    ),
    Block(
        "fed-cdp.md",
        "fed-cdp table10",
        "docs/results/fed-cdp/table10/",
        _block("fed_cdp_summary", "fed-cdp table10"),
    ),
    Block(
        "fed-cdp.md",
        "fed-cdp table IV (small)",
        "docs/results/fed-cdp/table4-small/",
        _block("fed_cdp_summary", "fed-cdp table IV (small)"),
    ),
    Block(
        "fed-cdp.md",
        "fed-cdp table VI",
        "docs/results/fed-cdp/table6/",
        _block("fed_cdp_summary", "fed-cdp table VI"),
    ),
    Block(
        "fed-cdp.md",
        "fed-cdp table VIII (small)",
        "docs/results/fed-cdp/table8-small/",
        _block("fed_cdp_summary", "fed-cdp table VIII (small)"),
    ),
    Block(
        "fed-cdp.md",
        "fed-cdp table VIII (100 rounds)",
        "docs/results/fed-cdp/table8-small-100/",
        _block("fed_cdp_summary", "fed-cdp table VIII (100 rounds)"),
    ),
)

HAND_WRITTEN: dict[str, tuple[int, str]] = {
    # page: (Markdown tables outside generated blocks, what they are / why not generated yet)
    "README.md": (1, "the index of pages"),
    "atoms.md": (1, "the verdicts (judgement over the generated tables)"),
    "decentralized.md": (
        8,
        "design and timing tables; the 1,000-iteration curves (images); the claims (judgement)",
    ),
    "distributed-dp.md": (1, "the earlier page's conclusions beside the re-run's (judgement)"),
    "dp-filter.md": (1, "the configuration index"),
    "dp-rsa.md": (1, "the setting (the choices where the paper leaves the loop open)"),
    "fed-cdp.md": (
        2,
        "the configuration index; our choices against the authors' code (a comparison, "
        "not results)",
    ),
    "share.md": (
        3,
        "the settings and claims tables (judgement over the generated ones)",
    ),
}


def markers(name: str) -> tuple[str, str]:
    return f"<!-- generated: {name} ({COMMAND}) -->", f"<!-- /generated: {name} -->"


def current(text: str, name: str) -> str | None:
    """The text of block ``name`` on a page (``None``: the page lacks its markers)."""
    start, end = markers(name)
    if text.count(start) != 1 or text.count(end) != 1:
        return None
    return text.split(start, 1)[1].split(end, 1)[0].strip("\n")


def splice(text: str, name: str, body: str) -> str:
    start, end = markers(name)
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def tables_outside_blocks(text: str) -> int:
    """Markdown tables (a header row followed by a ``|---`` row) outside generated blocks."""
    kept = re.sub(r"<!-- generated: (.+?) \(.*?-->.*?<!-- /generated: \1 -->", "", text, flags=re.S)
    return len(re.findall(r"^\|.*\|\n\|[-:| ]+\|$", kept, flags=re.M))


def check(root: Path = ROOT, blocks: tuple[Block, ...] = BLOCKS) -> list[str]:
    """One line per block whose page text differs from what its sources give."""
    problems = []
    for block in blocks:
        page = root / PAGES / block.page
        found = current(page.read_text(encoding="utf-8"), block.name)
        if found is None:
            problems.append(f"{block.page}: no (single) markers for {block.name!r}")
        elif found != block.build(root).strip("\n"):
            problems.append(f"{block.page}: {block.name!r} differs from {block.sources}")
    return problems


def write(root: Path = ROOT, blocks: tuple[Block, ...] = BLOCKS) -> list[str]:
    """Rewrite every block; returns the blocks that changed."""
    changed = []
    for block in blocks:
        page = root / PAGES / block.page
        text = page.read_text(encoding="utf-8")
        if current(text, block.name) is None:
            raise SystemExit(f"{page}: add the markers {markers(block.name)}")
        new = splice(text, block.name, block.build(root).strip("\n"))
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(f"{block.page}: {block.name}")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="compare, write nothing")
    group.add_argument("--list", action="store_true", help="list the blocks")
    args = parser.parse_args(argv)
    if args.list:
        for b in BLOCKS:
            print(f"{b.page}: {b.name} <- {b.sources}")
        return 0
    if args.check:
        problems = check(args.root)
        print("\n".join(problems) or f"{len(BLOCKS)} blocks match their run folders")
        return 1 if problems else 0
    changed = write(args.root)
    print("\n".join(changed) or "nothing changed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
