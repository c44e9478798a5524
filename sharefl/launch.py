"""Process-level entry points behind ``sharefl serve``, ``sharefl client``, ``sharefl launch``.

Each returns a process exit status and handles SIGINT/SIGTERM by cancelling its asyncio
task, so the gRPC server stops cleanly and a client closes its stream (status 130; ``serve``
keeps every finished round, ``launch`` stops its server and clients first). Every other
error ends the command by propagating to :func:`sharefl.cli.main`, which maps it to its
``exit_status`` once (:mod:`sharefl.exit_status` has the table).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from sharefl.deploy.client import (
    READ_TIMEOUT_S,
    SERVER_TIMEOUT_S,
    ClientRuntime,
    check_took_part,
    load_trainer,
    read_tls,
)
from sharefl.deploy.config import DeploymentConfig, load_config
from sharefl.deploy.keygen import load_identity
from sharefl.deploy.reports import RunResult
from sharefl.deploy.results import ResultsWriter, load_checkpoint
from sharefl.deploy.server import load_directory, serve
from sharefl.errors import ShareflError
from sharefl.exit_status import ExitStatus
from sharefl.machine import keep_freed_memory, sigterm_interrupts
from sharefl.protocol.client import ClientPolicy
from sharefl.protocol.errors import ConfigurationError
from sharefl.wording import counted

CANCEL_RETRY_S = 0.2
"""How often a signalled run is cancelled again until it stops (see :func:`_run_cancellable`)."""


def _run_cancellable(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coroutine`` and return its result; SIGINT/SIGTERM cancel it, and
    ``KeyboardInterrupt`` is raised once it stopped (its own exception if it raised one).

    The cancellation is repeated every :data:`CANCEL_RETRY_S` until the coroutine ends:
    Python 3.11's ``asyncio.wait_for`` loses a cancellation that arrives as its inner
    future completes (python/cpython#86296), and a server whose stage waits complete every
    few milliseconds would otherwise miss SIGTERM and be killed without writing its results.
    """

    async def main() -> Any:
        task = asyncio.ensure_future(coroutine)
        loop = asyncio.get_running_loop()
        signalled = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, signalled.set)
        watcher = asyncio.ensure_future(signalled.wait())
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        watcher.cancel()
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=CANCEL_RETRY_S)
        if task.cancelled():
            raise KeyboardInterrupt
        return task.result()

    return asyncio.run(main())


def _error(command: str, message: str) -> None:
    """One line on stderr, ``sharefl COMMAND: message`` like every error of the CLI (and
    the traceback being handled, under ``sharefl --debug``)."""
    if os.environ.get("SHAREFL_DEBUG") == "1":
        traceback.print_exc()
    print(f"sharefl {command}: {' '.join(message.split())}", file=sys.stderr, flush=True)


def write_results(out: str | Path, result: RunResult) -> Path:
    """``result.json`` (rounds, clusters, failures) and ``.npy`` vectors under ``out``, all
    at once (``serve`` writes them round by round with :class:`ResultsWriter` instead)."""
    writer = ResultsWriter(out)
    for report in result.reports:
        writer.round(report, result.model)
    return writer.finish(result.traffic)


def run_server(
    config_path: str,
    *,
    address: str | None = None,
    clients: int | None = None,
    out: str | None = None,
    resume: str | None = None,
    port_file: str | None = None,
) -> int:
    """``sharefl serve``: run all rounds, write results, return an exit status. ``resume``
    is the results folder of a stopped run (deployment files only): the rounds go on from
    its last finished one, appended to the same folder, with the run id, the model's
    clusterings and every sum released on it restored (:func:`load_checkpoint`).
    ``port_file`` receives the address actually bound (``host:port``; the port the OS
    chose for port 0) once the server listens."""
    keep_freed_memory()
    writer = None
    try:
        config, strategy = _server_config(config_path, out)
        server = dataclasses.replace(
            config.server,
            address=address or config.server.address,
            clients=clients or config.server.clients,
        )
        config = dataclasses.replace(config, server=server)
        checkpoint = None
        if resume:
            if out and Path(out).resolve() != Path(resume).resolve():
                raise ConfigurationError("--resume DIR writes to DIR: drop --out or make it DIR")
            from sharefl.simulator.config import is_simulation_config

            if is_simulation_config(config_path):
                raise ConfigurationError(
                    "--resume continues deployment files only (a simulation file's run "
                    "restarts from its seed)"
                )
            checkpoint, out = load_checkpoint(resume), resume
        writer = ResultsWriter(out, checkpoint) if out else None
        result = _run_cancellable(
            serve(
                config,
                strategy=strategy,
                on_round=writer.round if writer else None,
                resume=checkpoint,
                journal=writer,
                listening=write_address(Path(port_file)) if port_file else None,
            )
        )
    except ShareflError as exc:  # the CLI prints it and exits with its status
        if writer is not None and writer.rows:  # a run stopped after some rounds: keep them
            writer.finish(error=str(exc))
        raise
    except KeyboardInterrupt:
        kept = ""
        if writer is not None:
            writer.finish(interrupted=True)
            kept = f"; {counted(len(writer.rows), 'finished round')} kept in {writer.folder}"
        _error("serve", "server interrupted" + kept)
        return ExitStatus.INTERRUPTED
    if writer is not None:
        print(f"results in {writer.finish(result.traffic)}", file=sys.stderr)
    return ExitStatus.OK


