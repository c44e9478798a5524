"""Scaffolding shared by the tests: the CLI command, and servers started with their port
bound once.

A server is never given a port picked beforehand (check-then-bind races with every other
test and process on the machine): it binds port 0, the operating system chooses a free
port, and the server reports the address it bound — through ``--port-file`` for a
process, through ``listening=`` for an in-process :func:`sharefl.deploy.server.serve`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

HYPOTHESIS_PROFILE = os.environ.get("SHAREFL_HYPOTHESIS_PROFILE", "ci")
"""``ci`` (the default run: hypothesis' usual budget) or ``slow`` (at least 10,000 examples
per search). CI runs the tests marked ``slow`` under it (``.ci/run``):
``SHAREFL_HYPOTHESIS_PROFILE=slow pytest -m slow``. Most property tests are not marked
``slow`` (the profile only raises their budget, :func:`examples`): one file's property tests
at the slow budget is ``SHAREFL_HYPOTHESIS_PROFILE=slow pytest tests/test_x.py``, without
``-m slow``, which would select only that file's ``slow`` tests (often none)."""
settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "slow", max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(HYPOTHESIS_PROFILE)
SEARCH_EXAMPLES = 10_000 if HYPOTHESIS_PROFILE == "slow" else 300
"""The budget of the adversarial searches: a few hundred cases in the default run, at
least 10,000 under the ``slow`` profile."""


def examples(default: int) -> int:
    """A property test's hypothesis budget: ``default`` in the ``ci`` profile (the default
    run), at least 10,000 under ``slow`` — every budget comes from the profile, none is fixed
    in a test."""
    return max(default, 10_000) if HYPOTHESIS_PROFILE == "slow" else default


PYTHON = [sys.executable, "-m", "sharefl.cli"]
"""``sharefl`` as a command, run by this interpreter."""

LOOPBACK_ANY_PORT = "127.0.0.1:0"

HANG_S = 1200.0
"""The longest a test waits for a process it started (or for a line from it) before calling
it hung: a bound against a hang only, never a check of speed. A machine shared with other
jobs runs these processes many times slower than an idle one, so a short fixed limit turns
a correct run red; what a test bounds is the work (rounds, clients), not the time."""


def keyed_client(address: str, client_id: int, keys, *extra: str) -> list[str]:
    """The command line of ``sharefl client`` with its ``sharefl keygen`` folder."""
    return [
        *PYTHON,
        "client",
        "--server",
        address,
        "--id",
        str(client_id),
        "--keys",
        str(keys),
        *extra,
    ]


def ray_backend() -> dict[str, dict[str, Any]]:
    """The backend config of a Flower simulation in the tests: 2 CPUs, one per client, no
    dashboard (a fresh dict each time: Flower edits it in place)."""
    return {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": 2, "num_gpus": 0, "include_dashboard": False},
    }


# Clients' default memory (SHAREFL_STATE_DIR) never lands in the user's home, also for
# module-scoped fixtures and the processes (Ray workers, clients) the tests start.
os.environ.setdefault("SHAREFL_STATE_DIR", tempfile.mkdtemp(prefix="sharefl-test-state-"))


@pytest.fixture(autouse=True)
def _private_state_dir(monkeypatch, tmp_path_factory):
    """Every test keeps clients' default memory (``SHAREFL_STATE_DIR``) in a folder of its
    own: never the user's home, never another test's atoms or budget."""
    monkeypatch.setenv("SHAREFL_STATE_DIR", str(tmp_path_factory.mktemp("sharefl-state")))


@pytest.fixture
def flower_task_identity(monkeypatch):
    """Stamp the messages a test builds with a run id and node ids, as Flower's runtime does
    for a server app (``flwr.app.Message`` refuses to be built without them)."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1, raising=False)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0, raising=False)


def tiny_simulation(path: Path, *, rounds: int, eval_every: int) -> Path:
    """Write a simulation file of 4 clients training a small MLP on synthetic data (a round
    takes milliseconds) to ``path``; returns ``path``."""
    path.write_text(
        f'name = "long"\nseed = 1\nrounds = {rounds}\neval_every = {eval_every}\n'
        '[data]\ndataset = "synthetic"\npartition = "iid"\n'
        "options = { num_examples = 400, shape = [1, 4, 4] }\n"
        '[model]\nname = "mlp"\noptions = { hidden = [8] }\n'
        "[clients]\nhonest = 4\n"
        '[training]\nbatch_size = 8\nlocal_steps = 1\nlearning_rate = 0.1\nupload = "delta"\n'
        "[secure_aggregation]\ncluster_size = 1\n"
        '[aggregator]\nname = "mean"\n'
    )
    return path


class ServerStartFailed(RuntimeError):
    """The server process ended before it listened (its stderr is the message)."""


def start_server(
    config: Path | str,
    *args: str,
    folder: Path,
    address: str = LOOPBACK_ANY_PORT,
    **popen: Any,
) -> tuple[subprocess.Popen, str]:
    """``sharefl serve --config config --address address *args`` as a process (``address``
    with port 0: the OS picks the port); returns it and the address it listens on, once it
    does. ``folder`` holds the port file; ``popen`` goes to :class:`subprocess.Popen`."""
    from sharefl.launch import wait_for_address

    port_file = Path(folder) / f"address-{uuid.uuid4().hex}"
    command = [*PYTHON, "serve", "--config", str(config), "--address", address]
    server = subprocess.Popen([*command, "--port-file", str(port_file), *args], **popen)
    bound = wait_for_address(port_file, server)
    if bound is None:
        _, err = server.communicate()
        raise ServerStartFailed(f"the server exited {server.returncode} before listening: {err}")
    return server, bound


async def serving(start: Any, config: Any, **kwargs: Any) -> tuple[asyncio.Task[Any], str]:
    """Run ``start(config, listening=..., **kwargs)`` (:func:`sharefl.deploy.server.serve`)
    as a task with ``config.server.address`` at port 0; return the task and the address it
    bound, once it listens. Raises what the server raised if it stopped first."""
    config = dataclasses.replace(
        config, server=dataclasses.replace(config.server, address=LOOPBACK_ANY_PORT)
    )
    bound: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task: asyncio.Task[Any] = asyncio.create_task(
        start(config, listening=bound.set_result, **kwargs)
    )
    done, _ = await asyncio.wait({task, bound}, return_when=asyncio.FIRST_COMPLETED)
    if bound not in done:
        task.result()  # raises what the server raised
        raise RuntimeError("the server finished without listening")
    return task, bound.result()
