"""What every Pointsman command line takes alike: ``--version`` and ``--log-level``."""

from __future__ import annotations

import argparse
from importlib import metadata

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def add_common_flags(parser: argparse.ArgumentParser, *, distribution: str, log_level: str) -> None:
    """``--version`` (the installed ``distribution``'s version) and ``--log-level`` (lower case in the
    help, any case accepted; ``log_level`` is the default)."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {metadata.version(distribution)}")
    parser.add_argument(
        "--log-level",
        default=log_level,
        type=str.lower,
        choices=LOG_LEVELS,
        help="any case (default %(default)s)",
    )
