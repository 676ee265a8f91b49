"""Usage tokens read from JSON bodies and SSE streams, however the bytes are split."""

from __future__ import annotations

import pytest

from pointsman_picker.extproc.usage import Usage, UsageScanner

STREAM = (
    b'data: {"choices":[{"text":"a"}],"usage":null}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":4,"total_tokens":16}}\n\n'
    b"data: [DONE]\n\n"
)
BODY = b'{"id":"x","usage":{"prompt_tokens":9,"completion_tokens":1}}'


def scan(data: bytes, *, event_stream: bool, split: int, max_bytes: int = 1000) -> Usage | None:
    scanner = UsageScanner(event_stream=event_stream, max_bytes=max_bytes)
    for start in range(0, len(data), split):
        scanner.feed(data[start : start + split])
    return scanner.finish()


@pytest.mark.parametrize("split", [1, 7, 1000])
def test_sse_usage_whatever_the_chunking(split):
    assert scan(STREAM, event_stream=True, split=split) == Usage(12, 4)


@pytest.mark.parametrize(
    ("data", "event_stream", "max_bytes", "expected"),
    [
        (BODY, False, 1000, Usage(9, 1)),
        (BODY, False, 10, None),  # over the cap: not kept, not parsed
        (b'{"usage":{"prompt_tokens":9}}', False, 1000, None),
        (b"[1, 2]", False, 1000, None),
        (b'data: {"choices":[]}\n\n', True, 1000, None),
        (b'data: {"usage":{"prompt_tokens":2,"completion_tokens":3}}', True, 1000, Usage(2, 3)),  # no newline
        (b"data: {broken usage\n\n", True, 1000, None),
    ],
)
def test_usage_cases(data, event_stream, max_bytes, expected):
    assert scan(data, event_stream=event_stream, split=4, max_bytes=max_bytes) == expected


def test_sse_stops_scanning_once_usage_is_found():
    scanner = UsageScanner(event_stream=True, max_bytes=1000)
    scanner.feed(STREAM)
    assert scanner.usage == Usage(12, 4)
    # vLLM sends usage once, last: what follows is not searched (a later one would not count).
    scanner.feed(b'data: {"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n')
    assert scanner.finish() == Usage(12, 4)


def test_sse_keeps_a_line_cut_between_chunks():
    scanner = UsageScanner(event_stream=True, max_bytes=1000)
    line = b'data: {"usage":{"prompt_tokens":2,"completion_tokens":3}}\n\n'
    scanner.feed(line[:20])
    assert scanner.usage is None
    scanner.feed(line[20:])
    assert scanner.usage == Usage(2, 3)
