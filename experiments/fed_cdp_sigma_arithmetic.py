"""seed003 (Fed-αCDP): the arithmetic of one noisy local step at initialisation.

For Table IV's setting (``experiments/fed_cdp_mnist_table4_small.toml``: the CNN of the
authors' code, 34,720 weights, initialised as our runs are; B = 5, lr 0.05, C = 4, L = 100
local steps, K_t = 20 clients averaged) it measures on real MNIST batches of one client
(its label-sorted shards, as the split deals them): the model's norm per layer, the
per-example gradient norms per layer and so Fed-αCDP's l2-max sensitivity S = min(C, max
layer norm), and the norm of the clipped mean gradient; then it states, for each σ, the
norm of the noise one local step adds to the weights (lr·σ·S/B·√d), of the noise a round
adds to the global model (√(L/K_t) times that: L independent steps per client, the mean of
K_t clients), and of the most signal a round can add (L·lr·‖mean clipped gradient‖, every
step aligned). Usage::

    python experiments/fed_cdp_sigma_arithmetic.py --json docs/results/fed-cdp/sigma-arithmetic.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from torch.func import functional_call, grad, vmap

from sharefl.simulator.datasets import load_dataset
from sharefl.simulator.models import build_model

B, LR, C, L, K = 5, 0.05, 4.0, 100, 20
SIGMAS = (0.5, 1.5, 3.0, 6.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    data = load_dataset("mnist", "train")
    inputs, labels = data.inputs[:50000], data.targets[:50000]
    order = torch.argsort(labels, stable=True)
    # one client: two label-sorted shards of 250 (shards 0 and 100 of 200: labels 0 and 4-5)
    client = torch.cat([order[:250], order[25000:25250]])
    model = build_model("fed_cdp_cnn", num_classes=10, input_shape=(1, 28, 28), seed=1234)
    model.eval()  # dropout off: the norms of the deterministic network
    params = {k: v.detach() for k, v in model.named_parameters()}
    d = sum(p.numel() for p in params.values())

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, p, (x.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, y.unsqueeze(0))

    per_example = vmap(grad(loss), in_dims=(None, 0, 0))
    s_values, signal_norms, max_layer = [], [], {k: 0.0 for k in params}
    perm = client[torch.randperm(len(client))]
    for b in range(args.batches):
        idx = perm[b * B : (b + 1) * B]
        g = per_example(params, inputs[idx].float(), labels[idx])
        norms = {k: v.flatten(1).norm(dim=1) for k, v in g.items()}  # [B] per layer
        for k, n in norms.items():
            max_layer[k] = max(max_layer[k], float(n.max()))
        s_values.append(min(C, max(float(n.max()) for n in norms.values())))
        clipped = {
            k: v * (C / norms[k].clamp_min(1e-30)).clamp(max=1.0).view(-1, *[1] * (v.dim() - 1))
            for k, v in g.items()
        }
        mean = torch.cat([v.mean(0).flatten() for v in clipped.values()])
        signal_norms.append(float(mean.norm()))
    s = max(s_values)
    signal = sum(signal_norms) / len(signal_norms)
    record = {
        "setting": {"B": B, "lr": LR, "C": C, "L": L, "K": K, "d": d, "batches": args.batches},
        "model_norm": {k: float(v.norm()) for k, v in params.items()},
        "model_norm_total": float(torch.cat([v.flatten() for v in params.values()]).norm()),
        "max_example_layer_norm": max_layer,
        "S": s,
        "S_range": [min(s_values), max(s_values)],
        "mean_clipped_gradient_norm": signal,
        "per_sigma": {},
    }
    for sigma in SIGMAS:
        step_noise = LR * sigma * s / B * math.sqrt(d)
        round_noise = step_noise * math.sqrt(L / K)
        round_signal = L * LR * signal
        record["per_sigma"][str(sigma)] = {
            "noise_std_per_coordinate_of_the_gradient": sigma * s / B,
            "step_noise_norm": step_noise,
            "step_signal_norm": LR * signal,
            "round_noise_norm": round_noise,
            "round_signal_norm_at_most": round_signal,
            "round_noise_over_model_norm": round_noise / record["model_norm_total"],
        }
    text = json.dumps(record, indent=1)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
