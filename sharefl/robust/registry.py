"""The rules by name: the vocabulary of configuration files (a simulation's or a
deployment's ``[aggregator]``), looked up here by every caller, the way ByzFL finds a rule by
its name.

:data:`RULES` maps each name to its aggregator over the rows of an ``[n, d]`` matrix
(individual uploads or cluster means); :func:`build_rule` builds one from its options and
optional pre-aggregators (``"nnm"``, ``"bucketing"``). ``f`` in the options counts
corrupted rows: Byzantine clients without secure aggregation, corrupted *clusters* with it
(SHARE's Lemma 2).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from sharefl.robust.base import AggregationError, Aggregator, PreAggregator
from sharefl.robust.clipping import CenteredClipping
from sharefl.robust.coordinate import MeaMed, Mean, Median, TrimmedMean
from sharefl.robust.distance import MDA, Krum, MultiKrum
from sharefl.robust.geometric import GeometricMedian
from sharefl.robust.preagg import NNM, Bucketing, Pipeline

RULES: dict[str, type[Aggregator]] = {
    "mean": Mean,
    "median": Median,
    "trimmed_mean": TrimmedMean,
    "meamed": MeaMed,
    "krum": Krum,
    "multi_krum": MultiKrum,
    "mda": MDA,
    "geometric_median": GeometricMedian,
    "centered_clipping": CenteredClipping,
}
"""Rules over the rows of an ``[n, d]`` matrix, by configuration name."""

PRE_AGGREGATORS = ("nnm", "bucketing")


def build_rule(
    name: str,
    options: Mapping[str, Any] | None = None,
    pre: Sequence[str] = (),
    generator: torch.Generator | None = None,
) -> Aggregator | Pipeline:
    """The rule ``name`` with ``options``, behind the pre-aggregators ``pre`` in order
    (``"nnm"`` with the rule's ``f``; ``"bucketing"`` drawing from ``generator``, by
    default an unseeded one). A :class:`Pipeline` when ``pre`` is not empty.

    Raises:
        AggregationError: an unknown name or pre-aggregator, or options the rule refuses
            (the message names the key, ``aggregator.name`` / ``options`` / ``pre``).
    """
    options = dict(options or {})
    if name not in RULES:
        raise AggregationError(f"aggregator.name must be one of {sorted(RULES)}, got {name!r}")
    try:
        rule = RULES[name](**options)
    except (TypeError, ValueError) as exc:
        raise AggregationError(f"aggregator {name!r} with options {options}: {exc}") from exc
    if not pre:
        return rule
    steps: list[PreAggregator] = []
    for step in pre:
        if step == "nnm":
            steps.append(NNM(f=int(options.get("f", 0))))
        elif step == "bucketing":
            steps.append(Bucketing(generator=generator or torch.Generator()))
        else:
            raise AggregationError(
                f"aggregator.pre entries must be one of {list(PRE_AGGREGATORS)}, not {step!r}"
            )
    return Pipeline(aggregator=rule, pre=tuple(steps))
