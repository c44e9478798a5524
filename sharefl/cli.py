"""The ``sharefl`` command.

Subcommands available now: ``info``. The deployment and experiment commands (``serve``,
``client``, ``launch``, ``keygen``, ``simulate``, ``report``) are added by the issues that
build them; ``sharefl --help`` lists what this installation has.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from sharefl import __version__
from sharefl.machine import machine_info


def _cmd_info(args: argparse.Namespace) -> int:
    info = {"sharefl": __version__, **machine_info()}
    if args.json:
        print(json.dumps(info))
    else:
        for key, value in info.items():
            print(f"{key:>14}: {value}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``sharefl`` command (one sub-parser per subcommand)."""
    parser = argparse.ArgumentParser(
        prog="sharefl",
        description="Private and Byzantine-robust federated learning: secure aggregation "
        "inside random clusters, robust aggregation of cluster sums, differential privacy.",
    )
    parser.add_argument("--version", action="version", version=f"sharefl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = sub.add_parser(
        "info", help="print versions and the machine (CPU, cores, AES-NI) used for benchmarks"
    )
    info.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    info.set_defaults(func=_cmd_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sharefl`` console script; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
