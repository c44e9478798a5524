"""What a run's float results depend on beyond its configuration: ``summary.json``'s
``"environment"`` object.

Two runs of one configuration and seed agree bit for bit only on the same code and the same
floating-point kernels: torch picks its CPU kernels by the machine's vector extensions
(``torch.backends.cpu.get_cpu_capability()``: AVX2 and AVX-512 kernels sum in different
orders; ``ATEN_CPU_CAPABILITY=avx2`` forces the AVX2 ones), the number of threads splits
reductions differently, and the BLAS (MKL, OpenBLAS) has its own. :func:`run_environment`
records all of it, with the commit of the code and the command that ran::

    {"commit": "<40 hex digits>" | null,     # HEAD of the checkout sharefl was imported from,
                                             # read when this module was imported (the code
                                             # the process loaded, not a later HEAD)
     "uncommitted": ["sharefl/x.py", ...],   # tracked files changed from it (null: no git)
     "finished": "2026-12-05T10:40:00Z",     # when the summary was written (UTC)
     "command": "sharefl simulate ...",      # the process's command line
     "python": "3.11.14", "platform": "Linux-...-x86_64", "cpu": "AMD EPYC ...",
     "cpu_count": 2,
     "torch": "2.13.0+cpu", "torch_threads": 1, "torch_interop_threads": 1,
     "cpu_capability": "AVX512",             # torch.backends.cpu.get_cpu_capability()
     "torch_blas": "mkl", "torch_lapack": "mkl",   # torch.__config__.show()'s build settings
     "numpy": "2.4.6", "numpy_blas": "scipy-openblas 0.3.31.188.0",
     "cuda": null | {"version": "12.8", "device": "NVIDIA H100 ...", "cudnn": 91002},
     "env": {"OMP_NUM_THREADS": "1", ...}}   # the variables that change kernels or threads

Every lookup that fails records ``null`` (a run never fails for its provenance).
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["ENV_VARIABLES", "command_line", "git_state", "run_environment", "torch_build"]

ENV_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "ATEN_CPU_CAPABILITY",
    "MKL_CBWR",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUDA_VISIBLE_DEVICES",
)
"""Environment variables recorded when set: they choose threads or kernels."""

_T = TypeVar("_T")
_MAX_UNCOMMITTED = 50


def _quietly(get: Callable[[], _T]) -> _T | None:
    try:
        return get()
    except Exception:  # provenance is best effort: any failure records null
        return None


def _git(root: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(root), *args],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    return out.stdout


def git_state(root: Path | None = None) -> tuple[str | None, list[str] | None]:
    """``(commit, uncommitted)`` of the checkout at ``root`` (default: the one this package
    was imported from): HEAD's hash and the tracked files that differ from it (at most 50,
    then ``"..."``); ``(None, None)`` outside a git checkout or without git."""
    if root is None:
        root = Path(__file__).resolve().parents[2]
    commit = _quietly(lambda: _git(root, "rev-parse", "HEAD").strip())
    if not commit or not re.fullmatch(r"[0-9a-f]{40}", commit):
        return None, None
    status = _quietly(lambda: _git(root, "status", "--porcelain", "--untracked-files=no"))
    if status is None:
        return commit, None
    paths = [line[3:] for line in status.splitlines() if len(line) > 3]
    if len(paths) > _MAX_UNCOMMITTED:
        paths = [*paths[:_MAX_UNCOMMITTED], "..."]
    return commit, paths


def command_line(argv: Sequence[str] | None = None, main_module: str | None = None) -> str:
    """The process's command line, shell-quoted: ``sharefl simulate ...`` (an installed
    program by its base name), ``python experiments/x.py ...`` (a script as it was given),
    ``python -m sharefl.cli ...`` / ``python -m pytest ...`` (a module run with ``-m``:
    ``main_module``, by default the name the running ``__main__`` was imported under, when
    ``argv`` is the process's own; its ``argv[0]`` is then the module's file path)."""
    if argv is None and main_module is None:
        main_module = _main_module()
    args = list(sys.argv if argv is None else argv)
    if not args:
        return ""
    first, rest = args[0], [shlex.quote(a) for a in args[1:]]
    name = os.path.basename(first)
    if main_module:
        head = f"python -m {main_module}"
    elif name == "__main__.py":
        head = f"python -m {Path(first).parent.name}"
    elif name.endswith(".py") or name in ("", "-c"):
        head = f"python {shlex.quote(first)}"
    else:
        head = shlex.quote(name)
    return " ".join([head, *rest])


def _main_module() -> str | None:
    """The module ``python -m`` ran (``sharefl.cli``; ``pytest`` for ``pytest.__main__``),
    or ``None`` for a script or an installed program."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", None)
    if not name:
        return None
    return name.removesuffix(".__main__")


def torch_build(config: str) -> dict[str, str | None]:
    """The BLAS and LAPACK named in ``torch.__config__.show()``'s build settings."""
    found = {}
    for key in ("BLAS_INFO", "LAPACK_INFO"):
        match = re.search(rf"\b{key}=([^,\s]+)", config)
        found[key] = match.group(1) if match else None
    return {"torch_blas": found["BLAS_INFO"], "torch_lapack": found["LAPACK_INFO"]}


def _numpy_blas() -> str | None:
    import numpy as np

    config: Any = np.show_config(mode="dicts")
    blas = config["Build Dependencies"]["blas"]
    return " ".join(str(v) for v in (blas.get("name"), blas.get("version")) if v)


def _cpu_model() -> str | None:
    text = Path("/proc/cpuinfo").read_text()
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else (platform.processor() or None)


def _cuda() -> dict[str, Any] | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return {
        "version": torch.version.cuda,
        "device": torch.cuda.get_device_name(),
        "cudnn": _quietly(torch.backends.cudnn.version),
    }


_AT_IMPORT: tuple[str | None, list[str] | None] = git_state()
"""The checkout's state when the simulator was imported: the code this process runs (a
commit made while a long grid runs changes HEAD, not the code already loaded)."""


def run_environment(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The ``"environment"`` object of ``summary.json`` (module docstring), measured in the
    process that calls it (the one that finished the run)."""
    import torch

    commit, uncommitted = _AT_IMPORT
    return {
        "commit": commit,
        "uncommitted": uncommitted,
        "finished": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": _quietly(lambda: command_line(argv)),
        "python": platform.python_version(),
        "platform": _quietly(platform.platform),
        "cpu": _quietly(_cpu_model),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": _quietly(torch.get_num_interop_threads),
        "cpu_capability": _quietly(torch.backends.cpu.get_cpu_capability),
        **(_quietly(lambda: torch_build(torch.__config__.show())) or {}),
        "numpy": _quietly(lambda: __import__("numpy").__version__),
        "numpy_blas": _quietly(_numpy_blas),
        "cuda": _quietly(_cuda),
        "env": {k: os.environ[k] for k in ENV_VARIABLES if k in os.environ},
    }
