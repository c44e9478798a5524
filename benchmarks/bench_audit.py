"""Benchmark of the round's safety checks against the round itself and the PRG floor.

What a round with R = 10 reclusterings of n = 100 clients spends on its safety checks, per
cluster size m = 3, 5, 10 (min_sum_size 3):

- plan: :func:`~sharefl.protocol.coordinator.plan_round` (the safe sampler
  :func:`~sharefl.protocol.audit.sample_safe_reclusterings` and the exact audit of the
  plan), and each part alone;
- release: the coordinator's :class:`~sharefl.protocol.coordinator.ReleaseAuditor` asked
  for every cluster sum of the round, in order, plus the realised audit of
  :meth:`~sharefl.protocol.coordinator.RoundCoordinator.result`; without drop-outs (every
  sum is a planned cluster: a set look-up) and with 10% of the clients dropping after key
  sharing in every reclustering, drawn afresh per reclustering (every release then runs
  an exact audit of its connected component);
- clients: each client's :class:`~sharefl.protocol.client_round.ClientRound`, its audit of
  the plan when the round starts and its check of each of its R unmask requests (one
  client, and all 100 as the in-process driver runs them), without and with drop-outs.
  The unmask checks are timed as a client that verifies releases runs them (signed mode,
  ``ClientPolicy(verify_releases=True)`` where the policy has that field); the count of
  requests it refuses, that the coordinator approved, is printed too.

None of this depends on d, so it is timed on assignments of length 1; the same run then
times whole in-process rounds (``secure_sum``, n = 100, R = 10, d = ``--d``, default 10^6,
uint32 inputs, without and with the same drop-outs: these rounds run the checks above
for real, the clients' unmask checks only where the default policy verifies releases)
and the raw AES-128-CTR keystream of one d-word mask (the client's PRG floor per mask),
and prints every check's cost as a fraction of them.

The plan bound (``client_plan_*`` records): what one client with the *default*
:class:`~sharefl.protocol.client.ClientPolicy` spends on the plan a server sends, beside
the same AES floor: the safe planner's plan at n = 100, R = 10; the largest plans the
default policy accepts (the safe planner's at ``max_participants`` clients and
``max_reclusterings`` reclusterings; and one component of k random clusters of 3 linked
by R = 3 reclusterings, k the largest whose audit fits ``max_audit_work``); and what a
refusal costs: a plan over ``max_participants`` (refused before the audit) and a linked
plan of twice that k (refused when the work budget is spent), beside the unbounded exact
audit of that plan (the cost without the bound). Prints JSON lines. Run:
``python benchmarks/bench_audit.py [--d 1000000] [--sizes 3 5 10] [--no-round] [--no-bound]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections import defaultdict

import numpy as np
from bench_protocol import emit_keystream_floor
from common import add_smoke_flag, emit, emit_machine, finish, timeit, use_smoke

from sharefl.protocol import client_round, secure_sum
from sharefl.protocol.assignment import plan_assignment
from sharefl.protocol.audit import AuditBudgetExceeded, audit, sample_safe_reclusterings
from sharefl.protocol.client import ClientPolicy, ClientState
from sharefl.protocol.client_round import ClientRound
from sharefl.protocol.clustering import Clustering, random_clustering
from sharefl.protocol.coordinator import ReleaseAuditor, SecureAggregationSettings, plan_round
from sharefl.protocol.errors import ClientRefusal
from sharefl.protocol.messages import UnmaskRequest
from sharefl.protocol.plan import RoundPlan

N, R, MIN_SUM, DROP = 100, 10, 3, 0.10


def dropouts_per_reclustering(n: int, r: int, fraction: float, seed: int) -> list[list[int]]:
    """Clients that drop after key sharing (before masking), drawn afresh per reclustering."""
    rng = np.random.default_rng(seed)
    return [sorted(rng.choice(n, size=int(fraction * n), replace=False).tolist()) for _ in range(r)]


def release_checks(plan, report, dropped: list[list[int]]) -> tuple[int, int]:
    """What the coordinator does for one round: ask the release check for every cluster sum
    (its survivors) in order, then audit what was released. Returns (asked, withheld)."""
    auditor = ReleaseAuditor(plan, MIN_SUM, plan_is_safe=not report.leaks)
    asked = withheld = 0
    for clustering, gone in zip(plan.clusterings, dropped, strict=True):
        for members in clustering.clusters:
            survivors = tuple(c for c in members if c not in gone)
            if len(survivors) < 2:  # too few maskers: the cluster fails before the check
                continue
            asked += 1
            withheld += auditor.check(survivors) is not None
    audit(
        [Clustering((tuple(row),)) for row in auditor.approved],
        client_ids=plan.participants,
        min_sum_size=MIN_SUM,
    )
    return asked, withheld


def approved_sums(plan, report, dropped) -> list[list[tuple[int, ...] | None]]:
    """Per reclustering and cluster: the survivors the coordinator releases (None: withheld
    or failed), i.e. the unmask requests the clients receive."""
    auditor = ReleaseAuditor(plan, MIN_SUM, plan_is_safe=not report.leaks)
    out = []
    for clustering, gone in zip(plan.clusterings, dropped, strict=True):
        row = []
        for members in clustering.clusters:
            survivors = tuple(c for c in members if c not in gone)
            ok = len(survivors) >= 2 and auditor.check(survivors) is None
            row.append(survivors if ok else None)
        out.append(row)
    return out


def client_policy(**extra) -> ClientPolicy:
    """The policy secure_sum gives its clients here (accept clusters and sums of at least
    3, up to R reclusterings), with ``extra`` fields where this version has them (the
    release checks are timed with ``verify_releases=True``: what a client of an untrusted,
    signed-mode server runs; by default an unsigned client leaves them to the server)."""
    names = {f.name for f in dataclasses.fields(ClientPolicy)}
    known = {k: v for k, v in extra.items() if k in names}
    return ClientPolicy(
        min_cluster_size=MIN_SUM, min_sum_size=MIN_SUM, max_reclusterings=R, **known
    )


class _Answering:
    """The part of a ClientSession that ClientRound.handle touches, answering nothing (the
    guard's checks are what is timed, not the unmasking)."""

    def __init__(self, assignment) -> None:
        self.assignment = assignment
        self.context = assignment.context
        # the state in which a session expects its unmask request (the guard checks it)
        self.state = ClientState.SIGNED if assignment.signed else ClientState.MASKED

    def handle(self, message) -> None:
        return None

    def abort(self) -> None:
        return None


def client_guards(plan, assignments, released, policy) -> tuple[list[float], list[float], int]:
    """Every client's guard over the round: the plan audit at round start, then for each
    reclustering the assignment check and, for each released sum of its cluster, the unmask
    request check. Returns per-client seconds of the plan audit and of the R release checks,
    and the number of unmask requests refused."""
    plan_s, release_s, refused = [], [], 0
    for cid in plan.participants:
        start = time.perf_counter()
        guard = ClientRound(cid, plan, policy)
        plan_s.append(time.perf_counter() - start)
        spent = 0.0
        for r, clustering in enumerate(plan.clusterings):
            k = clustering.cluster_index(cid)
            assignment = assignments[r][k]
            survivors = released[r][k]
            start = time.perf_counter()
            guard.vet(assignment)
            if survivors is not None and cid in survivors:
                dropped = tuple(c for c in assignment.members if c not in survivors)
                try:
                    guard.handle(
                        _Answering(assignment),
                        UnmaskRequest(assignment.context, survivors, dropped),
                    )
                except ClientRefusal:
                    refused += 1
            spent += time.perf_counter() - start
        release_s.append(spent)
    return plan_s, release_s, refused


def checks_for(m: int, repeat: int, seed: int) -> dict:
    """The safety checks of one R = 10 round of clusters of m (seconds; best of ``repeat``
    for the plan and release parts, the clients' guards measured over all 100 clients)."""
    ids = list(range(N))
    settings = SecureAggregationSettings(cluster_size=m, reclusterings=R, min_sum_size=MIN_SUM)
    plan, report = plan_round(0, ids, settings, np.random.default_rng(seed))
    plan_s = timeit(
        lambda: plan_round(0, ids, settings, np.random.default_rng(seed)), repeat=repeat
    )
    sampler_s = timeit(
        lambda: sample_safe_reclusterings(
            ids, m, R, np.random.default_rng(seed), min_sum_size=MIN_SUM
        ),
        repeat=repeat,
    )
    audit_s = timeit(
        lambda: audit(plan.clusterings, client_ids=ids, min_sum_size=MIN_SUM), repeat=repeat
    )
    none = [[] for _ in range(R)]
    drops = dropouts_per_reclustering(N, R, DROP, seed + 1)
    release = {}
    for label, dropped in (("no_dropouts", none), ("dropouts", drops)):
        asked, withheld = release_checks(plan, report, dropped)
        release[label] = {
            "sums_checked": asked,
            "withheld": withheld,
            **timeit(lambda d=dropped: release_checks(plan, report, d), repeat=repeat),
        }
    rng = np.random.default_rng(seed)
    assignments = [
        [
            plan_assignment(plan.context(r, k), members, length=1, bits=32, rng=rng)
            for k, members in enumerate(clustering.clusters)
        ]
        for r, clustering in enumerate(plan.clusterings)
    ]
    policy = client_policy(verify_releases=True)
    clients = {}
    for label, dropped in (("no_dropouts", none), ("dropouts", drops)):
        released = approved_sums(plan, report, dropped)
        plan_each, release_each, refused = client_guards(plan, assignments, released, policy)
        clients[label] = {
            "plan_audit_per_client_median_s": statistics.median(plan_each),
            "plan_audit_all_clients_s": sum(plan_each),
            "release_checks_per_client_median_s": statistics.median(release_each),
            "release_checks_all_clients_s": sum(release_each),
            "unmask_requests_refused": refused,
        }
    return {
        "plan": {
            "rank": report.rank,
            "plan_round_best_s": plan_s["best_s"],
            "sampler_best_s": sampler_s["best_s"],
            "plan_audit_best_s": audit_s["best_s"],
        },
        "release": release,
        "clients": clients,
        "sizes": sorted(set(plan.clusterings[0].sizes)),
    }


def round_for(m: int, d: int, dropped: list[list[int]] | None, seed: int) -> dict:
    """One in-process round (n = 100, R = 10, clusters of m, d-word uint32 inputs) with
    every check in place; its wall time and the observer's per-stage sums."""
    rng = np.random.default_rng(seed)
    inputs = {cid: rng.integers(0, 2**32, size=d, dtype=np.uint32) for cid in range(N)}
    times: dict[str, list[float]] = defaultdict(list)

    def observer(stage, actor, seconds):
        times[f"{'server' if actor is None else 'client'}_{stage}"].append(seconds)

    drops = None if dropped is None else [{"mask": gone} for gone in dropped]
    start = time.perf_counter()
    result = secure_sum(
        inputs,
        cluster_size=m,
        reclusterings=R,
        min_sum_size=MIN_SUM,
        dropouts=drops,
        seed=seed,
        observer=observer,
    )
    round_s = time.perf_counter() - start
    ok = sum(len(rec.clusters) for rec in result.reclusterings)
    failed = sum(len(rec.failed) for rec in result.reclusterings)
    withheld = sum(len(rec.withheld) for rec in result.reclusterings)
    del inputs
    return {
        "round_s": round_s,
        "clusters_ok": ok,
        "clusters_failed": failed,
        "withheld": withheld,
        "client_mask_median_s": statistics.median(times["client_mask"]),
        "stage_seconds": {k: sum(v) for k, v in sorted(times.items())},
    }


def client_plan_audit(plan: RoundPlan, policy: ClientPolicy, repeat: int) -> dict:
    """One client's :class:`ClientRound` over ``plan`` (its checks of the plan, the audit
    included, with the cache of audited plans cleared before each run, as a real client
    that audits each plan once pays): seconds, and what the client decided."""
    cid = plan.participants[0]

    def run() -> str:
        client_round._plan_audit.cache_clear()
        try:
            ClientRound(cid, plan, policy)
        except ClientRefusal as exc:
            return f"refused: {exc}"
        return "accepted"

    outcome = run()
    return {"outcome": outcome, **timeit(run, repeat=repeat, warmup=0)}


def linked_plan(k: int, reclusterings: int, seed: int) -> RoundPlan:
    """R independent random partitions of k clients into clusters of 3: one component in
    which every client is linked to every other through shared sums (the costly shape for
    the exact audit: its elimination is about k³)."""
    rng = np.random.default_rng(seed)
    return RoundPlan(0, tuple(random_clustering(range(k), 3, rng) for _ in range(reclusterings)))


def largest_linked(policy: ClientPolicy, reclusterings: int, seed: int) -> tuple[int, int]:
    """The largest k (to a step of 10) whose :func:`linked_plan` audit fits the policy's
    work budget, and that audit's work."""
    lo, hi, work = 10, 10, 0
    while True:  # double until the budget is exceeded
        try:
            report = audit(
                linked_plan(hi, reclusterings, seed).clusterings,
                min_sum_size=policy.sum_floor,
                work_budget=policy.max_audit_work,
            )
        except AuditBudgetExceeded:
            break
        lo, hi, work = hi, 2 * hi, report.work
    while hi - lo > 10:
        mid = (lo + hi) // 2
        try:
            report = audit(
                linked_plan(mid, reclusterings, seed).clusterings,
                min_sum_size=policy.sum_floor,
                work_budget=policy.max_audit_work,
            )
        except AuditBudgetExceeded:
            hi = mid
            continue
        lo, work = mid, report.work
    return lo, work


def plan_bound_records(policy: ClientPolicy, floor_one: float, repeat: int, seed: int) -> list:
    """The ``client_plan_*`` records (see the module docstring) for ``policy``."""
    n_max, r_max = policy.max_participants, policy.max_reclusterings
    budget = policy.max_audit_work

    def record(name: str, plan: RoundPlan, **extra) -> dict:
        timed = client_plan_audit(plan, policy, repeat)
        try:
            work = audit(plan.clusterings, min_sum_size=policy.sum_floor, work_budget=budget).work
        except AuditBudgetExceeded:
            work = None
        return {
            "name": name,
            "kind": "client_plan",
            "n": plan.clusterings[0].num_clients,
            "reclusterings": plan.reclusterings,
            "policy_max_participants": n_max,
            "policy_max_reclusterings": r_max,
            "policy_max_audit_work": budget,
            "audit_work": work,
            "outcome": timed["outcome"][:160],
            "client_plan_check_best_s": timed["best_s"],
            "client_plan_check_median_s": timed["median_s"],
            "over_aes_floor": timed["best_s"] / floor_one,
            "over_R_masks_floor": timed["best_s"] / (plan.reclusterings * floor_one),
            **extra,
        }

    def safe(n: int, r: int) -> RoundPlan:
        ids = list(range(n))
        return RoundPlan(0, tuple(sample_safe_reclusterings(ids, 3, r, seed, min_sum_size=3)))

    out = [record("client_plan_audit_n100_R10", safe(N, R), planner="safe", cluster_size=3)]
    out.append(
        record("client_plan_audit_bound_safe", safe(n_max, r_max), planner="safe", cluster_size=3)
    )
    k, _ = largest_linked(policy, 3, seed)
    out.append(
        record(
            "client_plan_audit_bound_linked",
            linked_plan(k, 3, seed),
            planner="random",
            cluster_size=3,
            linked_component=k,
        )
    )
    over = RoundPlan(
        0, (Clustering(tuple((i, i + 1, i + 2) for i in range(0, 3 * (n_max // 3 + 1), 3))),)
    )
    out.append(record("client_plan_refused_participants", over, cluster_size=3))
    linked = linked_plan(2 * k, 3, seed)
    start = time.perf_counter()
    unbounded = audit(linked.clusterings, min_sum_size=policy.sum_floor)
    unbounded_s = time.perf_counter() - start
    out.append(
        record(
            "client_plan_refused_work",
            linked,
            planner="random",
            cluster_size=3,
            linked_component=2 * k,
            baseline_unbounded_audit_s=unbounded_s,
            baseline_unbounded_audit_work=unbounded.work,
        )
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d", type=int, default=1_000_000, help="length of the timed rounds")
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 5, 10])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-round", action="store_true", help="skip the d-word rounds")
    parser.add_argument("--no-bound", action="store_true", help="skip the client_plan_* records")
    parser.add_argument("--strict", action="store_true")
    add_smoke_flag(parser)
    args = parser.parse_args()
    if use_smoke(args):
        args.d, args.sizes, args.repeat = 1000, [5], 1
    emit_machine("audit", n=N, reclusterings=R, min_sum_size=MIN_SUM, d=args.d)
    floor_one = emit_keystream_floor(args.d)
    records = []
    for m in args.sizes:
        checks = checks_for(m, args.repeat, args.seed)
        plan_t = checks["plan"]["plan_round_best_s"]
        drops = dropouts_per_reclustering(N, R, DROP, args.seed + 1)
        rounds = {}
        if not args.no_round:
            rounds = {
                "no_dropouts": round_for(m, args.d, None, args.seed),
                "dropouts": round_for(m, args.d, drops, args.seed),
            }
        for label in ("no_dropouts", "dropouts"):
            release = checks["release"][label]
            clients = checks["clients"][label]
            server_s = plan_t + release["best_s"]
            client_one = (
                clients["plan_audit_per_client_median_s"]
                + clients["release_checks_per_client_median_s"]
            )
            all_clients = (
                clients["plan_audit_all_clients_s"] + clients["release_checks_all_clients_s"]
            )
            record = {
                "name": f"checks_m{m}_{label}",
                "n": N,
                "reclusterings": R,
                "cluster_size": m,
                "cluster_sizes": checks["sizes"],
                "dropped_per_reclustering": int(DROP * N) if label == "dropouts" else 0,
                **checks["plan"],
                "release_checks_best_s": release["best_s"],
                "release_sums_checked": release["sums_checked"],
                "release_withheld": release["withheld"],
                **clients,
                "server_checks_per_round_s": server_s,
                "client_checks_per_client_s": client_one,
                "client_checks_all_clients_s": all_clients,
                "client_checks_per_client_over_aes_floor": client_one / floor_one,
                "client_checks_per_client_over_R_masks_floor": client_one / (R * floor_one),
            }
            if rounds:
                rnd = rounds[label]
                record.update(
                    {
                        "round_d": args.d,
                        "round_s": rnd["round_s"],
                        "round_clusters_ok": rnd["clusters_ok"],
                        "round_clusters_failed": rnd["clusters_failed"],
                        "round_withheld": rnd["withheld"],
                        "round_client_mask_median_s": rnd["client_mask_median_s"],
                        "round_stage_seconds": rnd["stage_seconds"],
                        "server_checks_over_round": server_s / rnd["round_s"],
                        "client_plan_audits_all_over_round": clients["plan_audit_all_clients_s"]
                        / rnd["round_s"],
                        "client_release_checks_all_over_round": clients[
                            "release_checks_all_clients_s"
                        ]
                        / rnd["round_s"],
                        "all_checks_over_round": (server_s + all_clients) / rnd["round_s"],
                        "client_checks_per_client_over_its_masking": client_one
                        / (R * rnd["client_mask_median_s"]),
                    }
                )
            records.append(record)
            emit(record)
    if not args.no_bound:
        policy = ClientPolicy()
        if args.smoke:  # the same records for a policy scaled down to tiny sizes
            policy = ClientPolicy(max_participants=120, max_audit_work=1 << 16)
        for record in plan_bound_records(policy, floor_one, args.repeat, args.seed):
            records.append(record)
            emit(record)
    finish(records, strict=args.strict)


if __name__ == "__main__":
    main()
