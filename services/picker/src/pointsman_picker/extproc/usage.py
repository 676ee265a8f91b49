"""Token usage read from a model server's response as it streams past, without changing a byte of it.

A JSON response carries ``usage`` in its one object; an SSE stream (``text/event-stream``,
``"stream": true``) carries it in the last ``data:`` event when the client asked for it
(``stream_options.include_usage``). Only lines that mention ``"usage"`` are parsed, so a long stream
costs one substring search per event, and none once usage was found (it comes once, at the end).
"""

from __future__ import annotations

from typing import Any

import orjson

from pointsman_picker.routing import Usage

_USAGE = b'"usage"'
_DATA = b"data:"


def usage_of(doc: Any) -> Usage | None:
    """``usage.prompt_tokens`` and ``usage.completion_tokens`` of an OpenAI response object, if both."""
    usage = doc.get("usage") if isinstance(doc, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    return Usage(prompt, completion)


class UsageScanner:
    """Feed the response body chunk by chunk; :attr:`usage` holds what was found once the body ends.

    JSON bodies are kept up to ``max_bytes`` and parsed at the end; past that no usage is reported.
    SSE streams keep only the unfinished last line.
    """

    def __init__(self, *, event_stream: bool, max_bytes: int) -> None:
        self.event_stream = event_stream
        self._max_bytes = max_bytes
        self._pending = b""
        self._parts: list[bytes] = []
        self._size = 0
        self.usage: Usage | None = None

    def feed(self, chunk: bytes) -> None:
        if self.event_stream:
            # Most chunks are whole events without usage: one substring search, nothing kept.
            if self.usage is None and (self._pending or _USAGE in chunk or not chunk.endswith(b"\n")):
                self._scan_lines(chunk)
            return
        self._size += len(chunk)
        if self._size <= self._max_bytes:
            self._parts.append(chunk)
        else:
            self._parts = []

    def finish(self) -> Usage | None:
        if self.event_stream:
            if self.usage is None:
                self._scan_lines(b"\n")
        elif self._parts:
            try:
                self.usage = usage_of(orjson.loads(b"".join(self._parts)))
            except orjson.JSONDecodeError:
                self.usage = None
            self._parts = []
        return self.usage

    def _scan_lines(self, chunk: bytes) -> None:
        data = self._pending + chunk if self._pending else chunk
        end = data.rfind(b"\n")
        if end < 0:
            self._pending = data[-self._max_bytes :] if len(data) > self._max_bytes else data
            return
        # An event's chunk usually ends with its blank line: nothing pending, and no copy searched.
        self._pending = data[end + 1 :] if end + 1 < len(data) else b""
        if data.find(_USAGE, 0, end) < 0:
            return
        for line in data[:end].split(b"\n"):
            line = line.strip()
            if line.startswith(_DATA) and _USAGE in line:
                try:
                    found = usage_of(orjson.loads(line[len(_DATA) :]))
                except orjson.JSONDecodeError:
                    continue
                if found is not None:
                    self.usage = found