def _server_config(config_path: str, out: str | None) -> tuple[DeploymentConfig, Any]:
    """A deployment file (with its robust strategy when it has an ``[aggregator]``), or a
    simulation file with its training strategy."""
    from sharefl.simulator.config import is_simulation_config

    if not is_simulation_config(config_path):
        config = load_config(config_path)
        if not config.aggregator.name:
            return config, None
        from sharefl.robust_strategy import RobustStrategy

        return config, RobustStrategy(config)
    from sharefl.simulation_bridge import SimulationStrategy, deployment_for, single_run
    from sharefl.simulator.runner import run_folder

    run = single_run(config_path)
    strategy = SimulationStrategy(run, None if out is None else run_folder(Path(out), run))
    return deployment_for(run, strategy.simulation), strategy


def _client_trainer(config_path: str | None, trainer: str, client_id: int) -> Any:
    """The client's trainer (:func:`_client_setup`)."""
    return _client_setup(config_path, trainer, client_id)[0]


def _client_setup(config_path: str | None, trainer: str, client_id: int) -> tuple[Any, bool]:
    """(the client's trainer, whether it requires atom plans), from one read of the file.

    The trainer: a simulation file's client of the run (only that client is built:
    :class:`~sharefl.simulation_bridge.SimulationTrainer`); ``trainer`` (a
    ``module:function``) with the noise of a deployment file's ``[privacy]`` table; or
    ``trainer`` alone without a file. Atom plans: as the file's
    ``secure_aggregation.atoms`` says for a deployment (on unless switched off); on without
    a file. Raises :class:`ConfigurationError` for a deployment file without ``[privacy]``
    (nothing in it is for a client)."""
    if config_path is None:
        return load_trainer(trainer), True
    from sharefl.simulator.config import is_simulation_config

    if is_simulation_config(config_path):
        from sharefl.simulation_bridge import SimulationTrainer, single_run

        run = single_run(config_path)
        atoms = run.secure_aggregation.atoms_on(deployment=True)
        return SimulationTrainer(run, client_id), atoms
    from sharefl.deploy.distributed import (
        DistributedRingInputs,
        NoisyTrainer,
        deployment_encoder,
    )

    deployment = load_config(config_path)
    encoder = deployment_encoder(deployment)
    if encoder is None:
        raise ConfigurationError(
            f"{config_path} has no [privacy] table: a client reads only that from a "
            "deployment file (drop --config, or add the table)"
        )
    single = deployment.secure_aggregation.reclusterings == 1
    noisy = NoisyTrainer(
        load_trainer(trainer), DistributedRingInputs(encoder, single_clustering=single)
    )
    return noisy, deployment.secure_aggregation.atoms_on(deployment=True)


