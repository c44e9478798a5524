"""Split a dataset's examples among federated clients.

:func:`partition` maps the labels ``targets`` (``[N]`` non-negative ints) to one sorted int64
array of example indices per client, deterministically from ``seed``. Schemes
(:data:`SCHEMES`):

* ``iid`` — a random permutation cut into ``num_clients`` near-equal parts;
* ``dirichlet`` — per class, client shares ~ Dir(``alpha``) (Hsu et al. 2019);
* ``shards`` — ``labels_per_client`` single-label shards per client (McMahan et al. 2017);
* ``dp_filter_weighted`` — Algorithm 4 of Xiang et al. (the DP filter: random per-class
  weights, contiguous chunks);
* ``dp_rsa_shared_half`` — DP-RSA's non-i.i.d. split (Zhu and Ling: half of each class shared
  by everybody, half by the class's own workers);
* ``fed_cdp_replicated_shards`` — Fed-αCDP's label-sorted shards (Wei et al.), replicated to
  serve many clients.

The codenames ``seed000``, ``seed002``, ``seed003`` are accepted as aliases
(:mod:`sharefl.simulator.names`). All schemes except ``fed_cdp_replicated_shards`` give
disjoint parts that cover every example; ``fed_cdp_replicated_shards`` covers all but fewer
than ``shard_size`` examples, and its replicas repeat indices across clients. Bad
arguments raise :class:`PartitionError` naming the option to change.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from sharefl.simulator.errors import SimulatorError
from sharefl.simulator.names import partition_name


class PartitionError(SimulatorError, ValueError):
    """A partition cannot be made as asked; the message names the option to change."""


SCHEMES = (
    "iid",
    "dirichlet",
    "shards",
    "dp_filter_weighted",
    "dp_rsa_shared_half",
    "fed_cdp_replicated_shards",
)


def partition(
    targets: Any, num_clients: int, scheme: str = "iid", *, seed: int = 0, **options: Any
) -> list[np.ndarray]:
    """Indices of each client's examples.

    Args:
        targets: labels, array-like or tensor of shape ``[N]``, non-negative integers.
        num_clients: number of parts, ``>= 1``.
        scheme: one of :data:`SCHEMES`, or an old codename (``seed000``, ``seed002``,
            ``seed003``: :data:`~sharefl.simulator.names.PARTITION_ALIASES`).
        seed: seed of the only randomness used (``numpy.random.default_rng``).
        **options: per scheme —
            ``dirichlet``: ``alpha`` (0.5) > 0, ``min_size`` (1), ``max_tries`` (1000);
            ``shards``: ``labels_per_client`` (2);
            ``dp_filter_weighted``: ``iid`` (False);
            ``dp_rsa_shared_half``: ``shared_fraction`` (0.5);
            ``fed_cdp_replicated_shards``: ``shard_size`` (250), ``shards_per_client`` (2).

    Returns:
        ``num_clients`` sorted int64 arrays of indices into ``targets``.

    Raises:
        PartitionError: unknown scheme or option, ``num_clients < 1``, more clients than the
            scheme can serve, invalid option values, or labels that are not a 1-D array of
            non-negative integers.
    """
    scheme = partition_name(scheme)
    if scheme not in _SCHEMES:
        raise PartitionError(f"unknown scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    fn, defaults = _SCHEMES[scheme]
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise PartitionError(
            f"unknown option(s) {', '.join(unknown)} for scheme {scheme!r}; "
            f"allowed: {', '.join(defaults) or 'none'}"
        )
    if isinstance(num_clients, bool) or not isinstance(num_clients, int | np.integer):
        raise PartitionError(f"num_clients must be an int, got {num_clients!r}")
    if num_clients < 1:
        raise PartitionError(f"num_clients must be >= 1, got {num_clients}")
    y = _labels(targets)
    if y.size == 0:
        raise PartitionError("targets is empty: nothing to partition")
    parts = fn(y, int(num_clients), np.random.default_rng(seed), **{**defaults, **options})
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _labels(targets: Any) -> np.ndarray:
    if hasattr(targets, "detach"):
        targets = targets.detach().cpu().numpy()
    y = np.asarray(targets)
    if y.ndim != 1:
        raise PartitionError(f"targets must be 1-D, got shape {y.shape}")
    if y.size and not np.issubdtype(y.dtype, np.integer):
        raise PartitionError(f"targets must be integer labels, got dtype {y.dtype}")
    y = y.astype(np.int64)
    if y.size and y.min() < 0:
        raise PartitionError("targets must be non-negative")
    return y


def _need_clients(n: int, num_clients: int, what: str = "examples") -> None:
    if num_clients > n:
        raise PartitionError(f"num_clients={num_clients} exceeds the {n} {what}; use fewer clients")


def _classes(y: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Each present class's indices, shuffled, in increasing label order."""
    perm = rng.permutation(len(y))
    order = perm[np.argsort(y[perm], kind="stable")]
    bounds = np.flatnonzero(np.diff(y[order])) + 1
    return np.split(order, bounds) if len(y) else []


