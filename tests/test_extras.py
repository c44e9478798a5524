"""Each extra installs what its modules import, and its modules import nothing more.

pyproject.toml promises: the core (``pip install sharefl``: numpy, cryptography) runs the
secure layer; ``[grpc]`` the deployment; ``[sim]`` the robust rules, DP and the simulator;
``[flower]`` the Flower integration with the protocol and the robust rules it takes. A
module that imports, at import time, a package only another extra installs breaks that
promise for the users of its own extra, and the test environment (``[test]``, everything
installed) cannot see it.

* The static guard (default run): for each extra, a fresh interpreter in which every
  distribution the extra does not install (computed from pyproject and the installed
  packages' metadata) is blocked by a ``sys.meta_path`` finder, imports every module that
  extra promises; a blocked import fails naming the module that made it. Under
  ``[flower]`` it then runs every robust rule the integration takes.
* The slow check: a fresh virtual environment with exactly ``pip install -e ".[flower]"``
  runs one secure round of ``ShareflWorkflow`` in Flower's simulation.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from subprocess import PIPE, Popen

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]

PROMISES: tuple[tuple[str, tuple[frozenset[str], ...]], ...] = (
    ("sharefl.simulation_bridge", (frozenset({"grpc", "sim"}),)),
    ("sharefl.robust_strategy", (frozenset({"grpc", "sim"}),)),
    ("sharefl.integrations.flower", (frozenset({"flower"}),)),
    # The rules the Flower integration takes (``ShareflWorkflow(rule=...)``).
    ("sharefl.robust", (frozenset({"sim"}), frozenset({"flower"}))),
    ("sharefl.privacy", (frozenset({"sim"}),)),
    ("sharefl.sign", (frozenset({"sim"}), frozenset({"flower"}))),  # robust's and privacy's
    ("sharefl.simulator", (frozenset({"sim"}),)),
    ("sharefl.deploy", (frozenset({"grpc"}),)),
    ("sharefl.proto", (frozenset({"grpc"}),)),
    ("sharefl.launch", (frozenset({"grpc"}),)),
    ("sharefl", (frozenset(),)),  # the core: crypto, protocol, rounds, the command line's entry
)
"""Module prefix (first match wins) → the sets of extras each of which makes it importable.
A new module falls under the core unless it is placed here."""

INSTALLS: dict[str, tuple[str, ...]] = {
    "core": (),
    "grpc": ("grpc",),
    "sim": ("sim",),
    "flower": ("flower",),
    "all": ("grpc", "sim", "flower"),
}
"""The installs the guard checks: name → the extras installed."""

RULES_UNDER_FLOWER = """
import inspect
import torch
import sharefl.robust as robust
from sharefl.robust import Aggregator, ClusterScale, HierarchicalAggregator
rules = [c for c in vars(robust).values()
         if inspect.isclass(c) and issubclass(c, Aggregator) and not inspect.isabstract(c)]
assert len(rules) >= 9, rules
sums = torch.arange(21, dtype=torch.float64).reshape(7, 3) ** 1.5
for rule in rules:
    out = HierarchicalAggregator(rule=rule(f=1), scale=ClusterScale.MEAN)(sums, [3] * 7)
    assert out.shape == (3,) and bool(torch.isfinite(out).all()), rule
"""
"""Run under ``[flower]`` after the imports: every aggregator of :mod:`sharefl.robust` (what
``ShareflWorkflow(rule=...)`` takes) over cluster sums, so that no rule needs a package only
``[sim]`` installs at its first use either."""

GUARD = r"""
import importlib, json, sys

blocked = set(json.loads(sys.argv[1]))
modules = json.loads(sys.argv[2])
early = sorted(m for m in sys.modules if m.partition(".")[0] in blocked)
if early:  # imported at start-up (a .pth file): the finder below could not see them
    print(json.dumps({"early": early}))
    sys.exit(3)


def importers():
    # The innermost frame outside importlib made the import; the innermost sharefl module
    # on the stack is the one whose import led to it.
    direct = ours = None
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "?")
        if not frame.f_code.co_filename.startswith("<frozen"):
            direct = direct or name
            if ours is None and name.startswith("sharefl"):
                ours = name
        frame = frame.f_back
    return direct, ours


class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in blocked:
            return None
        direct, ours = importers()
        via = "" if direct == ours else f" (from {ours})"
        raise ModuleNotFoundError(f"{direct}{via} imports {name}", name=name)


sys.meta_path.insert(0, Blocked())
failures = {}
for module in modules:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        failures[module] = str(exc)
if not failures and len(sys.argv) > 3:
    exec(sys.argv[3])
