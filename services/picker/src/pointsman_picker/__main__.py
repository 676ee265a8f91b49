"""``pointsman-picker --config FILE``: the Envoy ext_proc endpoint picker.

The upstream endpoint picker's flags are accepted as aliases (:mod:`pointsman_shared.upstream`), so an
upstream Deployment's arguments run it.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from pathlib import Path

from pointsman_picker.server import load_checked, serve
from pointsman_shared import aio, cli, upstream
from pointsman_shared.config import ConfigError

log = logging.getLogger("pointsman_picker")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pointsman-picker", description="Envoy ext_proc endpoint picker for a pool of vLLM pods."
    )
    parser.add_argument(
        "--config",
        default=os.environ.get("POINTSMAN_CONFIG"),
        help="the Pointsman config file, or an upstream EndpointPickerConfig (default: $POINTSMAN_CONFIG)",
    )
    cli.add_common_flags(parser, distribution="pointsman-picker", log_level="info")
    upstream.add_flags(parser, metrics_field="picker.metricsListen", grpc=True)
    args = parser.parse_args(argv)
    if not args.config:
        parser.error("no config: pass --config FILE (or --config-file) or set POINTSMAN_CONFIG")
    path = Path(args.config)
    load = functools.partial(load_checked, extra=upstream.overrides(args))
    try:
        config, warnings = load(path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    logging.basicConfig(
        level=upstream.log_level(args, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    for warning in [*upstream.ignored(args), *warnings]:
        log.warning("%s", warning)
    return aio.run(serve(config, config_path=path, load=load))


if __name__ == "__main__":
    sys.exit(main())