# ---------------------------------------------------------------------------------------------


def _iid(y: np.ndarray, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A random permutation cut into ``n`` parts whose sizes differ by at most one."""
    _need_clients(len(y), n)
    return np.array_split(rng.permutation(len(y)), n)


def _dirichlet(
    y: np.ndarray,
    n: int,
    rng: np.random.Generator,
    *,
    alpha: float,
    min_size: int,
    max_tries: int,
) -> list[np.ndarray]:
    """Per class, proportions ``p ~ Dir(alpha·1_n)`` over clients; the class's shuffled
    indices are cut at ``floor(cumsum(p)·n_c)``. Redrawn (all classes) until every client has
    ``min_size`` examples, at most ``max_tries`` times. Small ``alpha`` → few classes per
    client; large ``alpha`` → close to i.i.d."""
    if not alpha > 0 or not math.isfinite(alpha):
        raise PartitionError(f"alpha must be a positive number, got {alpha}")
    if min_size < 0:
        raise PartitionError(f"min_size must be >= 0, got {min_size}")
    if max_tries < 1:
        raise PartitionError(f"max_tries must be >= 1, got {max_tries}")
    if n * min_size > len(y):
        raise PartitionError(
            f"min_size={min_size} for {n} clients needs {n * min_size} examples, only "
            f"{len(y)} exist; lower min_size or num_clients"
        )
    classes = _classes(y, rng)
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(n)]
        for idx in classes:
            p = rng.dirichlet(np.full(n, float(alpha)))
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].append(chunk)
        out = [np.concatenate(p) if p else np.empty(0, np.int64) for p in parts]
        if min(len(p) for p in out) >= min_size:
            return out
    raise PartitionError(
        f"no Dirichlet draw gave every client min_size={min_size} examples in "
        f"max_tries={max_tries} tries; raise alpha or max_tries, or lower min_size"
    )


def _shards(
    y: np.ndarray, n: int, rng: np.random.Generator, *, labels_per_client: int
) -> list[np.ndarray]:
    """McMahan et al.'s pathological split with single-label shards: ``n·k`` shards
    (``k = labels_per_client``) are allotted to the classes in proportion to their sizes
    (D'Hondt, at least one each), each class's shuffled indices are cut into its shards of
    near-equal size, and each client gets ``k`` random shards — so at most ``k`` labels.
    With equal class sizes divisible by the shard size (MNIST-like 60,000/200 = 300) this
    is exactly "sort by label, cut into equal shards"."""
    k = labels_per_client
    if k < 1:
        raise PartitionError(f"labels_per_client must be >= 1, got {k}")
    classes = _classes(y, rng)
    num_shards = n * k
    if num_shards < len(classes):
        raise PartitionError(
            f"{n} clients × labels_per_client={k} = {num_shards} shards cannot cover "
            f"{len(classes)} classes; raise num_clients or labels_per_client"
        )
    _need_clients(len(y), num_shards, "examples (one per shard needed)")
    sizes = np.array([len(c) for c in classes])
    count = np.ones(len(classes), np.int64)
    for _ in range(num_shards - len(classes)):
        count[np.argmax(sizes / (count + 1))] += 1
    shards = [s for idx, c in zip(classes, count, strict=True) for s in np.array_split(idx, c)]
    owner = rng.permutation(num_shards).reshape(n, k)
    return [np.concatenate([shards[s] for s in row]) for row in owner]


def _dp_filter_weighted(
    y: np.ndarray, n: int, rng: np.random.Generator, *, iid: bool
) -> list[np.ndarray]:
    """Xiang et al.'s Algorithm 4 (as their code does it). For each class (shuffled), weights
    ``V ~ U(0, 1)^n`` (``iid=True``: equal weights) are redrawn until every share
    ``V_j/ΣV·n_c`` is at least 1; worker ``j < n-1`` takes the next ``round(share_j)``
    examples and worker ``n-1`` the rest. The workers' lists are concatenated (worker 0
    first) into ``L``, which is cut into ``n`` contiguous chunks of ``⌈|L|/n⌉`` (the last
    one shorter)."""
    classes = _classes(y, rng)
    small = [len(c) for c in classes if len(c) < n]
    if small:
        raise PartitionError(
            f"dp_filter_weighted gives every worker a share of every class, but a class has only "
            f"{min(small)} examples for num_clients={n}; use fewer clients"
        )
    per_worker: list[list[np.ndarray]] = [[] for _ in range(n)]
    for idx in classes:
        for _ in range(10_000):
            v = np.ones(n) if iid else rng.random(n)
            share = v / v.sum() * len(idx)
            if share.min() >= 1:
                break
        else:
            raise PartitionError(
                "dp_filter_weighted: could not draw shares >= 1; use fewer clients"
            )
        cuts = np.minimum(np.cumsum(np.round(share[:-1])).astype(np.int64), len(idx))
        for worker, chunk in enumerate(np.split(idx, cuts)):
            per_worker[worker].append(chunk)
    flat = np.concatenate([np.concatenate(w) for w in per_worker])
    size = math.ceil(len(flat) / n)
    out = [flat[i * size : (i + 1) * size] for i in range(n)]
    if len(out[-1]) == 0:
        raise PartitionError(
            f"dp_filter_weighted: chunks of ⌈{len(flat)}/{n}⌉ = {size} leave the last worker "
            "empty; use fewer clients"
        )
    return out


def _dp_rsa_shared_half(
    y: np.ndarray, n: int, rng: np.random.Generator, *, shared_fraction: float
) -> list[np.ndarray]:
    """Zhu & Ling's (DP-RSA) non-i.i.d. split. The workers are cut into one contiguous group
    per class (``np.array_split(range(n), C)``: with 30 workers and 10 digits, workers
    3c..3c+2 own digit c). For each class ``c`` (shuffled), the first
    ``⌊shared_fraction·n_c⌋`` examples are spread evenly over all ``n`` workers and the rest
    evenly over group ``c``. With the authors' 6,000 images per class this is their code's
    split: worker ``i`` holds 1,000 images of digit ``⌊i/3⌋`` plus 100 of every digit. Their
    i.i.d. split is the ``iid`` scheme."""
    if not 0.0 <= shared_fraction <= 1.0:
        raise PartitionError(f"shared_fraction must lie in [0, 1], got {shared_fraction}")
    classes = _classes(y, rng)
    if n < len(classes):
        raise PartitionError(
            "dp_rsa_shared_half needs at least one worker per class: "
            f"num_clients={n} < {len(classes)} classes"
        )
    groups = np.array_split(np.arange(n), len(classes))
    parts: list[list[np.ndarray]] = [[] for _ in range(n)]
    for idx, group in zip(classes, groups, strict=True):
        cut = math.floor(shared_fraction * len(idx))
        for worker, chunk in enumerate(np.array_split(idx[:cut], n)):
            parts[worker].append(chunk)
        for worker, chunk in zip(group, np.array_split(idx[cut:], len(group)), strict=True):
            parts[worker].append(chunk)
    return [np.concatenate(p) for p in parts]


def _fed_cdp_replicated_shards(
    y: np.ndarray,
    n: int,
    rng: np.random.Generator,
    *,
    shard_size: int,
    shards_per_client: int,
) -> list[np.ndarray]:
    """Wei et al.'s (Fed-αCDP) split as their code builds it: the label-sorted examples
    (shuffled within each class) are cut into ``⌊N/shard_size⌋`` consecutive shards (the
    remainder is dropped); a replica deals the shards, in a fresh random order, to clients,
    ``shards_per_client`` each (leftover shards unused); replicas are added until
    ``num_clients`` clients are served, so every client holds exactly
    ``shards_per_client·shard_size`` examples. MNIST's 50,000 training images with
    ``N = 1000`` clients give 200 shards, 100 clients per replica, 10 replicas."""
    if shard_size < 1 or shards_per_client < 1:
        raise PartitionError("shard_size and shards_per_client must be >= 1")
    num_shards = len(y) // shard_size
    per_replica = num_shards // shards_per_client
    if per_replica < 1:
        raise PartitionError(
            f"{len(y)} examples make {num_shards} shards of shard_size={shard_size}, fewer "
            f"than shards_per_client={shards_per_client}; lower shard_size"
        )
    order = np.concatenate(_classes(y, rng))
    shards = order[: num_shards * shard_size].reshape(num_shards, shard_size)
    out: list[np.ndarray] = []
    while len(out) < n:
        deal = rng.permutation(num_shards)[: per_replica * shards_per_client]
        for row in deal.reshape(per_replica, shards_per_client)[: n - len(out)]:
            out.append(shards[row].reshape(-1))
    return out


_SCHEMES: dict[str, tuple[Callable[..., list[np.ndarray]], dict[str, Any]]] = {
    "iid": (_iid, {}),
    "dirichlet": (_dirichlet, {"alpha": 0.5, "min_size": 1, "max_tries": 1000}),
    "shards": (_shards, {"labels_per_client": 2}),
    "dp_filter_weighted": (_dp_filter_weighted, {"iid": False}),
    "dp_rsa_shared_half": (_dp_rsa_shared_half, {"shared_fraction": 0.5}),
    "fed_cdp_replicated_shards": (
        _fed_cdp_replicated_shards,
        {"shard_size": 250, "shards_per_client": 2},
    ),
}
