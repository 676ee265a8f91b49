"""The builtin live client's reading of an OpenAI completions stream (server-sent events)."""

from __future__ import annotations

import json
from typing import Any


class SseStream:
    """An OpenAI completions SSE body read incrementally: :meth:`feed` takes bytes as they arrive and
    says how many events with generated text they completed."""

    def __init__(self) -> None:
        self._buffer = b""
        self.text_events = 0
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.error: str | None = None

    def feed(self, data: bytes) -> int:
        self._buffer += data
        found = 0
        while not self.done:
            end, sep = self._event_end()
            if end < 0:
                break
            event, self._buffer = self._buffer[:end], self._buffer[end + sep :]
            found += self._event(event)
        return found

    def _event_end(self) -> tuple[int, int]:
        ends = [(i, len(s)) for s in (b"\n\n", b"\r\n\r\n") if (i := self._buffer.find(s)) >= 0]
        return min(ends) if ends else (-1, 0)

    def _event(self, event: bytes) -> int:
        data = b"\n".join(
            line[5:].strip()
            for line in event.replace(b"\r\n", b"\n").split(b"\n")
            if line.startswith(b"data:")
        )
        if not data:
            return 0
        if data == b"[DONE]":
            self.done = True
            return 0
        try:
            payload = json.loads(data)
        except json.JSONDecodeError:
            return 0
        if not isinstance(payload, dict):
            return 0
        if isinstance(payload.get("error"), dict):
            self.error = str(payload["error"].get("message"))
            return 0
        if isinstance(payload.get("usage"), dict):
            self.usage = payload["usage"]
        choices = payload.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            text = choices[0].get("text")
            if text is None and isinstance(choices[0].get("delta"), dict):
                text = choices[0]["delta"].get("content")
            if text:
                self.text_events += 1
                return 1
        return 0

    @property
    def output_tokens(self) -> int:
        """The server's count when it sent ``usage``, else one per text event (the simulator's
        streams carry one token per event)."""
        if self.usage is not None and isinstance(self.usage.get("completion_tokens"), int):
            return int(self.usage["completion_tokens"])
        return self.text_events
