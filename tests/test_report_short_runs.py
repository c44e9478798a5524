"""``sharefl report`` on what a newcomer has after a quick trial: a run with one evaluation,
an unfinished run, a deployment's results folder. The images are checked by what they
show: where the data's pixels lie inside the axes (found by their black spines), not only
that a PNG exists."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from needs import needs

from sharefl.cli import main
from sharefl.simulator.report import write_report

BLUE = (0x1F / 255, 0x77 / 255, 0xB4 / 255)  # matplotlib's first colour (tab:blue)
ORANGE = (0xFF / 255, 0x7F / 255, 0x0E / 255)  # its second (tab:orange)


def _image(path: Path) -> np.ndarray:
    """The PNG's RGB pixels in [0, 1], after checking it is a real picture."""
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    pixels = imread(path)[..., :3]
    assert pixels.shape[0] > 300 and pixels.shape[1] > 600
    return pixels


def _frame(pixels: np.ndarray) -> tuple[int, int, int, int]:
    """The axes' spines (top, bottom, left, right): the rows and columns that are dark
    along more than 40 % of the picture (text and ticks are short)."""
    dark = pixels.max(axis=2) < 0.25
    rows = np.flatnonzero(dark.mean(axis=1) > 0.4)
    columns = np.flatnonzero(dark.mean(axis=0) > 0.4)
    assert len(rows) >= 2 and len(columns) >= 2, "no axes frame found"
    return int(rows.min()), int(rows.max()), int(columns.min()), int(columns.max())


def _blobs(pixels: np.ndarray, colour: tuple[float, float, float]) -> list[np.ndarray]:
    """The connected groups of pixels of ``colour``, each as its ``(rows, columns)``."""
    from scipy import ndimage

    mask = np.abs(pixels - np.array(colour)).max(axis=2) < 0.08
    labels, count = ndimage.label(mask)
    return [np.nonzero(labels == k) for k in range(1, count + 1)]


def _across(columns: np.ndarray, frame: tuple[int, int, int, int]) -> tuple[float, float]:
    """The leftmost and rightmost of ``columns`` as fractions of the axes' width."""
    _, _, left, right = frame
    return (columns.min() - left) / (right - left), (columns.max() - left) / (right - left)


def _markers(pixels: np.ndarray, colour: tuple[float, float, float]) -> list[np.ndarray]:
    """The columns of the lone markers of ``colour``: compact blobs at most 15 pixels wide
    and high (a legend's sample is a line through a marker: wider)."""
    found = []
    for rows, columns in _blobs(pixels, colour):
        height, width = np.ptp(rows) + 1, np.ptp(columns) + 1
        if 3 <= height <= 15 and 3 <= width <= 15:
            found.append(columns)
    return found


