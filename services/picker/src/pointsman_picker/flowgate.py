"""The asyncio edge of flow control: routes through the :class:`~pointsman_picker.flowcontrol.
controller.FlowController` and pumps it while requests wait.

The pump runs when a request starts waiting or one ends (room may have freed), and at least every
``interval`` while any waits (a new snapshot, a deadline). At shutdown :meth:`FlowGate.drain` answers
every waiting request before the servers stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from pointsman_picker.context import RequestContext
from pointsman_picker.flowcontrol.controller import FlowController, Waiting
from pointsman_picker.routing import Routing

log = logging.getLogger(__name__)

# Snapshots come every ~50 ms; a pass over a saturated pool is a few microseconds per pod.
PUMP_INTERVAL = 0.005


class FlowGate:
    def __init__(self, controller: FlowController, *, interval: float = PUMP_INTERVAL) -> None:
        self.controller = controller
        self._interval = interval
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def route(self, context: RequestContext) -> Routing | Waiting:
        result = self.controller.route(context)
        if isinstance(result, Waiting):
            self._wake.set()  # the pump runs after the stream has taken the Waiting
        return result

    def finished(self, routing: Routing) -> None:
        self.controller.finished(routing)
        if self.controller.waiting:
            self._wake.set()

    def responded(self, routing: Routing) -> None:
        """A routed request's response headers came: its pod's wait is measured."""
        self.controller.responded(routing)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="flow-control")

    async def _run(self) -> None:
        controller, wake = self.controller, self._wake
        while True:
            if not controller.waiting:
                wake.clear()
                await wake.wait()
            wake.clear()
            try:
                controller.pump()
            except Exception:  # a bug must not leave requests waiting forever unpumped
                log.exception("flow control pump failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), self._interval)

    async def drain(self) -> int:
        """Stop pumping and answer every waiting request (503); how many there were."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        drained = self.controller.drain()
        if drained:
            log.info("flow control: answered %d waiting requests at shutdown", drained)
        return drained
