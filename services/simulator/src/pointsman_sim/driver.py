"""Runs an :class:`~pointsman_sim.engine.Engine` in real time and hands each request its tokens.

One asyncio task per pod: step the engine, sleep until the step's end, deliver the step's tokens to
the waiting handlers, repeat; wait on an event while the engine has nothing to do. Simulated time is
the event loop's clock times ``speedup``, so ``speedup`` 10 makes every step ten times shorter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from types import TracebackType

from pointsman_sim.engine import Engine, FinishedRequest, StepResult

logger = logging.getLogger(__name__)

# Timer wake-ups come late by up to a millisecond. Starting each step at the previous step's planned
# end (not at the late wake-up) keeps simulated throughput exact; past this lag (wall seconds), e.g.
# after the process stalled, the engine jumps to the present instead of replaying a burst of steps.
_MAX_LAG_S = 0.05


class PodClosed(Exception):
    """The pod stopped before the request finished."""


class RequestStream:
    """One request's view of the engine: its token counts as steps end, then its end."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.result: FinishedRequest | None = None
        self._events: asyncio.Queue[int | FinishedRequest | None] = asyncio.Queue()

    @property
    def done(self) -> bool:
        return self.result is not None

    async def tokens(self) -> AsyncIterator[int]:
        """Yield the number of tokens each step produced; raise :class:`PodClosed` if cut short."""
        while True:
            event = await self._events.get()
            if event is None:
                raise PodClosed(f"the pod stopped before request {self.request_id} finished")
            if isinstance(event, FinishedRequest):
                self.result = event
                return
            yield event

    def _put(self, event: int | FinishedRequest | None) -> None:
        self._events.put_nowait(event)


class EngineDriver:
    """Use as ``async with driver:`` to run the stepping task; leaving it ends pending requests."""

    def __init__(
        self,
        engine: Engine,
        *,
        speedup: float = 1.0,
        on_step: Callable[[StepResult], None] | None = None,
    ) -> None:
        if speedup <= 0:
            raise ValueError(f"speedup must be positive, got {speedup}")
        self.engine = engine
        self._speedup = speedup
        self._on_step = on_step
        self._streams: dict[str, RequestStream] = {}
        self._wakeup = asyncio.Event()
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._task: asyncio.Task[None] | None = None

    def now(self) -> float:
        """The simulated time, in seconds."""
        return asyncio.get_running_loop().time() * self._speedup

    def submit(
        self,
        request_id: str,
        prompt_tokens: int,
        max_tokens: int,
        adapter: str | None,
        block_hashes: tuple[int, ...] = (),
    ) -> RequestStream:
        """Queue a request; raises the engine's :class:`~pointsman_sim.engine.RequestRejected`."""
        if self._task is None or self._task.done():
            raise PodClosed("the pod is not running")
        self.engine.submit(request_id, prompt_tokens, max_tokens, adapter, self.now(), block_hashes)
        stream = RequestStream(request_id)
        self._streams[request_id] = stream
        self._wakeup.set()
        return stream

    def cancel(self, request_id: str) -> None:
        """Forget a request whose client is gone (no-op once it finished)."""
        if self._streams.pop(request_id, None) is not None:
            self.engine.cancel(request_id)

    def abort_all(self) -> int:
        """End every pending request with :class:`PodClosed`; return how many there were."""
        for request_id in self._streams:
            self.engine.cancel(request_id)
        count = len(self._streams)
        self._end_streams()
        return count

    def set_paused(self, paused: bool) -> None:
        """Stop stepping the engine (a stalled pod: requests queue, none progress), or go on."""
        if paused:
            self._unpaused.clear()
        else:
            self._unpaused.set()

    async def __aenter__(self) -> EngineDriver:
        self._task = asyncio.create_task(self._run(), name="engine-driver")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._task is not None
        self._task.cancel()
        try:
            # A crashed driver re-raises its error here; a cancelled one is what we asked for.
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        finally:
            self._end_streams()

    async def _run(self) -> None:
        try:
            await self._loop()
        except Exception:
            logger.exception("the engine driver failed; pending requests end with PodClosed")
            self._end_streams()
            raise

    def _end_streams(self) -> None:
        for stream in self._streams.values():
            stream._put(None)
        self._streams.clear()

    async def _loop(self) -> None:
        planned_start: float | None = None  # the previous step's end, while steps run back to back
        while True:
            if not self._unpaused.is_set():
                await self._unpaused.wait()
                planned_start = None
            if not self.engine.has_work:
                self._wakeup.clear()
                await self._wakeup.wait()
                planned_start = None
                continue  # paused meanwhile, perhaps
            now = self.now()
            start = now if planned_start is None else max(planned_start, now - _MAX_LAG_S * self._speedup)
            result = self.engine.step(start)
            if not result.duration:
                # Nothing could start at `start` (e.g. the only waiting request arrived after it).
                planned_start = None
                await asyncio.sleep(0)
                continue
            await asyncio.sleep(max(0.0, (result.ends_at - self.now()) / self._speedup))
            self._deliver(result)
            planned_start = result.ends_at

    def _deliver(self, result: StepResult) -> None:
        for request_id, count in result.tokens.items():
            stream = self._streams.get(request_id)
            if stream is not None:  # else cancelled while the step ran
                stream._put(count)
        for finished in result.finished:
            stream = self._streams.pop(finished.request_id, None)
            if stream is not None:
                stream._put(finished)
        if self._on_step is not None:
            self._on_step(result)
