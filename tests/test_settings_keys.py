"""Every key of the one secure aggregation settings type reaches every entry point, or is
refused there with an error naming it.

The keys are enumerated from :class:`SecureAggregationSettings`'s dataclass fields: a key
added later without a case in :data:`VALUES` fails :func:`test_every_key_has_a_case`, and
one that an entry point does not route fails that entry point's test (the settings the
protocol's :class:`RoundCoordinator` receives are compared, whole, with the parsed ones:
the oracle is the settings type built from the same single key, independently of the
loop). Entry points: the federated/SHARE loop, the DP-RSA loop, the decentralized loop
(no secure aggregation: every key refused), ``sharefl launch`` of a simulation file, the
deployment file of ``sharefl serve``, the Flower workflow and strategy, and ``secure_sum``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

import sharefl.deploy.run as deploy_run
import sharefl.deploy.server as deploy_server
import sharefl.protocol.driver as driver
import sharefl.rounds.model_plans as model_plans
from sharefl.crypto.signatures import IdentityKey
from sharefl.deploy.config import load_config
from sharefl.exit_status import ExitStatus
from sharefl.protocol import secure_sum
from sharefl.protocol.audit import audit
from sharefl.protocol.coordinator import RoundCoordinator, plan_round, round_colluders
from sharefl.protocol.errors import ConfigurationError
from sharefl.protocol.keys import ClientKeys
from sharefl.protocol.settings import (
    DEFAULTS,
    SETTINGS_KEYS,
    Planner,
    SecureAggregationSettings,
    SettingsError,
    settings_from,
)
from sharefl.robust import HierarchicalAggregator
from sharefl.robust.coordinate import Mean
from sharefl.robust.hierarchical import ClusterScale
from sharefl.simulation_bridge import deployment_for, deployment_section
from sharefl.simulator.config import RunConfig, SimulationConfigError, expand
from sharefl.simulator.dp_rsa.loop import secure_sign_sum
from sharefl.simulator.federated import clustering_schedule
from sharefl.simulator.federated.share import ShareAggregation

CLIENTS = 12
DIM = 4

VALUES: dict[str, Any] = {
    "cluster_size": 4,
    "reclusterings": 2,
    "threshold": 3,
    "raise_threshold_to_floor": False,
    "bits": 64,
    "clip": 2.0,
    "signed": True,
    "neighbour_degree": 2,
    "min_sum_size": 2,
    "planner": "random",
    "allow_leakage": True,
    "colluders": 0,
    "atoms": False,
    "atom_size": 4,
    "key_setup": "once",
}
"""Per key, a value other than its default that every entry point can run with
``CLIENTS`` clients in clusters of the default size (as a file writes it)."""

KEYS = [f.name for f in dataclasses.fields(SecureAggregationSettings)]

REFUSED: dict[tuple[str, str], str] = {
    ("launch", "signed"): "secure_aggregation.signed",
}
"""(entry point, key) → what the refusal names, where the entry point cannot honour the
key at :data:`VALUES`' value (the decentralized loop refuses every key, as it reads none)."""

DIRECTORY = {cid: IdentityKey.generate().public for cid in range(CLIENTS)}


def expected(key: str, **changes: Any) -> SecureAggregationSettings:
    """The oracle: the settings type built from this one key (and ``changes``)."""
    return dataclasses.replace(SecureAggregationSettings(**{key: VALUES[key]}), **changes)


@pytest.fixture
def captured(monkeypatch):
    """The settings every :class:`RoundCoordinator` of the protocol is built with."""
    seen: list[SecureAggregationSettings] = []

    class Recording(RoundCoordinator):
        def __init__(self, settings, **kwargs):
            seen.append(settings)
            super().__init__(settings, **kwargs)

    monkeypatch.setattr(driver, "RoundCoordinator", Recording)
    monkeypatch.setattr(model_plans, "RoundCoordinator", Recording)  # gRPC server, Flower
    monkeypatch.setattr(deploy_server, "RoundCoordinator", Recording)
    return seen


def run_config(key: str | None, value: Any = None, **tables: Any) -> RunConfig:
    """One simulation run parsed from its tables, as a file is (``expand``)."""
    sa = {} if key is None else {key: value}
    data = {"clients": {"honest": CLIENTS}, "secure_aggregation": sa, **tables}
    (run,) = expand(data)
    return run


def test_every_key_has_a_case():
    assert set(VALUES) == set(SETTINGS_KEYS) == set(KEYS)
    for key, value in VALUES.items():
        assert getattr(SecureAggregationSettings(**{key: value}), key) != getattr(DEFAULTS, key)