def client_runtime(
    client_id: int,
    address: str,
    *,
    trainer: str = "sharefl.deploy.client:demo_trainer",
    keys: str | None = None,
    retries: int = 5,
    exit_before: str | None = None,
    config: str | None = None,
    server_timeout_s: float = SERVER_TIMEOUT_S,
    read_timeout_s: float = READ_TIMEOUT_S,
    insecure: bool = False,
    state_dir: str | None = None,
    atoms: bool | None = None,
    max_rounds: int | None = None,
    max_epsilon: float | None = None,
) -> ClientRuntime:
    """Build a client from CLI-style arguments; ``keys`` is a ``sharefl keygen`` folder
    (its CA is required: a client with keys always uses TLS); ``config``, a simulation
    file, replaces ``trainer`` by that run's client training (the file is read once);
    ``state_dir`` holds the client's memory of rounds and models (default: ``keys``, so a
    signed client always has one; without either the memory lasts as long as the
    process); ``atoms``: require
    atom plans (``None``: as ``config``'s ``secure_aggregation.atoms`` says for a
    deployment, on without a file); ``max_rounds``/``max_epsilon``: the client's own
    budget (:mod:`sharefl.protocol.budget`). Raises
    :class:`ConfigurationError` for missing keys, an unreadable memory or an insecure
    connection not asked for."""
    identity = tls = directory = None
    signed = False
    if keys:
        folder = keys_folder(keys, client_id)
        identity = load_identity(folder / f"client-{client_id}.identity")
        cert, key = folder / f"client-{client_id}.pem", folder / f"client-{client_id}.key"
        tls = read_tls(str(folder / "ca.pem"), str(cert), str(key))
        directory = load_directory(str(folder / "directory.json"))
        signed = True  # a client with an identity and a directory never runs unsigned
    client_trainer, file_atoms = _client_setup(config, trainer, client_id)
    policy = ClientPolicy(
        identity=identity,
        directory=directory,
        require_signed=signed,
        require_atoms=file_atoms if atoms is None else atoms,
        max_rounds=max_rounds,
        max_epsilon=max_epsilon,
    )
    return ClientRuntime(
        client_id,
        address,
        trainer=client_trainer,
        identity=identity,
        policy=policy,
        tls=tls,
        retries=retries,
        exit_before=exit_before,
        server_timeout_s=server_timeout_s,
        read_timeout_s=read_timeout_s,
        insecure=insecure,
        state_dir=state_dir if state_dir is not None else keys or None,
    )


def keys_folder(keys: str, client_id: int) -> Path:
    """``--keys`` as a folder holding what client ``client_id`` needs from ``sharefl
    keygen`` (the CA, its certificate and key, its identity, the directory: with keys a
    client always uses TLS and signs); :class:`ConfigurationError` naming ``--keys``
    otherwise."""
    folder = Path(keys)
    if not folder.is_dir():
        raise ConfigurationError(
            f"--keys {keys} is not a folder: give the folder sharefl keygen --out wrote"
        )
    needed = ["ca.pem", *(f"client-{client_id}.{x}" for x in ("pem", "key", "identity"))]
    missing = [name for name in [*needed, "directory.json"] if not (folder / name).is_file()]
    if missing:
        raise ConfigurationError(
            f"--keys {keys} has no {', '.join(missing)}: give the folder sharefl keygen "
            f"--out wrote, with keys for client {client_id} (keygen --clients N covers ids "
            "0..N-1)"
        )
    return folder


def run_client(client_id: int, address: str, **kwargs: Any) -> int:
    """``sharefl client``: take part until the server finishes; return an exit status. An
    error that ends the run propagates with its ``exit_status`` (unreachable 3, refused 4,
    a server it left 5, trainer 7, every round refused 9, configuration 2)."""
    keep_freed_memory()
    try:
        runtime = client_runtime(client_id, address, **kwargs)
        report = _run_cancellable(runtime.run())
        check_took_part(report)
    except KeyboardInterrupt:
        _error("client", f"client {client_id} interrupted")
        return ExitStatus.INTERRUPTED
    print(
        f"client {client_id}: {counted(report.rounds, 'round')}"
        + (f" ({report.sampled_out} not sampled)" if report.sampled_out else "")
        + f", {counted(report.bytes_sent, 'byte')} sent"
        + (f", refused {counted(len(report.refusals), 'request')}" if report.refusals else ""),
        file=sys.stderr,
    )
    return ExitStatus.OK


def write_address(path: Path) -> Callable[[str], None]:
    """A ``listening`` callback that writes the bound address to ``path`` atomically (a
    reader never sees a partial line)."""

    def write(address: str) -> None:
        partial = path.with_name(path.name + ".partial")
        partial.write_text(address + "\n")
        os.replace(partial, path)

    return write


