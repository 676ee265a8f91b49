"""The builtin client's reading of a completions stream."""

from __future__ import annotations

import json

from pointsman_quality.sse import SseStream


def test_sse_stream_counts_text_events_across_any_split() -> None:
    events = [
        {"choices": [{"text": " the"}]},
        {"choices": [{"text": " model"}]},
        {"choices": [], "usage": {"completion_tokens": 2}},
    ]
    raw = b"".join(b"data: " + json.dumps(e).encode() + b"\r\n\r\n" for e in events) + b"data: [DONE]\n\n"
    for cut in range(1, len(raw), 7):
        stream = SseStream()
        counts = [stream.feed(raw[i : i + cut]) for i in range(0, len(raw), cut)]
        assert sum(counts) == 2
        assert stream.done
        assert stream.output_tokens == 2
    broken = SseStream()
    assert broken.feed(b'data: {"error": {"message": "pod stopped"}}\n\n') == 0
    assert broken.error == "pod stopped"
