"""Which keys of a simulation file each loop reads: a key the selected loop does not read is
refused (``[algorithm] name`` selects the loop), even when it is written at its default, so a
file never looks as if it set something the run ignores.

:data:`READS` is the one list: loop → table → the keys of it the loop reads (:data:`EVERY`:
all of them; a table a loop leaves out it does not read at all). Top-level keys (``name``,
``seed``, ``rounds``, ...) and ``[paper]`` are every loop's. A key "read" is one the loop,
its setup or its checks act on (the DP-RSA and decentralized loops add their own noise and
read no ``[privacy]``). :func:`unread_keys` is the check;
:func:`sharefl.simulator.config.expand` calls it on every run of a file as written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Final

from sharefl.protocol.settings import SecureAggregationSettings

EVERY: Final = "*"
"""Every key of the table."""

_DATA = frozenset(
    {
        "dataset",
        "root",
        "download",
        "options",
        "partition_seed",
        "train_examples",
        "test_examples",
        "input_mean",
        "input_std",
    }
)
"""The ``[data]`` keys every loop reads (loading the data set, its seed of the split)."""

_ANY_LOOP: dict[str, frozenset[str] | str] = {
    "data": _DATA,
    "model": EVERY,
    "clients": frozenset({"honest", "byzantine"}),
    "training": frozenset({"batch_size"}),
    "attack": frozenset({"name", "options"}),
    "algorithm": frozenset({"name"}),
}
"""What every loop reads."""

READS: dict[str, dict[str, frozenset[str] | str]] = {
    "federated": {
        **dict.fromkeys(
            (
                "data",
                "model",
                "clients",
                "training",
                "privacy",
                "attack",
                "secure_aggregation",
                "aggregator",
                "server",
                "deployment",
            ),
            EVERY,
        ),
        "algorithm": frozenset({"name"}),
    },
    "dp_rsa": {
        **_ANY_LOOP,
        "data": _DATA | {"partition", "partition_options"},
        # the sign sums' protocol: every key but SHARE's schedule (``clustering``)
        "secure_aggregation": frozenset(f.name for f in fields(SecureAggregationSettings))
        | {"enabled"},
        "dp_rsa": EVERY,
    },
    "decentralized": {**_ANY_LOOP, "decentralized": EVERY},
}
"""Loop → table → the keys of it the loop reads."""

INSTEAD: dict[tuple[str, str], str] = {
    ("dp_rsa", "privacy"): "the dp_rsa loop adds its own noise: dp_rsa.method and dp_rsa.epsilon",
    ("decentralized", "privacy"): "the decentralized loop adds its own noise: decentralized.noise",
    ("decentralized", "secure_aggregation"): "the decentralized loop has no secure "
    "aggregation: agents exchange models with their neighbours",
    ("decentralized", "aggregator"): "the decentralized loop's rule is decentralized.rule",
    ("dp_rsa", "aggregator"): "the dp_rsa loop's master steps with the sum of signs "
    "(dp_rsa.method)",
}
"""(loop, table) → what the loop does instead of reading the table, for the refusal."""

_TOP_LEVEL = frozenset({"name", "seed", "rounds", "eval_every", "label", "device", "paper"})


def unread_keys(run: Mapping[str, Any], loop: str) -> list[str]:
    """The dotted keys of ``run`` (one run's tables as written) that ``loop`` does not
    read, in file order; an unknown ``loop`` has none (its name is refused elsewhere)."""
    reads = READS.get(loop)
    if reads is None:
        return []
    unread = []
    for table, value in run.items():
        if table in _TOP_LEVEL or not isinstance(value, Mapping):
            continue
        keys = reads.get(table, frozenset())
        if keys == EVERY:
            continue
        unread += [f"{table}.{key}" for key in value if key not in keys]
    return unread


def readers(dotted: str) -> list[str]:
    """The loops that read ``dotted`` (``table.key``)."""
    table, _, key = dotted.partition(".")
    found = []
    for loop, reads in READS.items():
        keys = reads.get(table, frozenset())
        if keys == EVERY or key in keys:
            found.append(loop)
    return found
