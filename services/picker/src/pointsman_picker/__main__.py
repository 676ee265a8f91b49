"""``pointsman-picker --config FILE``: the Envoy ext_proc endpoint picker."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from pointsman_picker.server import load_checked, serve
from pointsman_shared import aio
from pointsman_shared.config import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pointsman-picker", description="Envoy ext_proc endpoint picker for a pool of vLLM pods."
    )
    parser.add_argument(
        "--config",
        default=os.environ.get("POINTSMAN_CONFIG"),
        help="the Pointsman config file (default: $POINTSMAN_CONFIG)",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], type=str.upper
    )
    args = parser.parse_args(argv)
    if not args.config:
        parser.error("no config: pass --config FILE or set POINTSMAN_CONFIG")
    try:
        config = load_checked(Path(args.config))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return aio.run(serve(config, config_path=Path(args.config)))


if __name__ == "__main__":
    sys.exit(main())
