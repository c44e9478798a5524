"""DLG on a victim's transmitted model in the decentralized loop (seed004, Figures 5/10).

The worst case of the paper: the victim (honest agent 0 of the rebuilt graph, degree 10) is
surrounded by curious agents, and computes its gradient on one sample (the first "0" of
the MNIST training set) at its model x. It broadcasts x̃ = x − α·clip_M(∇f(x)) + N(0,
(Cα)² I). A neighbour that knows x (the victim's previous aggregate is computable by an
eavesdropper seeing every message) forms g̃ = (x − x̃)/α = clip_M(∇f) + N(0, C² I) and runs
DLG (Zhu et al.: L-BFGS gradient matching over the input and a soft label from a random
dummy) and CPL (the same with a patterned dummy and the label inferred, seed003's attack),
both :func:`sharefl.simulator.leakage.reconstruct`, on the softmax regression. (iDLG, with
a random dummy and the label inferred, was measured to stall at MSE 0.435 even without
noise on this model.)
Success: reconstruction MSE ≤ 0.01 on [0, 1] pixels (the leakage module's threshold).

Settings (the paper gives none): x is the model's PyTorch initialisation (float64), pixels
in [0, 1] (no normalisation, so the MSE is on the image scale), M = 10, α = 0.9 (k = 0),
C ∈ {0, 0.01, 0.1, 2} (2 is the rule comparison's), at most 300 L-BFGS steps, stop after
30 without 1e-6 relative improvement; three seeds per C (noise and the attack's dummy).

Usage::

    python experiments/decentralized_dlg.py [--json out.json]

With ``--json`` the file holds every trial, the wall time and the run's environment;
``docs/results/decentralized/dlg.json`` is the committed one, from which ``python
experiments/results_pages.py`` writes the page's table (:func:`blocks`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch import nn

from sharefl.simulator.datasets import load_dataset
from sharefl.simulator.leakage import attack_succeeded, reconstruct, reconstruction_mse
from sharefl.simulator.models import build_model
from sharefl.simulator.provenance import run_environment

NOISES = (0.0, 0.01, 0.1, 2.0)
METHODS = ("dlg", "cpl")
SEEDS = (0, 1, 2)
ALPHA, CLIP = 0.9, 10.0
NAMES = {"dlg": "DLG (random dummy, soft label)", "cpl": "CPL (patterned dummy, inferred label)"}
COMMITTED = Path("docs/results/decentralized/dlg.json")


def leaked_gradient(
    model: nn.Module, image: torch.Tensor, label: torch.Tensor, noise: float, seed: int
) -> list[torch.Tensor]:
    """g̃ = (x − x̃)/α: the clipped gradient plus N(0, C²) per coordinate."""
    loss = nn.functional.cross_entropy(model(image[None]), label[None])
    grads = torch.autograd.grad(loss, list(model.parameters()))
    norm = torch.sqrt(sum((g * g).sum() for g in grads))
    factor = min(1.0, CLIP / float(norm))
    gen = torch.Generator().manual_seed(seed)
    # x̃ = x − α g + Cα e  ⇒  (x − x̃)/α = g − C e
    return [g * factor - noise * torch.randn(g.shape, generator=gen, dtype=g.dtype) for g in grads]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    train = load_dataset("mnist", "train")
    index = int(torch.nonzero(train.targets == 0)[0])
    image, label = train.inputs[index].to(torch.float64), train.targets[index]
    model = build_model("decentralized_softmax", num_classes=10, input_shape=(1, 28, 28), seed=100)
    model = model.double()
    rows = []
    for method, noise, seed in ((m, c, s) for m in METHODS for c in NOISES for s in SEEDS):
        start = time.perf_counter()
        leaked = leaked_gradient(model, image, label, noise, seed)
        rec = reconstruct(
            model,
            leaked,
            method=method,
            input_shape=(1, 28, 28),
            num_classes=10,
            max_iterations=300,
            patience=30,
            seed=seed,
            reference=image[None],
        )
        mse = reconstruction_mse(rec.image, image[None])
        rows.append(
            {
                "method": method,
                "C": noise,
                "seed": seed,
                "mse": mse,
                "succeeded": attack_succeeded(mse),
                "label_recovered": int(rec.label[0]) == int(label),
                "iterations": rec.iterations,
                "seconds": round(time.perf_counter() - start, 2),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    print()
    print(markdown(rows))
    if args.json:
        document = {
            "trials": rows,
            "wall_seconds": round(time.perf_counter() - started, 1),
            "environment": run_environment(),
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")


def markdown(rows: list[dict]) -> str:
    """Per attack and C: the trials that succeeded and the median reconstruction MSE."""
    lines = ["| attack | C | succeeded | median MSE |", "|---|---|---|---|"]
    for method in METHODS:
        for i, noise in enumerate(NOISES):
            trials = [r for r in rows if r["C"] == noise and r["method"] == method]
            mses = sorted(r["mse"] for r in trials)
            name = NAMES[method] if i == 0 else method.upper()
            lines.append(
                f"| {name} | {noise:g} | {sum(r['succeeded'] for r in trials)}/{len(trials)} "
                f"| {mses[len(mses) // 2]:.2g} |"
            )
    return "\n".join(lines)


def blocks(root: Path) -> dict[str, str]:
    """The page's table, from the committed JSON."""
    path = root / COMMITTED
    if not path.is_file():
        return {"decentralized dlg": "(not run)"}
    document = json.loads(path.read_text())
    env = document["environment"]
    text = markdown(document["trials"]) + (
        f"\n\n{len(document['trials'])} trials, {document['wall_seconds']:.0f} s, one thread, "
        f"commit {(env['commit'] or '?')[:7]}, CPU kernels {env['cpu_capability']}."
    )
    return {"decentralized dlg": text}


if __name__ == "__main__":
    main()
