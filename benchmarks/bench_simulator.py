"""Benchmark of the simulator's vectorised client training against per-client loops.

The setting is seed000's MNIST run at 60% Byzantine (``experiments/dp_filter_mnist_figure1.toml``):
20 honest workers doing DP-SGD (per-example normalisation with momentum, b_c = 16, Poisson
sampling, Gaussian noise) and 30 label-flipping workers (one example each), seed000's CNN
(d = 21,802). One round's client computation is timed three ways, interleaved
(benchmarks/common.py's ``compare``):

* ``vectorised``: :class:`sharefl.simulator.training.VectorizedClients` — every client's
  per-example gradients in one nested ``torch.func.vmap`` call per group;
* ``loop_plain`` (the issue's baseline): a Python loop over clients, each computing its
  per-example gradients one example at a time (forward + backward per example), then
  momentum, normalisation, noise — what a simulator without vectorisation does; timed with
  torch's default threads (the target) and, on CPU, on one thread (its faster setting on
  small machines, as batch-1 passes lose more to thread synchronisation than they gain);
* ``loop_vmap`` (a stronger baseline): a Python loop over clients, each running
  :class:`sharefl.privacy.DPSGD` (per-example ``vmap`` inside the client);
* ``batched_floor`` (a floor, not a competitor): one non-private forward + backward of all
  the round's sampled examples as a single batch, without per-example gradients.

It also reports whole simulated rounds per second (``Simulation.step``: training, the
two-stage filter, the server step). Target (issue #7): vectorised ≥ 5× faster than the
plain per-client loop on CPU. ``--device cuda`` times the CUDA path when one is present.
Run: ``python benchmarks/bench_simulator.py [--quick] [--device cuda] [--threads N]``.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from common import add_smoke_flag, compare, emit, emit_machine, finish, use_smoke

from sharefl.machine import keep_freed_memory, torch_threads
from sharefl.privacy import DPSGD, DPSGDConfig, Normalization
from sharefl.simulator.config import load_runs
from sharefl.simulator.datasets import synthetic_dataset
from sharefl.simulator.federated.loop import Simulation

HONEST, BYZANTINE, BATCH, SIGMA, BETA = 20, 30, 16, 0.79, 0.1


def loop_plain(model, data, rows, byz_rows, generator) -> list[torch.Tensor]:
    """Per client, per example: forward, backward, then normalise, noise (the plain loop)."""
    params = [p for p in model.parameters()]
    uploads = []
    for client_rows, size in [(r, BATCH) for r in rows] + [(r, BATCH) for r in byz_rows]:
        total = [torch.zeros_like(p) for p in params]
        for i in client_rows.tolist():
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(data.inputs[i : i + 1]), data.targets[i : i + 1]).backward()
            grads = [(1 - BETA) * p.grad for p in params]
            norm = torch.sqrt(sum((g * g).sum() for g in grads))
            for t, g in zip(total, grads, strict=True):
                t.add_(g / norm)
        flat = torch.cat([t.reshape(-1) for t in total])
        flat += SIGMA * torch.randn(flat.shape, generator=generator)
        uploads.append(flat / size)
    return uploads


def loop_vmap(model, data, rows, byz_rows, privatizers) -> list[torch.Tensor]:
    """Per client: sharefl.privacy.DPSGD (per-example vmap within the client)."""
    out = []
    for dp, client_rows in zip(privatizers, list(rows) + list(byz_rows), strict=True):
        out.append(dp.privatize(data.inputs[client_rows], data.targets[client_rows]).flat)
    return out


def batched_floor(model, data, rows, byz_rows) -> None:
    """One non-private forward + backward of every sampled example as a single batch: the
    least any method that computes these examples' gradients has to do."""
    batch = torch.cat([*rows, *byz_rows])
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(data.inputs[batch]), data.targets[batch]).backward()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--strict", action="store_true", help="exit 1 if the target is missed")
    add_smoke_flag(parser)
    args = parser.parse_args()
    smoke = use_smoke(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    keep_freed_memory()  # as `sharefl simulate` does, for both paths
    repeat = 3 if args.quick else 8
    emit_machine("simulator", device=args.device, torch_threads=torch.get_num_threads())

    # The seed000 setting on synthetic MNIST-shaped data (the timing does not depend on
    # the pixels; the real files need not be present).
    train = synthetic_dataset(2_000 if smoke else 60_000, shape=(1, 28, 28), seed=0)
    test = synthetic_dataset(100 if smoke else 1_000, shape=(1, 28, 28), seed=0, split="test")
    runs = load_runs("experiments/dp_filter_mnist_figure1.toml")
    run = next(
        r
        for r in runs
        if r.clients.byzantine == BYZANTINE
        and r.privacy.epsilon == 2.0
        and not r.aggregator.options["first_stage"]
    )
    sim = Simulation(run, device=args.device, train=train, test=test)
    gen = torch.Generator(device=sim.device).manual_seed(0)
    honest_ids = torch.arange(HONEST)
    byz_ids = torch.arange(BYZANTINE)
    momentum = torch.zeros(HONEST, sim.model.dim, device=sim.device)

    def vectorised():
        sim.honest_clients.clients.train(sim.model_vector, honest_ids, gen, momentum=momentum)
        assert sim.byzantine_clients.clients is not None
        sim.byzantine_clients.clients.train(sim.model_vector, byz_ids, gen)
        if sim.device.type == "cuda":
            torch.cuda.synchronize()

    # the same batches for the loops: honest Poisson batches of ~16, Byzantine one example
    rows, mask = sim.honest_clients.clients.sample(honest_ids.to(sim.device), gen)
    honest_rows = [r[m].cpu() for r, m in zip(rows, mask, strict=True)]
    byz_rows = [
        torch.randint(0, len(train), (1,), generator=torch.Generator().manual_seed(i))
        for i in range(BYZANTINE)
    ]
    model = copy.deepcopy(sim.model.module).cpu()
    cpu_gen = torch.Generator().manual_seed(1)
    privatizers = [
        DPSGD(
            model,
            F.cross_entropy,
            DPSGDConfig(Normalization(momentum=BETA), SIGMA, expected_batch_size=BATCH),
            generator=torch.Generator().manual_seed(i),
        )
        for i in range(HONEST + BYZANTINE)
    ]
    data_cpu = train

    def versus(name: str, key: str, baseline: Callable[[], object]) -> dict:
        """The vectorised round and ``baseline`` interleaved: their best times and ratio."""
        fast, base = compare(vectorised, baseline, repeat=repeat, warmup=1)
        speedup = round(base["best_s"] / fast["best_s"], 2)
        return {"name": name, "vectorised_s": fast, key: base, "speedup": speedup}

    def plain() -> object:
        return loop_plain(model, data_cpu, honest_rows, byz_rows, cpu_gen)

    record = versus("vectorised_vs_plain_loop", "loop_plain_s", plain)
    record["setting"] = "seed000 MNIST CNN, 20 honest DP-SGD (b_c=16) + 30 label flipping"
    record["target"] = ">= 5x (CPU)"
    if sim.device.type == "cpu":
        record["pass"] = record["speedup"] >= 5.0
    emit(record)
    records = [record]

    if torch.get_num_threads() > 1 and sim.device.type == "cpu":
        # Batch-1 forward/backward passes gain little from threads and can lose to their
        # synchronisation: time the plain loop on one thread too.
        name = "vectorised_vs_plain_loop_one_thread"

        def plain_one_thread() -> object:
            with torch_threads(1):
                return plain()

        emit(versus(name, "loop_plain_one_thread_s", plain_one_thread))
    emit(
        versus(
            "vectorised_vs_per_client_dpsgd",
            "loop_vmap_s",
            lambda: loop_vmap(model, data_cpu, honest_rows, byz_rows, privatizers),
        )
    )
    floor = versus(
        "vectorised_vs_batched_nonprivate_floor",
        "batched_floor_s",
        lambda: batched_floor(model, data_cpu, honest_rows, byz_rows),
    )
    del floor["speedup"]  # a floor is not a competitor: report vectorised / floor instead
    overhead = floor["vectorised_s"]["best_s"] / floor["batched_floor_s"]["best_s"]
    floor["overhead"] = round(overhead, 2)
    emit(floor)

    start = time.perf_counter()
    rounds = 1 if smoke else (3 if args.quick else 10)
    for _ in range(rounds):
        sim.step()
    seconds = (time.perf_counter() - start) / rounds
    emit(
        {
            "name": "simulated_rounds",
            "device": str(sim.device),
            "seconds_per_round": round(seconds, 4),
            "rounds_per_second": round(1 / seconds, 3),
            "projected_1500_rounds_min": round(1500 * seconds / 60, 1),
        }
    )
    finish(records, strict=args.strict)


if __name__ == "__main__":
    main()