print(json.dumps({"failures": failures}))
"""


def expand(extras: Iterable[str]) -> list[str]:
    """The requirement strings of the core and ``extras``, with ``sharefl[...]``
    self-references expanded from pyproject (not from the installed, maybe older, metadata)."""
    requirements = list(PROJECT["dependencies"])
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in EXTRAS[extra]:
            req = Requirement(line)
            if canonicalize_name(req.name) == "sharefl":
                todo.extend(req.extras)
            else:
                requirements.append(line)
    return requirements


@cache
def requirements_of(name: str) -> tuple[str, ...]:
    """The requirement strings of the installed distribution ``name`` (none if absent)."""
    try:
        return tuple(metadata.distribution(name).requires or ())
    except metadata.PackageNotFoundError:
        return ()


@cache
def import_names() -> dict[str, frozenset[str]]:
    """Top-level import name → the installed distributions that provide it."""
    return {
        top: frozenset(canonicalize_name(d) for d in dists)
        for top, dists in metadata.packages_distributions().items()
    }


def closure(requirements: Iterable[str]) -> set[str]:
    """The distributions ``requirements`` install, transitively, as far as the installed
    packages' metadata says (extras and environment markers evaluated)."""
    found: dict[str, set[str]] = {}
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        if name in found and set(req.extras) <= found[name]:
            continue
        found[name] = found.get(name, set()) | set(req.extras)
        for line in requirements_of(name):
            sub = Requirement(line)
            for wanted in ("", *sorted(found[name])):
                if sub.marker is None or sub.marker.evaluate({"extra": wanted}):
                    todo.append((sub, wanted))
                    break
    return set(found)


PACKAGING_TOOLS = {"pip", "setuptools", "wheel"}
"""In every environment pip makes (a venv's setuptools is imported at start-up by its .pth)."""


@cache
def everything_installed() -> frozenset[str]:
    """The distributions the [test] extra installs."""
    return frozenset(closure(expand(["test"])))


@cache
def blocked_imports(install: tuple[str, ...]) -> list[str]:
    """Top-level import names of the installed distributions that the test environment
    has but ``install`` does not bring (a name shared with an allowed distribution stays)."""
    allowed = closure(expand(install))
    absent = everything_installed() - allowed - PACKAGING_TOOLS
    names = []
    for top, owners in import_names().items():
        if owners <= absent and top.isidentifier():
            names.append(top)
    return sorted(names)


