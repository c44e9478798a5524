"""Benchmark of sharefl.robust against its floor, a plain mean of the same tensor.

Input: n = 100 updates of d = 10^6 float32 on CPU, 90 honest rows ``N(μ, I)`` with a
shared mean ``μ ~ N(0, 0.01 I)`` and f = 10 rows under SHARE's scaled sign flip (``-10Δ``).
Every rule is timed interleaved with ``X.mean(0)`` on the same tensor
(:func:`common.compare`); ratios are of best times. Prints JSON lines: the machine, the
floor, then one line per rule. Run: ``python benchmarks/bench_robust.py`` (``--quick``:
fewer repetitions; ``--strict``: exit 1 when a target is missed).

Targets (issue #5): Median <= 40x the mean, TrimmedMean <= 60x, Krum and MultiKrum (one Gram
matrix, no loop over pairs) <= 60x; GeometricMedian converges in <= 10 Weiszfeld updates
at tol 1e-6. For context: ``torch.median(X, 0)`` and ``torch.sort(X, 0)`` (the naive
coordinate-wise baselines), and ByzFL's implementations on the same tensor when the
``byzfl`` package is installed (its aggregators are loaded without its training framework,
which needs torchvision); skipped otherwise.

Allocator: torch's default CPU allocator and glibc's malloc defaults (no environment
settings); the kernels reuse their buffers.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import types
from collections.abc import Callable
from typing import Any

import torch
from common import add_smoke_flag, compare, emit, emit_machine, finish, use_smoke

from sharefl.robust import (
    IOS,
    MDA,
    NNM,
    Bucketing,
    CenteredClipping,
    Clipping,
    GeometricMedian,
    HierarchicalAggregator,
    Krum,
    MeaMed,
    Mean,
    Median,
    MultiKrum,
    NoiseAwareFilter,
    RSAMaster,
    TrimmedMean,
    ZenoPlusPlus,
    rsa_sign,
)

N, D, F = 100, 1_000_000, 10
CLUSTER = 5  # SHARE: 20 cluster sums of 5 clients


def make_updates(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(X, μ): 90 honest rows N(μ, I) and 10 rows -10 times an honest update."""
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(D, generator=g) * 0.1
    X = torch.randn(N, D, generator=g).add_(mu)
    X[N - F :] *= -10.0
    return X, mu


def load_byzfl() -> Any | None:
    """ByzFL's aggregator classes, or None if the package is not installed.

    ``import byzfl`` also imports its training framework (torchvision and more); if that
    fails, the aggregator modules alone are imported under a bare package entry.
    """
    try:
        import byzfl

        return byzfl
    except Exception:  # a broken optional dependency of byzfl, not of ours
        for name in [m for m in sys.modules if m == "byzfl" or m.startswith("byzfl.")]:
            del sys.modules[name]
    spec = importlib.util.find_spec("byzfl")
    if spec is None or spec.submodule_search_locations is None:
        return None
    package = types.ModuleType("byzfl")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["byzfl"] = package
    try:
        return importlib.import_module("byzfl.aggregators")
    except Exception:
        return None