# --- simulation loops --------------------------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
def test_share_loop(key, captured):
    run = run_config(key, VALUES[key])
    assert run.secure_aggregation.as_settings() == expected(key)
    share = ShareAggregation.build(
        run,
        rule=HierarchicalAggregator(rule=Mean(), scale=ClusterScale.MEAN),
        zeno=None,
        client_sizes=[1] * CLIENTS,
        noise_split=None,
    )
    uploads = torch.linspace(-0.5, 0.5, CLIENTS * DIM).reshape(CLIENTS, DIM)
    aggregate = share.aggregate(
        uploads,
        list(range(CLIENTS)),
        byzantine=set(),
        w=torch.zeros(DIM),
        rng=np.random.default_rng(0),
        round=0,
    )
    assert captured[-1] == expected(key)
    # the mean of the cluster means of equal clusters is the plain mean (within rounding)
    assert torch.allclose(aggregate.double(), uploads.double().mean(0), atol=1e-6)


def _share_rounds(run: RunConfig, rounds: int = 2) -> ShareAggregation:
    """SHARE's aggregation of ``run`` (a mean over cluster means), run for ``rounds``
    rounds of the same clients."""
    share = ShareAggregation.build(
        run,
        rule=HierarchicalAggregator(rule=Mean(), scale=ClusterScale.MEAN),
        zeno=None,
        client_sizes=[1] * CLIENTS,
        noise_split=None,
    )
    uploads = torch.linspace(-0.5, 0.5, CLIENTS * DIM).reshape(CLIENTS, DIM)
    rng = np.random.default_rng(0)
    for r in range(rounds):
        share.aggregate(
            uploads, list(range(CLIENTS)), byzantine=set(), w=torch.zeros(DIM), rng=rng, round=r
        )
    return share


@pytest.mark.parametrize("key", KEYS)
def test_share_loop_with_a_fixed_plan(key, captured, monkeypatch):
    """``clustering = "fixed_plan"`` draws round 1's plan itself: the planner gets every
    key (the protocol's ``plan_round``, with the settings as parsed), and every round's
    coordinator the same settings and clusterings."""
    planned: list[SecureAggregationSettings] = []

    def recording(round_index, participants, settings, rng, *args, **kwargs):
        planned.append(settings)
        return plan_round(round_index, participants, settings, rng, *args, **kwargs)

    monkeypatch.setattr(clustering_schedule, "plan_round", recording)
    run = run_config(None, secure_aggregation={key: VALUES[key], "clustering": "fixed_plan"})
    share = _share_rounds(run)
    assert planned == [expected(key)]  # drawn once, from every key
    assert captured[-2:] == [expected(key), expected(key)]
    assert share.schedule.fixed is not None
    assert list(share.last_clusterings) == share.schedule.fixed


@pytest.mark.parametrize(
    "table",
    [
        {"colluders": 1},
        # signed mode's default: ⌈4/3⌉ − 1 = 1 colluder per cluster of 4
        {"signed": True, "cluster_size": 4},
    ],
)
def test_a_fixed_plan_resists_the_colluders_of_its_audits(table):
    """The oracle is the protocol's audit against the round's colluders: a safe plan drawn
    for 0 colluders (what the schedule drew before it passed ``colluders`` on) leaks
    against 1 at these sizes, so every round of the run would be refused."""
    run = run_config(
        None, secure_aggregation={**table, "reclusterings": 2, "clustering": "fixed_plan"}
    )
    share = _share_rounds(run)
    plan = share.schedule.fixed
    assert plan is not None and len(plan) == 2
    report = audit(
        plan,
        client_ids=list(range(CLIENTS)),
        min_sum_size=run.secure_aggregation.min_sum_size,
        colluders=round_colluders(plan, run.secure_aggregation),
    )
    assert round_colluders(plan, run.secure_aggregation) == 1
    assert not report.leaks and report.complete
    assert share.audits.rounds == 2 and share.audits.leaking_rounds == 0


@pytest.mark.parametrize("key", KEYS)
def test_dp_rsa_loop(key, captured):
    run = run_config(key, VALUES[key], algorithm={"name": "dp_rsa"}, dp_rsa={"method": "rsa"})
    messages = torch.where(torch.arange(CLIENTS * DIM).reshape(CLIENTS, DIM) % 3 == 0, -1.0, 1.0)
    total = secure_sign_sum(messages, run.secure_aggregation, seed=1, round=0)
    assert captured[-1] == expected(key, clip=None)  # sign messages are ring elements
    assert torch.equal(total, messages.sum(0))


