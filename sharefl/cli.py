"""The ``sharefl`` command.

Subcommands: ``info`` (versions and machine), ``simulate`` (federated runs in one process),
``report`` (tables and plots of finished runs), ``keygen`` (certificates and identities),
``serve`` (the aggregation server), ``client`` (one client process), ``launch`` (a server and
N clients on loopback). ``sharefl COMMAND --help`` documents each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from sharefl import __version__
from sharefl.errors import ShareflError, UserError
from sharefl.exit_status import ExitStatus, epilog
from sharefl.install_hint import install_command, missing_module_hint
from sharefl.machine import forget_caught_interrupt, machine_info
from sharefl.wording import counted

if TYPE_CHECKING:  # the simulator's types; the commands import it when they run
    from sharefl.simulator.config import RunConfig


def _torch_info() -> dict[str, str | bool]:
    """torch's version and what it can run on (absent if torch is not installed)."""
    try:
        import torch
    except ModuleNotFoundError:
        return {"torch": f"not installed ({install_command('sim')})"}
    cuda = torch.cuda.is_available()
    info: dict[str, str | bool] = {
        "torch": torch.__version__,
        "torch_cuda_build": torch.version.cuda or "none (CPU-only build)",
        "cuda_available": cuda,
    }
    if cuda:
        info["cuda_device"] = torch.cuda.get_device_name(0)
    return info


def _cmd_info(args: argparse.Namespace) -> int:
    info = {"sharefl": __version__, **machine_info(), **_torch_info()}
    if args.json:
        print(json.dumps(info))
    else:
        width = max(map(len, info))  # the longest key sets the column of every colon
        for key, value in info.items():
            print(f"{key:>{width}}: {value}")
    return 0