def record(
    name: str,
    timed: dict[str, float],
    floor: dict[str, float],
    target: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One result line: times, the ratio to the mean, and the target's verdict if any."""
    ratio = timed["best_s"] / floor["best_s"]
    out: dict[str, Any] = {
        "name": name,
        **timed,
        "mean_best_s": floor["best_s"],
        "ratio_to_mean": round(ratio, 2),
    }
    if target is not None:
        out["target_ratio"] = target
        out["pass"] = ratio <= target
    return {**out, **extra}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    add_smoke_flag(parser)
    args = parser.parse_args()
    global D
    if use_smoke(args):
        D = 1000
    repeat = 3 if args.quick else 10
    slow_repeat = 2 if args.quick else 4
    emit_machine(
        "robust",
        n=N,
        d=D,
        f=F,
        dtype="float32",
        torch=torch.__version__,
        torch_threads=torch.get_num_threads(),
        allocator="torch default CPU allocator, glibc malloc defaults",
        malloc_env={k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
    )
    X, mu = make_updates()
    records: list[dict[str, Any]] = []

    def floor_of(T: torch.Tensor) -> Callable[[], object]:
        return lambda: T.mean(dim=0)

    def run(
        name: str,
        fn: Callable[[], object],
        target: float | None = None,
        *,
        on: torch.Tensor = X,
        reps: int = repeat,
        **extra: Any,
    ) -> None:
        timed, floor = compare(fn, floor_of(on), repeat=reps, warmup=1)
        rec = record(name, timed, floor, target, **extra)
        records.append(rec)
        emit(rec)

    _, floor = compare(floor_of(X), floor_of(X), repeat=repeat)
    rate = 4 * N * D / floor["best_s"] / 1e9
    emit({"name": "mean", "kind": "baseline", **floor, "gbytes_per_s": round(rate, 2)})

    # coordinate-wise
    run("median", lambda: Median(f=F)(X), 40.0)
    run("trimmed_mean", lambda: TrimmedMean(f=F)(X), 60.0)
    run("meamed", lambda: MeaMed(f=F)(X))
    run("weighted_mean", lambda: Mean()(X, weights=torch.ones(N)))
    run("torch_median_dim0", lambda: torch.median(X, dim=0), reps=slow_repeat, kind="context")
    run("torch_sort_dim0", lambda: torch.sort(X, dim=0), reps=slow_repeat, kind="context")

    # distance-based
    run("krum", lambda: Krum(f=F)(X), 60.0)
    run("multikrum", lambda: MultiKrum(f=F)(X), 60.0)
    run("mda", lambda: MDA(f=F)(X))
    gm = GeometricMedian(f=F, tol=1e-6)
    result = gm.solve(X)
    run(
        "geometric_median",
        lambda: gm(X),
        tol=gm.tol,
        iterations=result.iterations,
        converged=result.converged,
        target_iterations=10,
        **{"pass": result.converged and result.iterations <= 10},
    )
    run("centered_clipping", lambda: CenteredClipping(f=F, tau=100.0)(X))

    # pre-aggregators
    run("clipping", lambda: Clipping(threshold=1000.0)(X))
    run("nnm", lambda: NNM(f=F)(X), reps=slow_repeat)
    bucketing = Bucketing(bucket_size=2, generator=torch.Generator().manual_seed(0))
    run("bucketing_s2", lambda: bucketing(X))

    # the papers' server rules
    sums = X.view(N // CLUSTER, CLUSTER, D).sum(dim=1)
    share = HierarchicalAggregator(rule=TrimmedMean(f=2))
    run("share_trimmed_mean_20_clusters", lambda: share(sums), on=sums)
    zeno = ZenoPlusPlus(lr=1.0, rho=1e-4, epsilon=0.2)
    run("zeno_plus_plus", lambda: zeno(X, -mu))
    noise = torch.randn(N, D, generator=torch.Generator().manual_seed(1))  # DP-noise-like
    noise[N - F :] *= 3.0
    flt = NoiseAwareFilter(noise_multiplier=16.0, batch_size=16, honest_fraction=0.5)
    run("noise_filter_two_stage", lambda: flt(noise, mu), on=noise, reps=slow_repeat)
    second = NoiseAwareFilter(noise_multiplier=16.0, honest_fraction=0.5, first_stage=False)
    run("noise_filter_second_stage", lambda: second(noise, mu), on=noise)
    signs = rsa_sign(X)
    master = RSAMaster()
    run("rsa_master_step", lambda: master.step(mu, signs), on=signs)
    own, received = X[0], X[1:11]
    run("ios_10_neighbours", lambda: IOS(q=2)(own, received), on=X[:11])

    byzfl = load_byzfl()
    if byzfl is None:
        emit({"name": "byzfl", "kind": "comparison", "skipped": "byzfl is not installed"})
    else:
        pairs = [
            ("median", Median(f=F), byzfl.Median()),
            ("trimmed_mean", TrimmedMean(f=F), byzfl.TrMean(f=F)),
            ("krum", Krum(f=F), byzfl.Krum(f=F)),
            ("multikrum", MultiKrum(f=F), byzfl.MultiKrum(f=F)),
            ("geometric_median", GeometricMedian(f=F), byzfl.GeometricMedian()),
            ("centered_clipping", CenteredClipping(f=F), byzfl.CenteredClipping()),
        ]
        for name, ours, theirs in pairs:
            mine, other = compare(lambda o=ours: o(X), lambda t=theirs: t(X), repeat=slow_repeat)
            emit(
                {
                    "name": f"{name}_vs_byzfl",
                    "kind": "comparison",
                    "best_s": mine["best_s"],
                    "byzfl_best_s": other["best_s"],
                    "byzfl_over_ours": round(other["best_s"] / mine["best_s"], 2),
                }
            )
    finish(records, strict=args.strict)


if __name__ == "__main__":
    main()