@pytest.mark.parametrize("key", KEYS)
def test_decentralized_loop_refuses_every_key(key):
    refusal = f"secure_aggregation.{key} = .* is not read by the decentralized loop"
    with pytest.raises(SimulationConfigError, match=refusal):
        run_config(key, VALUES[key], algorithm={"name": "decentralized"})
    run_config(None, algorithm={"name": "decentralized"})  # the table left out: fine


@pytest.mark.parametrize(
    ("algorithm", "table", "match"),
    [
        ("federated", {"planner": "isolate"}, r'secure_aggregation\.planner = "isolate"'),
        ("dp_rsa", {"planner": "isolate"}, r'secure_aggregation\.planner = "isolate"'),
        ("dp_rsa", {"clustering": "fixed"}, r'secure_aggregation\.clustering = "fixed"'),
        ("federated", {"signed": True, "enabled": False}, r"secure_aggregation\.signed"),
        ("federated", {"planner": "nearest"}, r"secure_aggregation\.planner must be one of"),
        ("federated", {"threshold": -1}, r"secure_aggregation\.threshold must be >= 1"),
    ],
)
def test_simulation_refusals_name_the_key(algorithm, table, match):
    method = {"dp_rsa": {"method": "rsa"}} if algorithm == "dp_rsa" else {}
    with pytest.raises(SimulationConfigError, match=match):
        expand(
            {
                "clients": {"honest": CLIENTS},
                "secure_aggregation": table,
                "algorithm": {"name": algorithm},
                **method,
            }
        )


def test_the_file_spellings_of_none_parse_to_the_defaults():
    run = run_config(None, secure_aggregation={"threshold": 0, "neighbour_degree": 0})
    assert run.secure_aggregation.as_settings() == DEFAULTS


# --- launch and serve --------------------------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
def test_launch(key):
    run = run_config(key, VALUES[key])
    refusal = REFUSED.get(("launch", key))
    if refusal is not None:
        with pytest.raises(SimulationConfigError, match=refusal):
            deployment_section(run)
        return
    config = deployment_for(run, SimpleNamespace(ring_encoder=None, dim=DIM))
    assert deploy_run.round_settings(config) == expected(key)


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ({"signed": True}, r"secure_aggregation\.signed"),
        ({"enabled": False}, r"secure_aggregation\.enabled = false"),
        ({"clustering": "fixed_plan"}, r'secure_aggregation\.clustering = "fixed_plan"'),
        ({"cluster_size": 1}, r"secure_aggregation\.cluster_size >= 2"),
    ],
)
def test_launch_refuses_before_starting_a_process(tmp_path, capsys, table, match):
    from sharefl.cli import main

    lines = [
        f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}" for k, v in table.items()
    ]
    path = tmp_path / "run.toml"
    path.write_text(
        f"[clients]\nhonest = {CLIENTS}\n[secure_aggregation]\n" + "\n".join(lines) + "\n"
    )
    assert main(["launch", str(path)]) == ExitStatus.CONFIG
    assert __import__("re").search(match, capsys.readouterr().err)


def deployment_file(folder: Path, key: str | None, value: Any = None) -> Path:
    def toml(v: Any) -> str:
        return str(v).lower() if isinstance(v, bool) else repr(v).replace("'", '"')

    lines = [
        "[server]",
        f"clients = {CLIENTS}",
        "[model]",
        f"dim = {DIM}",
        "[secure_aggregation]",
        *([f"{key} = {toml(value)}"] if key is not None else []),
    ]
    if key == "signed":
        lines += ["[tls]", 'directory = "directory.json"']
    path = folder / "deploy.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("key", KEYS)
def test_serve(key, tmp_path, captured):
    refusal = REFUSED.get(("serve", key))
    if refusal is not None:
        with pytest.raises(ConfigurationError, match=refusal):
            load_config(deployment_file(tmp_path, key, VALUES[key]))
        return
    config = load_config(deployment_file(tmp_path, key, VALUES[key]))
    assert config.secure_aggregation.as_settings() == expected(key)
    assert deploy_run.round_settings(config) == expected(key)
    deploy_server.validate_deployment(config, DIRECTORY if key == "signed" else None)
    assert captured[-1] == expected(key)


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ({"planner": "isolate"}, r'secure_aggregation\.planner = "isolate"'),
        ({"cluster_size": 1}, r"secure_aggregation\.cluster_size must be >= 2"),
        ({"bits": 16}, r"secure_aggregation\.bits must be 32 or 64"),
        ({"colluders": -1}, r"secure_aggregation\.colluders must be >= 0"),
    ],
)
def test_serve_refusals_name_the_key(tmp_path, table, match):
    ((key, value),) = table.items()
    with pytest.raises(ConfigurationError, match=match):
        load_config(deployment_file(tmp_path, key, value))


