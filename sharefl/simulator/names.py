"""One alias table: the user-facing names of models and partitions, and the old paper
codenames (seed000 … seed004, see :mod:`sharefl.papers`) they replace.

A configuration may use either; :func:`model_name` and :func:`partition_name` map an alias
to its current name (any other name passes through unchanged), and the model registry and
the partitioner call them, so an alias builds the very same object.
"""

from __future__ import annotations

MODEL_ALIASES: dict[str, str] = {
    "seed000_cnn": "dp_filter_cnn",
    "seed000_mlp": "dp_filter_mlp",
    "seed000_resnet": "dp_filter_resnet",
    "seed002_mlp": "dp_rsa_mlp",
    "seed002_cnn": "dp_rsa_cnn",
    "seed003_cnn": "fed_cdp_cnn",
    "seed004_softmax": "decentralized_softmax",
}
"""Old model codename → model name (:data:`sharefl.simulator.models.MODELS`)."""

PARTITION_ALIASES: dict[str, str] = {
    "seed000": "dp_filter_weighted",
    "seed002": "dp_rsa_shared_half",
    "seed003": "fed_cdp_replicated_shards",
}
"""Old partition codename → partition scheme (:data:`sharefl.simulator.partition.SCHEMES`)."""


def model_name(name: str) -> str:
    """The current name of model ``name`` (an alias or already current)."""
    return MODEL_ALIASES.get(name, name)


def partition_name(name: str) -> str:
    """The current name of partition scheme ``name`` (an alias or already current)."""
    return PARTITION_ALIASES.get(name, name)
