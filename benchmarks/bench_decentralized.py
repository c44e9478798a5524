"""Benchmark of the decentralized loop (seed004) vectorised over agents against per-agent
loops, in the MNIST setting: 12 agents (10 honest, 2 Byzantine, the authors' graph),
softmax regression (d = 7,850, float64), batch 32, per-example clipping, C = 2, IOS under
the sign-flipping attack (MNIST-shaped synthetic data: the timing does not depend on the
pixels; the real files need not be present).

Iterations (``DecentralizedLoop.step``, no evaluation) are timed three ways, interleaved
(benchmarks/common.py's ``compare``):

* ``vectorised``: :class:`~sharefl.simulator.decentralized.loop.DecentralizedLoop` — the
  clipped mean gradients of all agents in one batched pass (the closed form of softmax
  regression, :mod:`sharefl.simulator.decentralized.gradients`), aggregation batched over
  receivers;
* ``per_agent_vmap`` (a strong baseline): :class:`~sharefl.simulator.decentralized.
  reference.PerAgentLoop` — a Python loop over agents, each with its own ``vmap(grad)``
  over its examples and the per-agent rule;
* ``per_agent_plain``: a Python loop over agents and their examples (forward + backward
  per example), then the per-agent rule — what a simulator without vectorisation does.

Target (issue 19): vectorised ≥ 5× the per-agent loop's iterations per second on CPU
(checked against ``per_agent_plain``; the ratio to ``per_agent_vmap`` is reported too).
Run: ``python benchmarks/bench_decentralized.py [--quick] [--threads N] [--strict]
[--smoke]``.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from common import add_smoke_flag, compare, emit, emit_machine, finish, use_smoke
from torch import Tensor

from sharefl.machine import keep_freed_memory, torch_threads
from sharefl.simulator.config import expand
from sharefl.simulator.datasets import synthetic_dataset
from sharefl.simulator.decentralized.loop import DecentralizedLoop
from sharefl.simulator.decentralized.reference import PerAgentLoop

STEPS = 5


class PlainLoop(PerAgentLoop):
    """Per agent, per example: forward and backward with autograd, clip, average."""

    def clipped_gradients(self, x: Tensor) -> Tensor:
        rows = self.sampler.next(self.generator)
        out = []
        for n in range(len(self.honest)):
            params = x[n].detach().clone().requires_grad_(True)
            total = torch.zeros_like(params)
            for i in rows[n].tolist():  # step() runs under no_grad
                inputs = self.train_set.inputs[i : i + 1].to(self.dtype)
                with torch.enable_grad():
                    out_i = self.model(params, inputs)
                    loss = F.cross_entropy(out_i, self.train_set.targets[i : i + 1])
                    (g,) = torch.autograd.grad(loss, params)
                total += g * min(1.0, self.cfg.clip / max(float(g.norm()), 1e-300))
            out.append(total / rows.shape[1])
        return torch.stack(out)


def setting() -> dict:
    return {
        "name": "bench_decentralized",
        "seed": 1,
        "rounds": 10**6,
        "eval_every": 10**6,
        "model": {"name": "decentralized_softmax", "init_seed": 100},
        "clients": {"honest": 10, "byzantine": 2},
        "training": {"batch_size": 32},
        "algorithm": {"name": "decentralized"},
        "attack": {"name": "sign_flipping"},
        "decentralized": {"rule": "ios", "noise": 2.0, "clip": 10.0},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    add_smoke_flag(parser)
    args = parser.parse_args()
    smoke = use_smoke(args)  # a 6,000-example training set, one repetition
    keep_freed_memory()  # as `sharefl simulate` does: no page fault per freed buffer
    with torch_threads(args.threads):
        emit_machine("decentralized", threads=torch.get_num_threads())
        train = synthetic_dataset(6_000 if smoke else 60_000, shape=(1, 28, 28), seed=0)
        test = synthetic_dataset(1_000, shape=(1, 28, 28), seed=0, split="test")
        (run,) = expand(setting())
        loops = {
            cls.__name__: cls(run, train=train, test=test)
            for cls in (DecentralizedLoop, PerAgentLoop, PlainLoop)
        }
        repeat = 3 if args.quick else 10

        def steps(loop: DecentralizedLoop):
            return lambda: [loop.step() for _ in range(STEPS)]

        records = []
        fast = steps(loops["DecentralizedLoop"])
        for name, key, target in (
            ("vectorised_vs_per_agent_plain", "PlainLoop", 5.0),
            ("vectorised_vs_per_agent_vmap", "PerAgentLoop", None),
        ):
            mine, base = compare(fast, steps(loops[key]), repeat=repeat, warmup=1)
            speedup = round(base["best_s"] / mine["best_s"], 2)
            record = {
                "name": name,
                "vectorised_iterations_per_s": round(STEPS / mine["best_s"], 1),
                "baseline_iterations_per_s": round(STEPS / base["best_s"], 1),
                "speedup": speedup,
            }
            if target is not None:
                record |= {"target": target, "pass": speedup >= target}
            emit(record)
            records.append(record)
        finish(records, strict=args.strict)


if __name__ == "__main__":
    main()