# --- Flower --------------------------------------------------------------------------------


def _flower_round(workflow) -> None:
    from flwr.app import RecordDict

    grid = SimpleNamespace(send_and_receive=lambda messages, timeout: [])
    contents = {nid: RecordDict() for nid in range(1, CLIENTS + 1)}
    workflow.secure_round(grid, 1, contents, [np.zeros(DIM, dtype=np.float32)])


@pytest.mark.parametrize("key", KEYS)
def test_flower_workflow(key, monkeypatch):
    pytest.importorskip("flwr")
    import sharefl.integrations.flower.workflow as flower

    seen: list[SecureAggregationSettings] = []

    def recording(settings, **kwargs):
        seen.append(settings)
        raise ConfigurationError("recorded")  # the round then releases nothing

    monkeypatch.setattr(model_plans, "RoundCoordinator", recording)  # the workflow's rounds
    refusal = REFUSED.get(("flower", key))
    if refusal is not None:
        with pytest.raises(SettingsError, match=refusal):
            flower.ShareflWorkflow(**{key: VALUES[key]})
        return
    # signed rounds start with a hello stage over the grid: every node proves id node − 1
    monkeypatch.setattr(
        flower.ShareflWorkflow,
        "_hello",
        lambda self, grid, round, nodes, failures: flower.Route({n - 1: n for n in nodes}),
    )
    if key == "key_setup":  # the key stage's adverts, as the clients would send them

        def key_stage(self, grid, round, route, fitins, failures):
            for cid in fitins:
                self._key_adverts[cid] = ClientKeys.generate(cid).advert()

        monkeypatch.setattr(flower.ShareflWorkflow, "_key_stage", key_stage)
    directory = {"directory": DIRECTORY} if key == "signed" else {}
    by_keyword = flower.ShareflWorkflow(**{key: VALUES[key]}, max_empty_rounds=None, **directory)
    by_object = flower.ShareflWorkflow(expected(key), max_empty_rounds=None, **directory)
    strategy = flower.ShareflStrategy(None, **{key: VALUES[key]}, **directory)
    for workflow in (by_keyword, by_object, strategy.secure):
        assert workflow.settings == expected(key)
    _flower_round(by_keyword)
    _flower_round(by_object)
    assert seen == [expected(key), expected(key)]


def test_flower_refusals_name_the_key():
    pytest.importorskip("flwr")
    from sharefl.integrations.flower import ShareflWorkflow

    with pytest.raises(SettingsError, match="planner") as err:
        ShareflWorkflow(planner=Planner.ISOLATE)
    assert err.value.key == "planner"
    with pytest.raises(SettingsError, match="cluster_size"):
        ShareflWorkflow(cluster_size=1)
    with pytest.raises(ConfigurationError, match="not both"):
        ShareflWorkflow(SecureAggregationSettings(), cluster_size=4)
    with pytest.raises(ConfigurationError, match="unknown secure aggregation setting"):
        ShareflWorkflow(cluster_sise=4)


# --- secure_sum ----------------------------------------------------------------------------


@pytest.mark.parametrize("key", KEYS)
def test_secure_sum(key, captured):
    inputs = {cid: np.full(DIM, 0.25 * (cid % 4) - 0.5) for cid in range(CLIENTS)}
    base = {"clip": 1.0}  # the keyword form takes no bound for float inputs unless given
    by_keyword = secure_sum(inputs, seed=3, **{**base, key: VALUES[key]})
    oracle = SecureAggregationSettings(**{**base, key: VALUES[key]})
    by_object = secure_sum(inputs, oracle, seed=3)
    assert captured == [oracle, oracle]
    for result in (by_keyword, by_object):
        total = sum(c.float_sum for c in result.reclusterings[0].clusters)
        assert np.allclose(total, sum(inputs.values()), atol=1e-6)
    with pytest.raises(ConfigurationError, match="not both"):
        secure_sum(inputs, oracle, **{key: VALUES[key]})


def test_settings_from_takes_one_form():
    assert settings_from(None, {"cluster_size": 5}) == SecureAggregationSettings(cluster_size=5)
    assert settings_from(SecureAggregationSettings(cluster_size=5)).cluster_size == 5
    with pytest.raises(SettingsError, match="must be int") as err:
        settings_from(None, {"cluster_size": True})
    assert err.value.key == "cluster_size"