def _cmd_keygen(args: argparse.Namespace) -> int:
    from sharefl.deploy.keygen import keygen

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(
            f"--out {out} is {'not empty' if out.is_dir() else 'a file'}: keygen writes "
            "a new CA and keys only into a new or empty folder (never over a deployment's keys)"
        )
    folder = keygen(out, range(args.clients), args.hosts.split(","))
    print(f"wrote keys for {counted(args.clients, 'client')} to {folder}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from sharefl.launch import run_server

    return run_server(
        args.config,
        address=args.address,
        clients=args.clients,
        out=args.out,
        resume=args.resume,
        port_file=args.port_file,
    )


def _cmd_client(args: argparse.Namespace) -> int:
    from sharefl.launch import run_client

    return run_client(
        args.id,
        args.server,
        trainer=args.trainer,
        keys=args.keys,
        retries=args.retries,
        exit_before=args.exit_before,
        config=args.config,
        server_timeout_s=args.server_timeout,
        read_timeout_s=args.read_timeout,
        insecure=args.insecure,
        state_dir=args.state_dir,
        atoms=False if args.no_atoms else None,
        max_rounds=args.max_rounds,
        max_epsilon=args.max_epsilon,
    )


def _cmd_launch(args: argparse.Namespace) -> int:
    from sharefl.launch import launch

    config = args.file or args.config
    if not config or (args.file and args.config and args.file != args.config):
        raise UserError("give one configuration file: sharefl launch FILE (or --config FILE)")
    if args.out:
        _check_out(args.out)
    return launch(config, args.clients, trainer=args.trainer, out=args.out)


def _check_out(out: str) -> None:
    if Path(out).exists() and not Path(out).is_dir():
        raise UserError(f"--out {out} is a file: give a folder (it is created if missing)")


def _cmd_simulate(args: argparse.Namespace) -> int:
    from sharefl.machine import keep_freed_memory, sigterm_interrupts

    keep_freed_memory()  # per-example gradients: ~2× faster without a page fault per page
    sigterm_interrupts()  # SIGTERM stops like Ctrl-C: exit 130, finished runs kept
    try:
        return _simulate(args)
    except KeyboardInterrupt:  # at any point: the preflight too, not only the runs
        print(
            "\nsharefl simulate: interrupted; finished runs and checkpoints are kept "
            "(--resume continues)",
            file=sys.stderr,
        )
        return ExitStatus.INTERRUPTED


def _simulate(args: argparse.Namespace) -> int:
    """Read and check the file (no torch yet: a bad file fails at once), then run it."""
    from sharefl.simulator.config import SimulationConfigError, load_runs

    _check_out(args.out)
    _refuse_deployment_file(args.config)
    as_written = load_runs(args.config)  # a bad value is an error even where a flag replaces it
    runs = as_written
    file_rounds: dict[str, int] = {}  # run id -> the file's rounds, where --rounds changed them
    if args.rounds is not None:
        runs = load_runs(args.config, {"rounds": args.rounds})
        if len(runs) == len(as_written):  # the same grid, run for run
            file_rounds = {r.run_id: w.rounds for w, r in zip(as_written, runs, strict=True)}
    if args.seeds:
        runs = [r for r in runs if r.seed in args.seeds]
    if args.match:
        runs = [r for r in runs if args.match in r.label]
    if args.label:
        runs = _labelled(runs, args.label)
    if not runs:
        raise SimulationConfigError("no run of the file matches --seeds/--match")
    from sharefl.simulator.preflight import check_runs  # torch from here on
    from sharefl.simulator.runner import Progress, refuse_unfinished, run_grid

    if not (args.resume or args.restart):
        refuse_unfinished(runs, Path(args.out))  # a checkpoint is never discarded unasked
    check_runs(runs, args.device)  # every name and option, before any data loads
    outcomes = run_grid(
        runs,
        args.out,
        device=args.device,
        progress=Progress(),
        file_rounds=file_rounds,
        resume=args.resume,
        checkpoint_every=args.checkpoint_every,
        restart=args.restart,
    )
    for outcome in outcomes:
        s = outcome.summary
        line = {k: s[k] for k in ("label", "seed", "final_accuracy", "epsilon", "wall_seconds")}
        print(json.dumps(line | {"folder": str(outcome.folder)}, ensure_ascii=False))
    return 0


def _refuse_deployment_file(path: str) -> None:
    """Raise :class:`UserError` naming ``launch`` and ``serve`` when ``path`` is a valid
    deployment file and not a simulation file (one without ``[data]`` and ``[clients]``,
    the test ``launch`` uses); return otherwise, leaving every other problem to the
    simulation file's own checks."""
    from sharefl.deploy.config import load_config
    from sharefl.protocol.errors import ConfigurationError
    from sharefl.simulator.config import is_simulation_config

    if is_simulation_config(path):
        return
    try:
        load_config(path)
    except ConfigurationError:
        return
    raise UserError(
        f"{path} is a deployment file, not a simulation file (no [data] or [clients] "
        f"table): run it with sharefl launch {path}, or sharefl serve --config {path} and "
        "sharefl client"
    )


def _cmd_report(args: argparse.Namespace) -> int:
    from sharefl.simulator.report import write_report

    path = write_report(args.directory, args.out)
    print(f"wrote {path}")
    return 0


def _labelled(runs: list[RunConfig], labels: list[str]) -> list[RunConfig]:
    """The runs whose label is one of ``labels`` exactly (where ``--match``'s part of a
    label would also select its longer variants). Raises ``SimulationConfigError`` naming
    a label no run of ``runs`` has, with the closest labels the file has."""
    from difflib import get_close_matches

    from sharefl.simulator.config import SimulationConfigError

    have = sorted({r.label for r in runs})
    for label in labels:
        if label not in have:
            close = get_close_matches(label, have, n=3, cutoff=0.5)
            hint = f"; closest: {', '.join(repr(c) for c in close)}" if close else ""
            raise SimulationConfigError(
                f"--label {label!r} is no run's label (after --seeds/--match){hint}"
            )
    return [r for r in runs if r.label in labels]


def _add_simulation_commands(sub) -> None:
    simulate = sub.add_parser("simulate", help="run a simulation TOML (a grid of runs)")
    simulate.add_argument("config", help="simulation TOML (see README, experiments/)")
    simulate.add_argument("--out", default="runs", help="results folder (default: runs)")
    simulate.add_argument("--device", help="cpu, cuda or cuda:N (overrides the file's)")
    simulate.add_argument(
        "--rounds",
        type=_positive,
        help="override the number of rounds (>= 1); with a target privacy.epsilon σ is "
        "recalibrated to reach it in these rounds (a line says so)",
    )
    simulate.add_argument("--seeds", type=int, nargs="+", help="only the runs with these seeds")
    simulate.add_argument("--match", help="only the runs whose label contains this text")
    simulate.add_argument(
        "--label", nargs="+", help="only the runs with exactly these labels (a typo is named)"
    )
    unfinished = simulate.add_mutually_exclusive_group()
    unfinished.add_argument(
        "--resume",
        action="store_true",
        help="continue each unfinished run of --out from its last checkpoint (without "
        "--resume or --restart, a checkpoint in --out stops the command: exit status 2)",
    )
    unfinished.add_argument(
        "--restart",
        action="store_true",
        help="discard the checkpoints of the unfinished runs of --out and start them again",
    )
    simulate.add_argument(
        "--checkpoint-every",
        type=_non_negative_seconds,
        default=60.0,
        metavar="SECONDS",
        help="checkpoint a run after the first round that ends SECONDS after the last "
        "checkpoint (default 60; 0: every round); SIGINT/SIGTERM checkpoint the round "
        "that is running, then stop",
    )
    simulate.set_defaults(func=_cmd_simulate)

    report = sub.add_parser("report", help="Markdown table and PNG plots of finished runs")
    report.add_argument(
        "directory",
        help="a results folder written by sharefl simulate (unfinished runs included), or "
        "by sharefl serve/launch --out",
    )
    report.add_argument("--out", help="report path (default: DIRECTORY/report.md)")
    report.set_defaults(func=_cmd_report)


def _add_deployment_commands(sub) -> None:
    keygen = sub.add_parser("keygen", help="write a CA, server/client certificates, identities")
    keygen.add_argument("--out", required=True, help="folder to create (must not hold keys)")
    keygen.add_argument("--clients", type=_positive, required=True, help="client ids 0..N-1")
    keygen.add_argument("--hosts", default="127.0.0.1,localhost", help="server names/IPs")
    keygen.set_defaults(func=_cmd_keygen)

    serve = sub.add_parser("serve", help="run the aggregation server (gRPC)")
    serve.add_argument(
        "--config", required=True, help="deployment TOML, or a simulation TOML (one run)"
    )
    serve.add_argument("--address", help="override [server] address, e.g. 0.0.0.0:50051")
    serve.add_argument("--clients", type=int, help="override [server] clients")
    serve.add_argument("--out", help="folder for rounds.jsonl, result.json and model.npy")
    serve.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the stopped run whose --out was DIR from its last finished round",
    )
    serve.add_argument(
        "--port-file",
        metavar="FILE",
        help="write the address actually bound to FILE once listening (with --address "
        "HOST:0 the OS picks a free port)",
    )
    serve.set_defaults(func=_cmd_serve)

    client = sub.add_parser("client", help="run one client process")
    client.add_argument("--server", required=True, help="host:port of the server")
    client.add_argument("--id", type=int, required=True, help="this client's id")
    client.add_argument(
        "--trainer",
        default="sharefl.deploy.client:demo_trainer",
        help="module:function called as f(model, round=..., client_id=...) -> update",
    )
    client.add_argument(
        "--config",
        help="the run's TOML: a simulation file trains this client of the run (replaces "
        "--trainer); a deployment file's [privacy] table adds this client's noise to "
        "--trainer's updates (its own copy decides the noise, not the server)",
    )
    client.add_argument("--keys", help="keygen folder: TLS CA/certificate and identity")
    client.add_argument("--retries", type=int, default=5, help="connection attempts")
    client.add_argument(
        "--server-timeout",
        type=float,
        default=60.0,
        help="seconds a stopped, dead or unreachable server may stay silent (keepalive "
        "pings every quarter of it) before the client exits with status 3 (default 60)",
    )
    client.add_argument(
        "--read-timeout",
        type=float,
        default=900.0,
        help="longest gap between two server messages during a run (default 900)",
    )
    client.add_argument(
        "--insecure",
        action="store_true",
        help="allow plaintext gRPC to a server that is not on loopback (no --keys)",
    )
    client.add_argument(
        "--state-dir",
        metavar="DIR",
        help="folder of the client's memory of the rounds and models it took part in, so a "
        "server cannot replay them, also across restarts (default: the --keys folder; "
        "without --keys and --state-dir the memory is lost when the client exits)",
    )
    client.add_argument(
        "--no-atoms",
        action="store_true",
        help="accept round plans without atoms (a server with secure_aggregation.atoms = "
        "false); across rounds the server can then difference this client's update "
        "(docs/security.md). A client that already joined an atom refuses them anyway",
    )
    client.add_argument(
        "--max-rounds",
        type=_positive,
        help="take part in at most this many rounds of this server, whatever its run ids",
    )
    client.add_argument(
        "--max-epsilon",
        type=float,
        help="take part only while the ε of this client's own DP noise stays within this "
        "(δ = 1e-5; needs --config with DP training)",
    )
    client.add_argument("--exit-before", help=argparse.SUPPRESS)  # testing: vanish at a stage
    client.set_defaults(func=_cmd_client)

    launch = sub.add_parser("launch", help="start a server and N clients on loopback")
    launch.add_argument("file", nargs="?", help="simulation TOML (one run) or deployment TOML")
    launch.add_argument("--config", help="the same file (older spelling of FILE)")
    launch.add_argument(
        "--clients",
        type=_positive,
        help="client processes (default: the file's clients.honest + clients.byzantine, "
        "or [server] clients)",
    )
    launch.add_argument(
        "--trainer",
        default="sharefl.deploy.client:demo_trainer",
        help="module:function every client calls as f(model, round=..., client_id=...) -> "
        "update, for a deployment file (a simulation file's clients train its run; default: "
        "a demo trainer)",
    )
    launch.add_argument(
        "--out",
        help="folder for result.json and model.npy (a simulation: rounds, summary); "
        "without it the results are not kept",
    )
    launch.set_defaults(func=_cmd_launch)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``sharefl`` command (one sub-parser per subcommand)."""
    parser = _Parser(
        prog="sharefl",
        description="Private and Byzantine-robust federated learning: secure aggregation "
        "inside random clusters, robust aggregation of cluster sums, differential privacy.",
        epilog=epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sharefl {__version__}")
    parser.add_argument("--debug", action="store_true", help="print the traceback behind an error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    info = sub.add_parser(
        "info", help="print versions (torch, CUDA) and the machine (CPU, cores, AES-NI)"
    )
    info.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    info.set_defaults(func=_cmd_info)
    _add_simulation_commands(sub)
    _add_deployment_commands(sub)
    return parser


def _command_parser(
    parser: argparse.ArgumentParser, command: str | None
) -> argparse.ArgumentParser:
    """The sub-parser of ``command`` (``parser`` itself without one)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def _positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_seconds(text: str) -> float:
    """argparse type: a number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {text}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (status 2) instead of the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(ExitStatus.CONFIG, f"{self.prog}: {message} (see {self.prog} --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sharefl`` console script; returns the process exit status
    (:class:`~sharefl.exit_status.ExitStatus`). A user-caused error prints one line (the
    command and what to change); ``--debug`` adds the traceback; a bug raises."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # reported by the command's parser: "sharefl COMMAND: ..." like every error
        _command_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return ExitStatus.CONFIG
    if args.debug:
        os.environ["SHAREFL_DEBUG"] = "1"  # processes started by launch inherit it
    error: BaseException
    try:
        status = int(args.func(args))
        if status == ExitStatus.INTERRUPTED:
            forget_caught_interrupt()  # or CPython may exit -2 instead (see its docstring)
        return status
    except ModuleNotFoundError as exc:
        error = exc
        hint = missing_module_hint(exc.name)
        if hint is None:
            raise
        message = hint
        status = ExitStatus.CONFIG
    except Exception as exc:
        error = exc
        user_status = exc.exit_status if isinstance(exc, ShareflError) else None
        if user_status is None:  # not an error a user causes: a bug, with its traceback
            raise
        message, status = str(exc), user_status
    if args.debug:
        traceback.print_exception(error)
    print(f"sharefl {args.command}: {' '.join(message.split())}", file=sys.stderr)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
