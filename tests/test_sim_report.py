"""sharefl.simulator.report: loading run folders, grouping, Markdown tables, plots, errors."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from needs import needs

from sharefl.install_hint import install_command
from sharefl.simulator.report import (
    GroupSummary,
    ReportError,
    RunRecord,
    load_runs,
    markdown_table,
    plot_accuracy,
    sanitize_filename,
    summarize,
    write_report,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LF = "ε=2, 60% LF, filter"


def write_run(
    folder: Path,
    *,
    name: str,
    label: str,
    seed: int,
    final: float | None,
    paper: float | None = None,
    epsilon: float | None = None,
    wall: float = 30.0,
    device: str = "cpu",
    rounds: int = 4,
) -> Path:
    """A fake run folder; ``final=None`` leaves it unfinished (no summary.json)."""
    folder.mkdir(parents=True)
    config = {"name": name, "label": label, "seed": seed, "rounds": rounds}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    end = final if final is not None else 0.5
    lines = []
    for r in range(1, rounds + 1):
        lines.append(
            json.dumps(
                {
                    "round": r,
                    "accuracy": end * r / rounds,
                    "loss": 2.0 / r,
                    "epsilon": None if epsilon is None else epsilon * r / rounds,
                    "seconds": wall * r / rounds,
                    "extra": "ignored",
                }
            )
        )
    (folder / "rounds.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if final is not None:
        summary = {
            "run_id": folder.name,
            "name": name,
            "label": label,
            "seed": seed,
            "final_accuracy": final,
            "best_accuracy": final,
            "epsilon": epsilon,
            "delta": None if epsilon is None else 1e-5,
            "rounds": rounds,
            "wall_seconds": wall,
            "device": device,
            "paper": paper,
            "config": config,
        }
        (folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return folder


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    """Two experiments: ``mnist`` (2 labels x 3 seeds + 1 unfinished run) and ``cifar/avg``
    (nested one folder deeper, 1 label x 3 seeds)."""
    root = tmp_path / "out"
    for seed, acc in enumerate([0.90, 0.92, 0.94]):
        write_run(
            root / f"mnist-clean-s{seed}",
            name="mnist",
            label="no attack",
            seed=seed,
            final=acc,
            paper=0.93,
            wall=90.0,
        )
    for seed, acc in enumerate([0.80, 0.81, 0.82]):
        write_run(
            root / f"mnist-lf-s{seed}",
            name="mnist",
            label=LF,
            seed=seed,
            final=acc,
            epsilon=2.0,
            wall=30.0 + seed,
            device="cuda",
        )
    write_run(root / "mnist-lf-s3", name="mnist", label=LF, seed=3, final=None, epsilon=2.0)
    for seed, acc in enumerate([0.60, 0.62, 0.64]):
        write_run(
            root / "sweep" / "cifar" / f"run{seed}",
            name="cifar/avg",
            label="mean",
            seed=seed,
            final=acc,
            paper=0.65,
            wall=4000.0,
            device="cuda",
        )
    return root


def test_load_runs_recursive_with_unfinished(runs_dir: Path) -> None:
    runs = load_runs(runs_dir)
    assert len(runs) == 10
    assert all(isinstance(r, RunRecord) for r in runs)
    unfinished = [r for r in runs if not r.finished]
    assert [(r.name, r.label, r.seed) for r in unfinished] == [("mnist", LF, 3)]
    assert unfinished[0].final_accuracy is None
    assert unfinished[0].epsilon == pytest.approx(2.0)  # last round's ε
    nested = [r for r in runs if r.name == "cifar/avg"]
    assert [r.seed for r in nested] == [0, 1, 2]
    run = next(r for r in runs if r.run_id == "mnist-clean-s1")
    assert run.final_accuracy == pytest.approx(0.92)
    assert [x.round for x in run.rounds] == [1, 2, 3, 4]
    assert run.rounds[-1].accuracy == pytest.approx(0.92)
    assert run.paper == pytest.approx(0.93)
    assert run.config["rounds"] == 4


def test_summarize_groups_and_statistics(runs_dir: Path) -> None:
    groups = summarize(load_runs(runs_dir))
    assert [(g.name, g.label) for g in groups] == [
        ("cifar/avg", "mean"),
        ("mnist", "no attack"),
        ("mnist", LF),
    ]
    _, clean, lf = groups
    assert clean.seeds == (0, 1, 2)
    assert clean.mean_accuracy == pytest.approx(0.92)
    assert clean.std_accuracy == pytest.approx(0.02)  # sample std
    assert (clean.min_accuracy, clean.max_accuracy) == pytest.approx((0.90, 0.94))
    assert clean.paper == pytest.approx(0.93)
    assert clean.difference == pytest.approx(-0.01)
    assert clean.epsilon is None
    assert clean.mean_wall_seconds == pytest.approx(90.0)
    assert (clean.finished, clean.unfinished) == (3, 0)
    assert lf.seeds == (0, 1, 2)  # the unfinished seed 3 is not in the statistics
    assert lf.mean_accuracy == pytest.approx(0.81)
    assert lf.epsilon == pytest.approx(2.0)
    assert lf.paper is None and lf.difference is None
    assert lf.mean_wall_seconds == pytest.approx(31.0)
    assert lf.devices == ("cuda",)
    assert (lf.finished, lf.unfinished) == (3, 1)


def test_summarize_one_seed_has_zero_std_and_no_runs_is_empty(tmp_path: Path) -> None:
    write_run(tmp_path / "a", name="x", label="y", seed=0, final=0.5)
    (g,) = summarize(load_runs(tmp_path))
    assert g.std_accuracy == 0.0
    assert summarize([]) == []


def test_summarize_only_unfinished_group(tmp_path: Path) -> None:
    write_run(tmp_path / "a", name="x", label="y", seed=0, final=None)
    (g,) = summarize(load_runs(tmp_path))
    assert g.mean_accuracy is None and g.std_accuracy is None and g.seeds == ()
    assert (g.finished, g.unfinished) == (0, 1)
    assert "| y | — (1 unfinished) | — | — | — | — | — |" in markdown_table([g])


def test_summarize_rejects_duplicate_seed_and_conflicting_paper(tmp_path: Path) -> None:
    write_run(tmp_path / "a", name="x", label="y", seed=0, final=0.5)
    write_run(tmp_path / "b", name="x", label="y", seed=0, final=0.6)
    with pytest.raises(ReportError, match="both seed 0"):
        summarize(load_runs(tmp_path))
    other = tmp_path / "other"
    write_run(other / "a", name="x", label="y", seed=0, final=0.5, paper=0.5)
    write_run(other / "b", name="x", label="y", seed=1, final=0.6, paper=0.7)
    with pytest.raises(ReportError, match="different paper"):
        summarize(load_runs(other))


def test_a_trial_beside_the_full_run_is_named_as_differing_in_rounds(tmp_path: Path) -> None:
    write_run(tmp_path / "full", name="x", label="y", seed=1, final=0.9, rounds=150)
    write_run(tmp_path / "trial", name="x", label="y", seed=1, final=0.3, rounds=3)
    with pytest.raises(ReportError, match=r"\(150 rounds\).*\(3 rounds\).*differ in rounds"):
        summarize(load_runs(tmp_path))


def plotted_figures(runs: list[RunRecord], folder: Path, *names: str) -> list[Any]:
    """``plot_accuracy`` for each experiment of ``names`` (a PNG each under ``folder``); the
    matplotlib Figures it saved, in that order, for the tests to inspect."""
    import unittest.mock

    from matplotlib.figure import Figure

    saved: list[Figure] = []
    original = Figure.savefig

    def keep(self: Figure, *args: object, **kwargs: object) -> None:
        saved.append(self)
        original(self, *args, **kwargs)

    with unittest.mock.patch.object(Figure, "savefig", keep):
        for name in names:
            plot_accuracy(runs, folder / f"{name}.png", name=name)
    return saved


def test_plot_has_an_epsilon_panel_for_private_runs_and_a_descriptive_title(
    tmp_path: Path,
) -> None:
    needs("matplotlib")
    write_run(tmp_path / "p" / "a", name="private", label="ε=2", seed=1, final=0.9, epsilon=2.0)
    write_run(tmp_path / "c" / "a", name="clear", label="none", seed=1, final=0.9)
    runs = load_runs(tmp_path)
    private, clear = plotted_figures(runs, tmp_path, "private", "clear")
    assert [a.get_ylabel() for a in private.axes] == ["test accuracy (%)", "ε spent"]
    assert [a.get_ylabel() for a in clear.axes] == ["test accuracy (%)"]
    accuracy_line = private.axes[0].get_lines()[0]
    assert accuracy_line.get_marker() == "o" and len(accuracy_line.get_xdata()) == 4
    assert list(private.axes[1].get_lines()[0].get_ydata()) == [0.5, 1.0, 1.5, 2.0]
    assert private.axes[0].get_title() == "private\n4 rounds, seed 1"


def test_many_series_are_told_apart_and_their_legend_sits_beside_the_curves(
    tmp_path: Path,
) -> None:
    """Past 10 series the colours repeat, so the line style changes; past 10 legend
    entries the legend leaves the axes (where it would cover curves and title) and the
    figure grows tall enough for all of them."""
    needs("matplotlib")
    for i in range(24):
        write_run(tmp_path / f"run{i}", name="many", label=f"cell {i}", seed=1, final=0.9)
    write_run(tmp_path / "few0", name="few", label="one", seed=1, final=0.9)
    runs = load_runs(tmp_path)
    many, few = plotted_figures(runs, tmp_path, "many", "few")
    styles = [line.get_linestyle() for line in many.axes[0].get_lines()]
    assert styles == ["-"] * 10 + ["--"] * 10 + [":"] * 4
    pairs = {(line.get_color(), line.get_linestyle()) for line in many.axes[0].get_lines()}
    assert len(pairs) == 24  # no two series look the same
    legend = many.axes[0].get_legend()
    assert len(legend.get_texts()) == 24
    assert legend.get_bbox_to_anchor().x0 > many.axes[0].get_window_extent().x1  # beside
    assert many.get_size_inches()[1] > few.get_size_inches()[1]
    assert few.axes[0].get_legend().get_bbox_to_anchor().x0 < few.axes[0].get_window_extent().x1


def test_label_order_is_first_appearance(tmp_path: Path) -> None:
    # Natural path order: run2 before run10, so "b" appears first.
    write_run(tmp_path / "run10", name="x", label="a", seed=0, final=0.5)
    write_run(tmp_path / "run2", name="x", label="b", seed=0, final=0.5)
    assert [g.label for g in summarize(load_runs(tmp_path))] == ["b", "a"]


def test_markdown_table_exact(runs_dir: Path) -> None:
    groups = [g for g in summarize(load_runs(runs_dir)) if g.name == "mnist"]
    assert markdown_table(groups) == (
        "## mnist\n"
        "\n"
        "| setting | accuracy % (mean ± std over n seeds) | paper % | Δ (points) | ε "
        "| wall time | device |\n"
        "|---|---|---|---|---|---|---|\n"
        "| no attack | 92.0 ± 2.0 (n=3) | 93.0 | -1.0 | — | 1.5 min | cpu |\n"
        "| ε=2, 60% LF, filter | 81.0 ± 1.0 (n=3; 1 unfinished) | — | — | 2 | 31.0 s | cuda |\n"
    )


def test_markdown_table_positive_delta_pipes_and_hours() -> None:
    g = GroupSummary(
        name="e",
        label="a|b",
        seeds=(0,),
        mean_accuracy=0.6543,
        std_accuracy=0.0,
        min_accuracy=0.6543,
        max_accuracy=0.6543,
        epsilon=0.5,
        paper=0.65,
        difference=0.0043,
        mean_wall_seconds=4000.0,
        devices=("cuda", "cpu"),
        finished=1,
        unfinished=0,
    )
    assert markdown_table([g]).splitlines()[-1] == (
        "| a\\|b | 65.4 (n=1) | 65.0 | +0.4 | 0.5 | 1.1 h | cuda, cpu |"
    )
    two = dataclasses.replace(g, seeds=(0, 1), std_accuracy=0.012, finished=2)
    assert "| 65.4 ± 1.2 (n=2) |" in markdown_table([two])
    assert markdown_table([]) == ""


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 5000


def test_plot_accuracy_writes_png(runs_dir: Path, tmp_path: Path) -> None:
    needs("matplotlib")
    runs = load_runs(runs_dir)
    out = plot_accuracy(runs, tmp_path / "plots" / "mnist.png", name="mnist")
    assert out == tmp_path / "plots" / "mnist.png"
    assert_png(out)
    with pytest.raises(ReportError, match="no runs of experiment 'nope'"):
        plot_accuracy(runs, tmp_path / "x.png", name="nope")


def test_plot_without_matplotlib_says_pip_install(
    runs_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for mod in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, mod, None)
    runs = load_runs(runs_dir)
    hint = install_command("sim")  # sharefl's own extra: not on the package index
    with pytest.raises(ReportError, match=re.escape(hint)):
        plot_accuracy(runs, tmp_path / "x.png", name="mnist")
    report = write_report(runs_dir)  # tables and JSON are still written
    assert hint in report.read_text(encoding="utf-8")
    assert not list(runs_dir.glob("*.png"))


def test_write_report(runs_dir: Path) -> None:
    needs("matplotlib")
    report = write_report(runs_dir)
    assert report == runs_dir / "report.md"
    text = report.read_text(encoding="utf-8")
    assert text.startswith("# Simulation report\n")
    assert "10 runs (9 finished, 1 unfinished) in 3 settings of 2 experiments" in text
    assert text.index("## cifar/avg") < text.index("## mnist")
    assert "| mean | 62.0 ± 2.0 (n=3) | 65.0 | -3.0 | — | 1.1 h | cuda |" in text
    assert "![cifar/avg](cifar_avg.png)" in text
    assert "![mnist](mnist.png)" in text
    assert_png(runs_dir / "cifar_avg.png")
    assert_png(runs_dir / "mnist.png")
    # every loop records the test loss: one loss plot per experiment beside accuracy and ε
    assert "![loss](mnist_loss.png)" in text and "![loss](cifar_avg_loss.png)" in text
    assert_png(runs_dir / "mnist_loss.png")
    data = json.loads((runs_dir / "report.json").read_text(encoding="utf-8"))
    assert [(d["name"], d["label"]) for d in data] == [
        ("cifar/avg", "mean"),
        ("mnist", "no attack"),
        ("mnist", LF),
    ]
    assert data[1]["seeds"] == [0, 1, 2]
    assert data[1]["difference"] == pytest.approx(-0.01)
    # Re-running over its own outputs gives the same report.
    assert write_report(runs_dir).read_text(encoding="utf-8") == text


def test_write_report_custom_out(runs_dir: Path, tmp_path: Path) -> None:
    needs("matplotlib")
    out = tmp_path / "docs" / "results.md"
    assert write_report(runs_dir, out) == out
    assert (tmp_path / "docs" / "results.json").is_file()
    assert_png(tmp_path / "docs" / "mnist.png")


def test_malformed_rounds_line_names_file_and_line(tmp_path: Path) -> None:
    folder = write_run(tmp_path / "r", name="x", label="y", seed=0, final=0.5)
    rounds = folder / "rounds.jsonl"
    lines = rounds.read_text(encoding="utf-8").splitlines()
    lines[2] = '{"round": 3, "accuracy": '
    rounds.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ReportError, match=r"rounds\.jsonl:3: invalid JSON") as info:
        load_runs(tmp_path)
    assert str(rounds) in str(info.value)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"round": 1, "accuracy": 91.5}', "fraction in"),
        ('{"accuracy": 0.5}', "missing key 'round'"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_invalid_round_values(tmp_path: Path, line: str, message: str) -> None:
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "rounds.jsonl").write_text("\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ReportError, match=rf"rounds\.jsonl:2: .*{message}"):
        load_runs(tmp_path)


def test_malformed_summary_names_file(tmp_path: Path) -> None:
    folder = write_run(tmp_path / "r", name="x", label="y", seed=0, final=0.5)
    (folder / "summary.json").write_text('{"name": "x",\n "label": }', encoding="utf-8")
    with pytest.raises(ReportError, match=r"summary\.json:2: invalid JSON"):
        load_runs(tmp_path)
    (folder / "summary.json").write_text('{"name": "x", "label": "y"}', encoding="utf-8")
    with pytest.raises(ReportError, match=r"summary\.json: missing key 'final_accuracy'"):
        load_runs(tmp_path)


def test_empty_directory(tmp_path: Path) -> None:
    assert load_runs(tmp_path) == []
    with pytest.raises(ReportError, match=r"no runs under .*; run `sharefl simulate \.\.\.` first"):
        write_report(tmp_path)
    with pytest.raises(ReportError, match="not a directory"):
        load_runs(tmp_path / "missing")


def test_unfinished_run_without_config_falls_back_to_folders(tmp_path: Path) -> None:
    folder = tmp_path / "exp" / "run-7"
    folder.mkdir(parents=True)
    (folder / "rounds.jsonl").write_text('{"round": 1, "accuracy": 0.1}\n', encoding="utf-8")
    (run,) = load_runs(tmp_path)
    assert (run.name, run.label, run.seed, run.finished) == ("exp", "run-7", None, False)


def test_sanitize_filename() -> None:
    assert sanitize_filename("cifar/avg") == "cifar_avg"
    assert sanitize_filename("ε=2, LF") == "2_LF"
    assert sanitize_filename("../..") == "experiment"
