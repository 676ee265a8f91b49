"""``pointsman-collector --config FILE``: scrape the pool's pods and publish them to Redis until signalled.

The process's part only: arguments, config, logging, signals and exit codes (0 after SIGINT or SIGTERM,
1 when the port is taken, the pods cannot be discovered or the HTTP server stops on its own, 2 for a bad
config). What runs is assembled by :func:`~pointsman_collector.assembly.create_collector`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from pointsman_collector.assembly import bind_listener, create_collector
from pointsman_collector.errors import DiscoveryError
from pointsman_shared import aio, cli, upstream
from pointsman_shared.config import ConfigError, PointsmanConfig, split_host_port

log = logging.getLogger("pointsman_collector")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="pointsman-collector",
        description="Scrape the pool's pods and publish their state to Redis until SIGINT or SIGTERM.",
        epilog="Exit codes: 0 after SIGINT or SIGTERM, 1 when the port is taken, the pods cannot be "
        "discovered or the HTTP server stops on its own, 2 for a bad config.",
    )
    parser.add_argument("--config", help="the Pointsman config file (default: $POINTSMAN_CONFIG)")
    cli.add_common_flags(parser, distribution="pointsman-collector", log_level="info")
    upstream.add_flags(parser, metrics_field="collector.listen", grpc=False)
    args = parser.parse_args(argv)
    path = args.config or os.environ.get("POINTSMAN_CONFIG")
    if not path:
        parser.error("--config is required when POINTSMAN_CONFIG is not set")
    try:
        config, warnings = upstream.load(path, extra=upstream.overrides(args), environ=os.environ)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    logging.basicConfig(
        level=upstream.log_level(args, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for warning in [*upstream.ignored(args), *warnings]:
        log.warning("%s", warning)
    # What is loaded by now lives as long as the process. Frozen, it is left out of the full garbage
    # collections that the scrapes' many short-lived objects set off: each walked all of it, pausing the
    # loop for up to 45 ms (late rounds, old metrics) at 200 pods; now a few ms.
    gc.freeze()
    return aio.run(serve(config))


async def serve(config: PointsmanConfig) -> int:
    """Run until SIGINT or SIGTERM; return the process exit code."""
    try:
        # Bound before anything starts, so a taken port fails fast and plainly.
        listen = bind_listener(*split_host_port(config.collector.listen))
    except OSError as exc:
        log.error("cannot listen on %s: %s", config.collector.listen, exc.strerror or exc)
        return 1
    try:
        service = create_collector(config, registry=CollectorRegistry(), listen=listen, environ=os.environ)
        await service.start()
    except DiscoveryError as exc:
        log.error("cannot discover pods: %s", exc.detail)
        listen.close()  # start() closed the rest
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "collecting pool %s: %d pods every %.0f ms, publishing to %s, listening on %s",
        config.pool.name,
        len(service.endpoints),
        config.collector.interval * 1000,
        config.redis.display,
        config.collector.listen,
    )
    failure: str | None = None
    try:
        failure = await service.run(stop)
    finally:
        log.info("shutting down")
        await service.aclose()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    if failure is not None:
        log.error("%s", failure)
        return 1
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