def module_names() -> list[str]:
    """Every module of the sharefl package, from its files."""
    names = []
    for path in sorted((ROOT / "sharefl").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def promised(install: tuple[str, ...]) -> list[str]:
    """The modules importable with ``install``: those one of whose extra sets it covers."""
    modules = []
    for module in module_names():
        for prefix, alternatives in PROMISES:
            if module == prefix or module.startswith(prefix + "."):
                if any(extras <= set(install) for extras in alternatives):
                    modules.append(module)
                break
    return modules


def newly_promised(install: tuple[str, ...]) -> list[str]:
    """:func:`promised` less what a smaller install of :data:`INSTALLS` promises already
    (checked there, with more blocked)."""
    smaller = [i for i in INSTALLS.values() if set(i) < set(install)]
    done = {m for i in smaller for m in promised(i)}
    return [m for m in promised(install) if m not in done]


def start_guard(blocked: list[str], modules: list[str], then: str | None = None) -> Popen:
    """:data:`GUARD` in a fresh interpreter (blocking ``blocked``, importing ``modules``,
    then running ``then``); :func:`guard_report` reads its answer."""
    argv = [sys.executable, "-c", GUARD, json.dumps(blocked), json.dumps(modules)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return Popen(
        argv + ([then] if then else []), stdout=PIPE, stderr=PIPE, text=True, cwd=ROOT, env=env
    )


def guard_report(process: Popen) -> dict:
    """The JSON report of a :func:`start_guard` process."""
    out, err = process.communicate()
    assert process.returncode in (0, 3), err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def not_installed(install: tuple[str, ...]) -> list[str]:
    """The requirements of ``install`` whose distribution is not installed."""
    missing = []
    for line in expand(install):
        try:
            metadata.distribution(Requirement(line).name)
        except metadata.PackageNotFoundError:
            missing.append(line)
    return missing


def needs_installed(install: tuple[str, ...]) -> None:
    """Skip (fail under CI=true) when a distribution ``install`` names is not installed."""
    missing = not_installed(install)
    if missing and os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {missing} are not installed: install the [test] extra")
    if missing:
        pytest.skip(f"not installed: {missing}")


@pytest.fixture(scope="module")
def guards() -> Iterator[dict[str, Popen]]:
    """One guard process per install whose distributions are here, all started at once
    (each mostly waits on imports)."""
    processes = {}
    for name, install in INSTALLS.items():
        if not not_installed(install):
            then = RULES_UNDER_FLOWER if name == "flower" else None
            modules = newly_promised(install)
            processes[name] = start_guard(blocked_imports(install), modules, then)
    yield processes
    for process in processes.values():
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.parametrize("name", list(INSTALLS))
def test_each_install_imports_what_it_promises_and_nothing_more(name, guards):
    install = INSTALLS[name]
    needs_installed(install)
    report = guard_report(guards[name])
    assert "early" not in report, f"imported at start-up, cannot be guarded: {report}"
    extras = "[" + ",".join(install) + "]" if install else "the core"
    assert report["failures"] == {}, (
        f"with {extras} installed, these modules import what it does not install (importer "
        f"imports module): {report['failures']}. Import it at first use, or add it to the "
        "extra that needs it (pyproject.toml)"
    )


def test_the_installs_block_what_the_extras_leave_out():
    """The blocked lists are what the extras say: scipy and dp-accounting are [sim]'s alone,
    flwr is [flower]'s, torch both's, grpc [grpc]'s and flwr's; the core blocks them all."""
    needs_installed(INSTALLS["all"])
    blocked = {name: set(blocked_imports(install)) for name, install in INSTALLS.items()}
    optional = {"torch", "scipy", "dp_accounting", "matplotlib", "PIL", "grpc", "flwr", "ray"}
    assert optional <= blocked["core"]
    assert {"scipy", "dp_accounting", "matplotlib", "PIL"} <= blocked["flower"]
    assert {"torch", "grpc", "flwr", "ray"}.isdisjoint(blocked["flower"])
    assert {"flwr", "ray", "grpc"} <= blocked["sim"] and "scipy" not in blocked["sim"]
    assert {"torch", "scipy", "flwr"} <= blocked["grpc"] and "grpc" not in blocked["grpc"]
    assert optional.isdisjoint(blocked["all"])
    assert {"pytest", "hypothesis", "skimage"} <= blocked["all"]  # test-only
    assert "sharefl.robust.coordinate" in newly_promised(INSTALLS["flower"])
    assert "sharefl.privacy.accountant" not in promised(INSTALLS["flower"])
    assert newly_promised(INSTALLS["all"]) == [
        "sharefl.robust_strategy",
        "sharefl.simulation_bridge",
    ]
    assert "sharefl.protocol.coordinator" in newly_promised(INSTALLS["core"])
    assert "sharefl.rounds.model_plans" in newly_promised(INSTALLS["core"])


def test_the_guard_names_the_module_that_imports_a_blocked_package():
    """The guard can fail: with numpy blocked, the core's first module to import it is
    named (and the import that failed)."""
    report = guard_report(start_guard(["numpy"], ["sharefl.crypto.encoding"]))
    (message,) = report["failures"].values()
    assert re.fullmatch(r"sharefl\.crypto\.\w+ imports numpy", message), message


# ---- the slow check: a fresh environment with exactly [flower] ------------------------------

APP = '''
"""One secure round of ShareflWorkflow in Flower's simulation (6 clients, clusters of 3)."""
import json

import numpy as np
from flwr.app import Context
from flwr.client import ClientApp, NumPyClient
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import ServerApp, ServerConfig
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow
from flwr.simulation import run_simulation

from sharefl.integrations.flower import ShareflWorkflow, sharefl_mod

N = 6
SHAPES = [(4, 3), (3,)]
GLOBAL = [np.full(s, 0.25, np.float32) for s in SHAPES]


def update(pid):
    rng = np.random.default_rng(100 + pid)
    return [rng.uniform(-0.5, 0.5, s).astype(np.float32) for s in SHAPES], 10 + 3 * pid


class Client(NumPyClient):
    def __init__(self, pid):
        self.pid = pid

    def fit(self, parameters, config):
        delta, weight = update(self.pid)
        return [(p + u).astype(np.float32) for p, u in zip(parameters, delta)], weight, {}


def client_fn(context: Context):
    return Client(int(context.node_config["partition-id"])).to_client()


class Recording(FedAvg):
    aggregated = None

    def aggregate_fit(self, server_round, results, failures):
        parameters, metrics = super().aggregate_fit(server_round, results, failures)
        self.aggregated = parameters_to_ndarrays(parameters) if parameters else None
        return parameters, metrics


def main():
    workflow = ShareflWorkflow(cluster_size=3, clip=1.0, seed=7)
    strategy = Recording(
        fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=N, min_available_clients=N,
        initial_parameters=ndarrays_to_parameters(GLOBAL),
    )
    server = ServerApp()

    @server.main()
    def _(grid, context):
        legacy = LegacyContext(context, config=ServerConfig(num_rounds=1), strategy=strategy)
        DefaultWorkflow(fit_workflow=workflow)(grid, legacy)

    backend = {
        "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        "init_args": {"num_cpus": 2, "num_gpus": 0, "include_dashboard": False},
    }
    app = ClientApp(client_fn=client_fn, mods=[sharefl_mod])
    run_simulation(server, app, num_supernodes=N, backend_config=backend)
    result = workflow.last_result
    updates = [update(pid) for pid in range(N)]
    total = sum(w for _, w in updates)
    fedavg = [g + sum(u[k].astype(np.float64) * w for u, w in updates) / total
              for k, g in enumerate(GLOBAL)]
    report = {
        "released": [sorted(c.members) for c in result.clusters] if result else None,
        "failed": len(result.failed) if result else None,
        "error": None if strategy.aggregated is None else max(
            float(np.abs(a - b).max()) for a, b in zip(strategy.aggregated, fedavg)),
        "bound": N * 2.0 ** -result.encoding.frac_bits + 1e-6 if result else None,
    }
    print("RESULT " + json.dumps(report), flush=True)
'''
"""The app the fresh environment runs (a file, so that Ray's workers can import it)."""

LEFT_OUT = {"scipy", "dp-accounting", "matplotlib", "pillow"}
"""What [flower] must not install: only [sim]'s modules need them."""


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


@pytest.mark.slow
def test_a_fresh_flower_install_runs_a_secure_round(tmp_path):
    """``python -m venv``, torch first when [flower] requires it (the README's CPU build),
    then ``pip install -e ".[flower]"`` and nothing else; one secure round in Flower's
    simulation releases cluster sums equal to FedAvg's result (exact up to the encoding's
    rounding, N · 2^-frac_bits)."""
    start = time.perf_counter()
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], timeout=300)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["OMP_NUM_THREADS"] = "1"
    pip = [python, "-m", "pip", "install", "--quiet"]
    if any(canonicalize_name(Requirement(r).name) == "torch" for r in EXTRAS["flower"]):
        _run([*pip, "torch==2.13.0"], timeout=900, env=env)
    _run([*pip, "-e", f"{ROOT}[flower]"], timeout=900, env=env)
    installed = json.loads(
        _run([python, "-m", "pip", "list", "--format=json"], env=env, timeout=120).stdout
    )
    names = {canonicalize_name(d["name"]) for d in installed}
    assert {"flwr", "ray", "sharefl"} <= names
    assert names.isdisjoint(LEFT_OUT), f"[flower] installs {names & LEFT_OUT}"
    (tmp_path / "flower_extra_app.py").write_text(APP)
    done = _run(
        [python, "-c", "import flower_extra_app; flower_extra_app.main()"],
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    report = json.loads(line.removeprefix("RESULT "))
    assert report["failed"] == 0 and len(report["released"]) == 2, report
    members = [i for c in report["released"] for i in c]  # node ids (an unsigned round)
    assert len(set(members)) == len(members) == 6, report
    assert report["error"] is not None and report["error"] <= report["bound"], report
    print(f"fresh [flower] environment and one round: {time.perf_counter() - start:.0f} s")


SIMULATE_TINY = """
import pathlib, tempfile
from sharefl.cli import main
folder = pathlib.Path(tempfile.mkdtemp())
config = folder / "tiny.toml"
config.write_text('''
name = "tiny"
rounds = 1
[data]
dataset = "synthetic"
options = { num_examples = 120, shape = [1, 4, 4] }
[model]
name = "mlp"
options = { hidden = [4] }
[clients]
honest = 6
[secure_aggregation]
cluster_size = 3
clip = 1.0
''')
assert main(["simulate", str(config), "--out", str(folder / "out")]) == 0
"""


def test_simulate_runs_with_the_sim_extra_alone():
    """README's main command installs [sim] only: ``sharefl simulate`` (the command line,
    its signal handling, one secure round) must not reach a [grpc] or [flower] package."""
    install = INSTALLS["sim"]
    needs_installed(install)
    # The other extras' packages; not the test-only ones, which torch probes for at run time.
    others = sorted(set(blocked_imports(install)) & {"grpc", "flwr", "ray", "google"})
    assert {"grpc", "flwr"} <= set(others)
    report = guard_report(start_guard(others, ["sharefl.cli"], SIMULATE_TINY))
    assert report["failures"] == {}, report
