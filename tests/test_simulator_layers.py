"""The simulator's layout, as the import contracts see it (``pyproject.toml``): every module
and folder of ``sharefl.simulator`` has a layer in the contract that keeps the loop folders
independent of each other and the shared modules below them, the loop registry imports each
loop statically (no importlib: an import the contracts cannot see), and each loop's
data-free check refuses a bad ``[attack]`` before any data loads."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import grimp
import pytest
from sim_configs import with_overrides

from sharefl.simulator.config import ALGORITHMS, SimulationConfigError, expand

ROOT = Path(__file__).resolve().parents[1]
SIMULATOR = ROOT / "sharefl" / "simulator"
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
    "contracts"
]


def _simulator_layers() -> list[list[str]]:
    (contract,) = [c for c in CONTRACTS if c.get("containers") == ["sharefl.simulator"]]
    assert contract["type"] == "layers"
    return [[n for n in re.split(r"[:|\s\\]+", layer) if n] for layer in contract["layers"]]


def test_every_simulator_module_has_a_layer():
    """A new module or folder of the simulator must be placed (above the loops, a loop
    folder, or shared below them), else the contract says nothing about it."""
    layers = _simulator_layers()
    placed = [name for layer in layers for name in layer]
    assert len(placed) == len(set(placed)), placed
    present = {p.stem for p in SIMULATOR.glob("*.py") if p.stem != "__init__"}
    present |= {p.parent.name for p in SIMULATOR.glob("*/__init__.py")}
    assert set(placed) == present
    assert set(ALGORITHMS) <= set(layers[2])  # every loop's folder is one of the loop layer


def test_the_loop_registry_imports_every_loop_statically():
    source = (SIMULATOR / "loops.py").read_text()
    names = {
        alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert "importlib" not in names and "import_module" not in source
    graph = grimp.build_graph("sharefl")
    imported = graph.find_modules_directly_imported_by("sharefl.simulator.loops")
    for loop in ALGORITHMS:
        assert f"sharefl.simulator.{loop}.loop" in imported, loop
    # and nothing shared below the loops reaches a loop folder (what the contract checks)
    for name in _simulator_layers()[3]:
        for folder in _simulator_layers()[2]:
            chain = graph.find_shortest_chain(
                importer=f"sharefl.simulator.{name}", imported=f"sharefl.simulator.{folder}"
            )
            assert chain is None, chain


BAD_ATTACKS = {
    "federated": ("no_such_attack", {}),
    "dp_rsa": ("sign_flipping", {"baseline_flip": "update"}),
    "decentralized": ("isolating", {"scale": 2}),
}


@pytest.mark.parametrize("loop", sorted(BAD_ATTACKS))
def test_each_loop_refuses_a_bad_attack_before_any_data_loads(loop):
    from sharefl.simulator import preflight
    from sharefl.simulator.loops import LOOPS

    name, options = BAD_ATTACKS[loop]
    base = {
        "federated": "quickstart",
        "dp_rsa": "dp_rsa_mnist_iid",
        "decentralized": "decentralized_mnist_rules",
    }[loop]
    data = tomllib.loads((ROOT / "experiments" / f"{base}.toml").read_text())
    data.pop("variant", None)  # the file's variants would set their own attacks
    data.pop("label", None)  # which may name their keys
    byzantine = max(1, data["clients"].get("byzantine", 0))
    overrides = {"attack": {"name": name, "options": options}, "clients": {"byzantine": byzantine}}
    if loop == "dp_rsa":  # the file's variants set the mechanisms' ε
        overrides["dp_rsa"] = {"method": "rsa"}
    data = with_overrides(data, overrides)
    run = expand(data)[0]
    assert run.algorithm.name == loop and name in (*LOOPS[loop].attacks, "no_such_attack")
    with pytest.raises(SimulationConfigError, match="attack"):
        preflight.check_run(run)