def wait_for_address(path: Path, server: subprocess.Popen[bytes]) -> str | None:
    """The address a ``serve --port-file path`` process listens on, once it does; ``None``
    if the process ended first (it said why on stderr). The port is bound once, by the
    server: nothing can take it between a check and the bind."""
    while not path.exists():
        if server.poll() is not None:
            return None
        time.sleep(0.02)
    return path.read_text().strip()


def _stop(procs: list[subprocess.Popen], grace: float, term_wait: float = 10) -> None:
    """Let ``procs`` exit within ``grace`` seconds, then SIGTERM them (a server writes what
    it finished, a client closes its stream), then SIGKILL what is left after
    ``term_wait`` seconds; every process is reaped."""
    deadline = time.monotonic() + grace
    for proc in procs:
        remaining = deadline - time.monotonic()
        if remaining > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=remaining)
    alive = [p for p in procs if p.poll() is None]
    for proc in alive:
        proc.terminate()
    deadline = time.monotonic() + term_wait
    for proc in alive:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def launch(config_path: str, clients: int | None, *, trainer: str, out: str | None = None) -> int:
    """``sharefl launch``: a server and ``clients`` client processes on loopback.

    ``clients`` defaults to the file's: a simulation's ``clients.total`` (every client
    process trains its own client of the run) or a deployment's ``server.clients``. The
    server's progress goes to stderr as it happens; returns the server's exit status
    (clients still running when it ends are terminated). Without ``out`` a warning says
    that the results are not kept.
    """
    from sharefl.simulator.config import is_simulation_config

    simulation = is_simulation_config(config_path)
    if simulation:  # what a deployment cannot run is refused before any process starts
        from sharefl.simulation_bridge import deployment_section, single_run

        run = single_run(config_path)
        deployment_section(run)
        clients = clients or run.clients.total
        if clients != run.clients.total:
            raise ConfigurationError(
                f"the run has {run.clients.total} clients; drop --clients or set "
                "clients.honest/byzantine"
            )
        config = DeploymentConfig()
    else:
        config = load_config(config_path)
        clients = clients or config.server.clients
    if not out:
        print(
            "sharefl launch: no --out: the results are not kept (give --out DIR to keep "
            "rounds.jsonl, result.json and the model)",
            file=sys.stderr,
        )
    keys = str(Path(config.tls.cert).parent) if config.tls.enabled else None
    python = [sys.executable, "-m", "sharefl.cli"]
    port_dir = tempfile.TemporaryDirectory(prefix="sharefl-launch-")
    port_file = Path(port_dir.name) / "address"
    serve_cmd = [*python, "serve", "--config", config_path, "--address", "127.0.0.1:0"]
    serve_cmd += ["--port-file", str(port_file), "--clients", str(clients)]
    serve_cmd += ["--out", out] if out else []
    sigterm_interrupts()
    procs: list[subprocess.Popen[bytes]] = []
    server = subprocess.Popen(serve_cmd)
    try:
        address = wait_for_address(port_file, server)
        if address is None:  # the server refused to start and said why
            return server.wait()
        # Many client processes share this machine's cores: one compute thread each, or
        # every process's thread pool fights for the same cores (unless the user says).
        client_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        for cid in range(clients):
            cmd = [*python, "client", "--server", address, "--id", str(cid)]
            cmd += ["--config", config_path] if simulation else ["--trainer", trainer]
            procs.append(subprocess.Popen(cmd + (["--keys", keys] if keys else []), env=client_env))
        status = server.wait()
        _stop([server, *procs], grace=10)
    except KeyboardInterrupt:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut the stop
        # The server first, while its clients are still there: stopped with fewer clients
        # it would fail its round (too few to aggregate) instead of writing its results.
        _stop([server], grace=0)
        _stop(procs, grace=0)
        _error("launch", f"interrupted; server and {counted(len(procs), 'client')} stopped")
        return ExitStatus.INTERRUPTED
    finally:
        port_dir.cleanup()
    failed = sum(1 for p in procs if p.returncode not in (0, None))
    print(
        f"sharefl launch: server exited {status}; {clients - failed} of "
        f"{counted(clients, 'client')} exited cleanly",
        file=sys.stderr,
    )
    if any(p.returncode == ExitStatus.USER_CODE_FAILED for p in procs):
        return ExitStatus.USER_CODE_FAILED  # a client's trainer raised (its line above)
    return status
