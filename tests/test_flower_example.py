"""The example Flower app (examples/flower_share): its ServerApp logic and its ClientApp, as
imported, run for real with ``run_simulation`` (10 clients, one Byzantine, Median over the
cluster means); and its pyproject's run config agrees with the app's defaults."""

from __future__ import annotations

import sys
import tomllib
from dataclasses import asdict
from pathlib import Path

import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flower_share"
sys.path.insert(0, str(EXAMPLE))  # before run_simulation: Ray's workers import it too

from conftest import ray_backend  # noqa: E402
from flwr.app import Context  # noqa: E402
from flwr.server import ServerApp  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_pyproject_names_the_apps_and_the_defaults():
    from flower_share import client_app, server_app
    from flower_share.task import AppConfig

    app = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert app["components"] == {
        "serverapp": "flower_share.server_app:app",
        "clientapp": "flower_share.client_app:app",
    }
    assert isinstance(server_app.app, ServerApp)
    assert client_app.app is not None
    assert AppConfig.from_run_config(app["config"]) == AppConfig()
    assert {k.replace("_", "-") for k in asdict(AppConfig())} == set(app["config"])
    with pytest.raises(ValueError, match="unknown run config"):
        AppConfig.from_run_config({"cluster_size": 3})


def test_the_app_learns_with_a_byzantine_client():
    from flower_share import client_app, server_app

    histories = []
    server = ServerApp()

    @server.main()
    def main(grid, context: Context) -> None:
        histories.append(server_app.run(grid, context))

    run_simulation(server, client_app.app, num_supernodes=10, backend_config=ray_backend())
    (history,) = histories
    accuracy = dict(history.metrics_centralized["accuracy"])
    assert accuracy[0] < 0.6  # the zero model predicts one class
    assert accuracy[5] >= 0.85, accuracy  # the robust rule keeps the attacker out