def _run(folder: Path, *, rounds: int, evaluated: list[int], finished: bool) -> Path:
    """A simulation run folder of ``rounds`` rounds with evaluations at ``evaluated``."""
    folder.mkdir(parents=True)
    config = {"name": "trial", "label": "trial", "seed": 1, "rounds": rounds, "eval_every": 5}
    (folder / "config.json").write_text(json.dumps(config))
    lines = [
        json.dumps({"round": r, "accuracy": 0.5 + r / 100, "loss": 2.0 / r, "epsilon": None})
        for r in evaluated
    ]
    (folder / "rounds.jsonl").write_text("".join(line + "\n" for line in lines))
    if finished:
        summary = {"name": "trial", "label": "trial", "seed": 1, "rounds": rounds}
        summary["final_accuracy"] = 0.5 + evaluated[-1] / 100
        (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_one_evaluation_is_a_marker_at_its_round_on_a_round_axis(tmp_path):
    """``--rounds 3`` with evaluations every 5 rounds: one evaluation, at round 3. The
    accuracy marker sits at round 3 of an axis 0..3 (not alone mid-axis on ticks
    2.84...3.16), and the loss plot shows it too (a line of one point draws nothing)."""
    needs("matplotlib")
    _run(tmp_path / "trial-1", rounds=3, evaluated=[3], finished=True)
    write_report(tmp_path)
    for png in ("trial.png", "trial_loss.png"):
        pixels = _image(tmp_path / png)
        (marker,) = _markers(pixels, BLUE)  # one evaluation, one marker
        low, high = _across(marker, _frame(pixels))
        assert low > 0.8 and high < 0.92, (png, low, high)  # round 3 of 0..3 (and a margin)


def test_an_unfinished_run_is_drawn_as_far_as_it_got(tmp_path):
    """Evaluated at rounds 1-4 of a planned 40: the curve fills the first tenth of the
    axis, which runs to the planned round, so the plot shows how far the run is."""
    needs("matplotlib")
    _run(tmp_path / "trial-1", rounds=40, evaluated=[1, 2, 3, 4], finished=False)
    report = write_report(tmp_path).read_text()
    assert "1 unfinished" in report and "40 rounds" not in report  # the table's count
    pixels = _image(tmp_path / "trial.png")
    _, columns = min(_blobs(pixels, BLUE), key=lambda b: b[1].min())  # the legend sits right
    low, high = _across(columns, _frame(pixels))
    assert low < 0.05 and 0.06 < high < 0.14, (low, high)


def test_a_run_before_its_first_evaluation_gets_a_sentence_not_an_empty_plot(tmp_path):
    needs("matplotlib")
    (tmp_path / "trial.png").write_bytes(b"an older plot")
    _run(tmp_path / "trial-1", rounds=100, evaluated=[], finished=False)
    text = write_report(tmp_path).read_text()
    assert "No plot yet: no run of trial has reached an evaluated round (every 5 rounds)" in text
    assert "![" not in text and not list(tmp_path.glob("*.png"))  # the stale plot went too


def _deployment(folder: Path, took_part: list[int], summed: list[int]) -> Path:
    """A results folder as sharefl serve --out writes it (the fields the report reads)."""
    folder.mkdir(parents=True)
    (folder / "result.json").write_text("{}")
    rows = [
        {
            "round": r,
            "participants": list(range(n)),
            "contributors": k,
            "failed": [[0, 1]] if k < n else [],
            "culprits": {"3": "bad share"} if r == 2 else {},
            "epsilon": None,
            "seconds": 0.5,
        }
        for r, (n, k) in enumerate(zip(took_part, summed, strict=True), start=1)
    ]
    (folder / "rounds.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def test_a_deployments_results_folder_is_reported(tmp_path, capsys):
    needs("matplotlib")
    _deployment(tmp_path / "deploy", took_part=[8, 8, 7, 8], summed=[6, 5, 6, 7])
    assert main(["report", str(tmp_path / "deploy")]) == 0
    text = (tmp_path / "deploy" / "report.md").read_text()
    assert text.startswith("# Deployment report\n") and "sharefl simulate" not in text
    assert "| 4 | 7–8 | 6.0 | 4 | 3 | — | 0.50 |" in text
    assert "![deployment deploy](deployment_deploy.png)" in text
    pixels = _image(tmp_path / "deploy" / "deployment_deploy.png")
    frame = _frame(pixels)
    top, bottom = frame[:2]
    for colour in (BLUE, ORANGE):  # took part, summed: both drawn from round 1 to 4
        # 5 to 8 clients of an axis to 9.3: the upper half (the legend is lower right)
        columns = np.concatenate(
            [c for r, c in _blobs(pixels, colour) if r.max() < top + 0.6 * (bottom - top)]
        )
        low, high = _across(columns, frame)
        assert 0.15 < low < 0.3 and 0.85 < high < 0.95, (colour, low, high)


def test_simulations_and_deployments_side_by_side(tmp_path):
    needs("matplotlib")
    _run(tmp_path / "sim" / "trial-1", rounds=3, evaluated=[3], finished=True)
    _deployment(tmp_path / "launch", took_part=[4], summed=[4])
    text = write_report(tmp_path).read_text()
    assert text.startswith("# Simulation report\n") and "## trial" in text
    assert "## deployment launch" in text and (tmp_path / "deployment_launch.png").is_file()


@pytest.mark.parametrize("line", ['{"round": 1}', "not json"])
def test_a_broken_deployment_line_is_named(tmp_path, line):
    folder = _deployment(tmp_path / "d", took_part=[4], summed=[4])
    (folder / "rounds.jsonl").write_text(line + "\n")
    with pytest.raises(ValueError, match=r"rounds\.jsonl:1: not a deployment round"):
        write_report(tmp_path)
