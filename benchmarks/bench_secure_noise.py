"""Benchmark: a deployment client's DP-SGD round with noise from the AES-CTR stream against
the same round with torch's generator.

The client is the real one: :class:`sharefl.simulation_bridge.SimulationTrainer` (what
``sharefl launch`` / ``sharefl client`` run), one honest client training ``local_steps``
DP-SGD steps (per-example gradients, flat clipping, one Gaussian noise vector of d values
per step) on seed000's MNIST CNN (``dp_filter_cnn``, d = 21,802) or a wider MLP, with
synthetic MNIST-shaped data. The secure trainer draws its noise from its
:class:`~sharefl.privacy.secure_noise.SecureGenerator` (Box–Muller on AES-256-CTR words,
generated on the CPU and copied to the model's device); the baseline is the same trainer
with an OS-seeded ``torch.Generator`` (what deployment clients used before). Both
generators' torch states are reseeded alike before every round, so both rounds sample the
same batches and only the noise differs (Poisson batch sizes would otherwise move a round's
time by ±10 %). Timed interleaved (benchmarks/common.py ``compare``); the ratio uses best
times. The noise alone
(``standard_normal`` of d values) is timed the same way.

Prints JSON lines: the machine, one record per model × case, a summary.
Run: ``python benchmarks/bench_secure_noise.py [--device cuda] [--threads 1]``.
"""

from __future__ import annotations

import argparse

import torch
from common import add_smoke_flag, compare, emit, emit_machine, finish, use_smoke

from sharefl.privacy.noise import standard_normal
from sharefl.robust_strategy import os_seeded_generator
from sharefl.simulation_bridge import SimulationTrainer
from sharefl.simulator.config import expand

MODELS = {
    "dp_filter_cnn": ({"name": "dp_filter_cnn"}, [1, 28, 28]),
    "mlp_1024": ({"name": "mlp", "options": {"hidden": [1024, 1024]}}, [1, 28, 28]),
}
BATCH_SEED = 12345
SMOKE_MODEL = ({"name": "mlp", "options": {"hidden": [8]}}, [1, 4, 4])


def trainer_pair(
    model: dict, shape: list[int], device: str, steps: int, batch: int
) -> tuple[SimulationTrainer, SimulationTrainer]:
    (run,) = expand(
        {
            "name": "bench-secure-noise",
            "seed": 1,
            "rounds": 1,
            "device": device,
            "data": {
                "dataset": "synthetic",
                "options": {"num_examples": 4 * 10 * batch, "shape": shape},
                "partition": "iid",
            },
            "model": model,
            "clients": {"honest": 4},
            "training": {"batch_size": batch, "local_steps": steps, "upload": "delta"},
            "privacy": {"enabled": True, "noise_multiplier": 1.0, "clip": 1.0, "delta": 1e-5},
            "secure_aggregation": {"cluster_size": 1},
            "aggregator": {"name": "mean"},
        }
    )
    secure, plain = SimulationTrainer(run, 0), SimulationTrainer(run, 0)
    plain.client.use_generator(os_seeded_generator(plain.client.device))
    return secure, plain


def measure(
    name: str, model: dict, shape: list[int], device: str, steps: int, batch: int, repeat: int
) -> list[dict]:
    """The two records of one model: a DP-SGD round, and the noise alone."""
    secure, plain = trainer_pair(model, shape, device, steps, batch)
    assert secure.client.generator is secure.randomness  # the secure path is timed
    w = secure.client.initial_model().detach().cpu().numpy()
    sync = torch.cuda.synchronize if device.startswith("cuda") else lambda: None

    def round_of(trainer: SimulationTrainer) -> None:
        # Same batches for both (their torch states reseeded alike): only the noise
        # differs; the secure noise still comes from the AES-CTR stream.
        trainer.client.generator.manual_seed(BATCH_SEED)
        trainer(w, round=0, client_id=0)
        sync()

    mine, base = compare(lambda: round_of(secure), lambda: round_of(plain), repeat=repeat)
    dim = secure.client.dim
    first = {
        "name": f"{name}/dp_sgd_round",
        "model": name,
        "dim": dim,
        "local_steps": steps,
        "batch": batch,
        "secure_s": mine["best_s"],
        "torch_s": base["best_s"],
        "secure_median_s": mine["median_s"],
        "torch_median_s": base["median_s"],
        "ratio": mine["best_s"] / base["best_s"],
        "secure_samples_drawn": secure.randomness.gaussian.drawn,
    }
    emit(first)
    where = secure.client.device
    torch_gen = os_seeded_generator(where)

    def noise(generator: torch.Generator) -> None:
        standard_normal((dim,), generator, device=where)
        sync()

    mine, base = compare(lambda: noise(secure.randomness), lambda: noise(torch_gen), repeat=repeat)
    second = {
        "name": f"{name}/noise_only",
        "model": name,
        "dim": dim,
        "secure_s": mine["best_s"],
        "torch_s": base["best_s"],
        "ratio": mine["best_s"] / base["best_s"],
        "secure_msamples_per_s": dim / mine["best_s"] / 1e6,
    }
    emit(second)
    return [first, second]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--steps", type=int, default=5, help="local DP-SGD steps per round")
    parser.add_argument("--batch", type=int, default=64, help="expected batch size")
    parser.add_argument("--repeat", type=int, default=15)
    add_smoke_flag(parser)
    args = parser.parse_args()
    smoke = use_smoke(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    emit_machine("secure_noise", device=args.device, threads=torch.get_num_threads())
    models = {"mlp_smoke": SMOKE_MODEL} if smoke else MODELS
    steps, batch = (1, 8) if smoke else (args.steps, args.batch)
    records = []
    for name, (model, shape) in models.items():
        records += measure(name, model, shape, args.device, steps, batch, args.repeat)
    finish(records)


if __name__ == "__main__":
    main()
