"""Atoms: fixed groups of clients that every cluster of every round is made of.

Why. Within one round the plan audit and the release checks keep every released set of
sums safe. Across rounds they cannot: updates change little from round to round (and a
server can move the model by one ulp to make them nearly equal), so the sums of two rounds
under two clusterings solve, to within the change, for individual updates (So et al.,
"Securing Secure Aggregation: Mitigating Multi-Round Privacy Leakage in Federated
Learning", AAAI 2023). Model digests cannot tell a perturbed model from a trained one;
structure can.

The property. Partition a server's clients once into *atoms*, each of at least
:func:`atom_floor` clients, and make every released sum of every round a sum of whole
atoms. Model the updates as constant across rounds (the worst case). Then everything the
server holds, over any number of rounds, models, runs and restarts, is a linear function
of the atom sums ``s_A = Σ_{i ∈ A} x_i``: each released row is an indicator ``1_L`` with
``L`` a union of atoms, so every row lies in ``span{1_A}``. A sum over a set S of clients
is determined only if ``1_S`` lies in that span, i.e. S is a union of atoms, so
``|S| >= min(|A|)``. With a set C of colluders whose inputs the server knows, an honest
input x_i follows only if ``e_i ∈ span{1_A} + span{e_j : j ∈ C}``, i.e. i's atom minus C
is {i}; a sum of honest inputs S follows only if S is a union of (atom minus C) sets. So
atoms whose honest part has at least ``min_sum_size`` members give the property for every
collusion the threshold resists (:func:`atom_floor`).

Who enforces it. Each client, on its own view (:class:`~sharefl.protocol.client_round.
ClientRound`, :class:`~sharefl.protocol.memory.ClientMemory`):

- A1 *its atom is fixed*: the roster of the first atom a client joins under a server
  identity is kept in its memory; a plan that lists another roster for it, or no atoms,
  is refused.
- A2 *large enough*: its atom has at least :func:`atom_floor` members.
- A3 *clusters are unions of atoms*: every cluster of the plan is a union of the plan's
  atoms (the plan digest binds the atoms: members of one cluster see one atom list).
- A4 *releases are unions of atoms*: it answers an unmask request only if every sum the
  answer reveals (:func:`~sharefl.protocol.audit.revealed_sums`) is a union of the plan's
  atoms — its own atom wholly among the survivors, or wholly dropped.

A4 is what makes other atoms safe too: a sum that splits an atom W needs the self-mask
seeds of W's surviving members, which only holders told that those members survived
reveal; every honest holder that answers checks that the whole of W is on the same side,
and by the threshold (t > (holders + c)/2) the server cannot assemble t shares from two
groups told different stories (docs/security.md).

Drop-outs. An atom with a member missing leaves the round whole (:func:`whole_atoms`):
its survivors are listed as dropped, so holders reveal shares of their mask keys — never
of their self-mask seeds — and their masked inputs stay hidden by PRG(b_u); the sum covers
the complete atoms. One drop-out costs its atom, not the cluster.

Membership for good. An atom is never re-formed: a client that leaves for good retires
its atom (it is never complete again: :func:`complete_atoms`), whose other members then
take no further part under that server identity. Re-forming would leak by differencing:
with ``s_A`` known from earlier rounds, a new atom ``A \\ {i} ∪ B`` and the known ``s_B``
give ``x_i``. Two whole atoms may merge (a coarser partition reveals less); new clients
form new atoms of their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from sharefl.protocol.clustering import Clustering
from sharefl.protocol.errors import ConfigurationError

Atoms = Clustering
"""A partition of client ids into atoms (the same type as a clustering's partition)."""


def atom_floor(min_sum_size: int, colluders: int | None, signed: bool) -> int:
    """The fewest members an atom may have: the smallest ``a`` whose honest part, with the
    colluders a client of that atom resists removed, still has ``min_sum_size`` members:
    ``a − c >= min_sum_size`` for an explicit ``colluders`` c; otherwise c is the default
    share of colluders of a group of ``a`` (:func:`~sharefl.protocol.client.
    default_colluders`: 0 unsigned, ⌈a/3⌉ − 1 signed). Raises ConfigurationError for
    ``min_sum_size < 2`` or negative colluders."""
    from sharefl.protocol.client import default_colluders  # client imports plan -> atoms

    if min_sum_size < 2 or (colluders is not None and colluders < 0):
        raise ConfigurationError(
            f"atoms need min_sum_size >= 2 and colluders >= 0; got {min_sum_size}, {colluders}"
        )
    size = min_sum_size
    while size - (colluders if colluders is not None else default_colluders(size, signed)) < (
        min_sum_size
    ):
        size += 1
    return size


def is_union_of_atoms(members: Iterable[int], atoms: Atoms) -> bool:
    """Whether ``members`` is a union of whole atoms (every member in ``atoms``)."""
    return not split_atoms(members, atoms)


def split_atoms(members: Iterable[int], atoms: Atoms) -> list[tuple[int, ...]]:
    """The atoms that ``members`` cuts (contains some but not all of), sorted; members not
    in ``atoms`` count as atoms of their own that are cut."""
    group = set(members)
    cut: set[tuple[int, ...]] = set()
    for i in group:
        if i not in atoms:
            cut.add((i,))
        elif not set(atoms.cluster_of(i)) <= group:
            cut.add(atoms.cluster_of(i))
    return sorted(cut)


def whole_atoms(members: Iterable[int], atoms: Atoms | None) -> tuple[int, ...]:
    """``members`` without every atom that is not wholly among them (sorted): the clients
    whose inputs a sum may cover when an atom loses a member. ``atoms=None``: unchanged."""
    group = set(members)
    if atoms is None:
        return tuple(sorted(group))
    return tuple(sorted(i for atom in complete_atoms(atoms, group) for i in atom))


def check_plan_atoms(clusterings: Sequence[Clustering], atoms: Atoms) -> None:
    """A3 on a whole plan: ``atoms`` partition exactly the participants and every cluster
    of every clustering is a union of atoms. Raises ConfigurationError naming the first
    cluster that cuts an atom."""
    if set(atoms.members) != set(clusterings[0].members):
        raise ConfigurationError("the atoms must partition exactly the round's participants")
    for r, clustering in enumerate(clusterings):
        for k, cluster in enumerate(clustering.clusters):
            cut = split_atoms(cluster, atoms)
            if cut:
                raise ConfigurationError(
                    f"cluster {k} of reclustering {r} cuts atoms {cut[:3]}: every cluster "
                    "must be a union of whole atoms"
                )


def form_atoms(
    clients: Sequence[int], size: int, rng: np.random.Generator
) -> tuple[Atoms, tuple[int, ...]]:
    """Partition ``clients`` at random into atoms of ``size`` to ``2·size − 1`` members.

    Returns the atoms and the clients left over (fewer than ``size`` of them: too few for
    an atom; they wait for more clients). Raises ConfigurationError for ``size < 2``."""
    if size < 2:
        raise ConfigurationError(f"an atom needs at least 2 clients, got size {size}")
    ids = sorted(int(i) for i in clients)
    if len(ids) < size:
        return Clustering(()), tuple(ids)
    order = [ids[i] for i in rng.permutation(len(ids))]
    count = len(order) // size
    groups = [order[i * size : (i + 1) * size] for i in range(count)]
    for j, client in enumerate(order[count * size :]):
        groups[j % count].append(client)
    return Clustering(tuple(tuple(g) for g in groups)), ()


def group_atoms(
    atoms: Sequence[Sequence[int]], cluster_size: int, rng: np.random.Generator
) -> Clustering:
    """One clustering whose clusters are unions of whole ``atoms``: ``max(1, round(n /
    cluster_size))`` clusters (n: the clients of the atoms), atoms shuffled and each given
    to the cluster with the fewest members so far, so cluster sizes differ by less than the
    largest atom. Raises ConfigurationError without atoms."""
    if not atoms:
        raise ConfigurationError("no atoms to cluster")
    n = sum(len(a) for a in atoms)
    count = min(len(atoms), max(1, round(n / max(1, cluster_size))))
    clusters: list[list[int]] = [[] for _ in range(count)]
    for index in rng.permutation(len(atoms)):
        smallest = min(range(count), key=lambda k: (len(clusters[k]), k))
        clusters[smallest].extend(atoms[index])
    return Clustering(tuple(tuple(c) for c in clusters))


def chunk_atoms(clients: Iterable[int], size: int) -> Atoms:
    """The atoms of a deployment: the sorted client ids cut into consecutive atoms of
    ``size``, the last taking the remainder (``size`` to ``2·size − 1`` members). A
    function of the ids alone, so every run and restart of a server over the same clients
    forms the same atoms, and clients added with larger ids (``sharefl keygen`` numbers
    them 0, 1, ...) form new atoms without re-forming earlier ones — except the last,
    whose members then refuse (A1) until the new clients make an atom of their own.
    Atoms need no secrecy: the guarantee is their structure. Fewer than ``size`` clients:
    no atom. Raises ConfigurationError for ``size < 2``."""
    if size < 2:
        raise ConfigurationError(f"an atom needs at least 2 clients, got size {size}")
    ids = sorted({int(i) for i in clients})
    count = len(ids) // size
    if count == 0:
        return Clustering(())
    groups = [ids[k * size : (k + 1) * size] for k in range(count)]
    groups[-1] = groups[-1] + ids[count * size :]
    return Clustering(tuple(tuple(g) for g in groups))


def complete_atoms(atoms: Atoms, present: Iterable[int]) -> list[tuple[int, ...]]:
    """The atoms all of whose members are ``present`` (the only ones a round may plan: an
    atom with a member gone, for a round or for good, sits out whole)."""
    here = set(present)
    return [a for a in atoms.clusters if set(a) <= here]
