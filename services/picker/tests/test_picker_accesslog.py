"""Envoy's access log entries mapped to the response sizes and tokens they carry, and the bounds on a
stream's messages (the servers around it: test_picker_server.py; through Envoy: tests/integration)."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.data.accesslog.v3 import accesslog_pb2
from envoy.service.accesslog.v3 import als_pb2

from pointsman_picker import accesslog
from pointsman_picker.accesslog import AccessLogService, LoggedResponse, logged_response
from pointsman_picker.routing import Usage

ROUTE = {"model": "m", "target": "t"}


def entry(route: dict[str, Any] | None = ROUTE, usage: dict[str, Any] | None = None, size: int = 100):
    found = accesslog_pb2.HTTPAccessLogEntry()
    metadata = found.common_properties.metadata.filter_metadata
    if route is not None:
        metadata["pointsman.route"].update(route)
    if usage is not None:
        metadata["pointsman.usage"].update(usage)
    found.response.response_body_bytes = size
    return found


@pytest.mark.parametrize(
    ("logged", "expected"),
    [
        (
            entry(usage={"prompt_tokens": 11, "completion_tokens": 5}),
            LoggedResponse("m", "t", 100, Usage(11, 5)),
        ),
        (entry(size=0), LoggedResponse("m", "t", 0, None)),  # no usage asked: the size alone
        (
            entry(usage={"prompt_tokens": 0, "completion_tokens": 0}),
            LoggedResponse("m", "t", 100, Usage(0, 0)),
        ),
        (entry(route=None), accesslog.UNROUTED),
        (entry(route={"model": "m"}), accesslog.MALFORMED),
        (entry(route={"model": 3, "target": "t"}), accesslog.MALFORMED),
        (entry(route={"model": "m" * 257, "target": "t"}), accesslog.MALFORMED),
        (entry(usage={"prompt_tokens": 11}), accesslog.MALFORMED),
        (entry(usage={"prompt_tokens": 1.5, "completion_tokens": 5}), accesslog.MALFORMED),
        (entry(usage={"prompt_tokens": -1, "completion_tokens": 5}), accesslog.MALFORMED),
        (entry(usage={"prompt_tokens": "11", "completion_tokens": 5}), accesslog.MALFORMED),
        (entry(usage={"prompt_tokens": 2.0**40, "completion_tokens": 5}), accesslog.MALFORMED),
    ],
)
def test_logged_response(logged: accesslog_pb2.HTTPAccessLogEntry, expected: LoggedResponse | str) -> None:
    assert logged_response(logged) == expected


class Sinks:
    def __init__(self, *, accept: bool = True) -> None:
        self.logged: list[LoggedResponse] = []
        self.results: dict[str, int] = {}
        self.accept = accept

    def on_logged(self, done: LoggedResponse) -> bool:
        self.logged.append(done)
        return self.accept

    def on_result(self, result: str, entries: int) -> None:
        self.results[result] = self.results.get(result, 0) + entries

    def service(self) -> AccessLogService:
        return AccessLogService(on_logged=self.on_logged, on_result=self.on_result)


def message(*entries: accesslog_pb2.HTTPAccessLogEntry) -> bytes:
    found = als_pb2.StreamAccessLogsMessage()
    found.http_logs.log_entry.extend(entries)
    return found.SerializeToString()


@pytest.mark.parametrize(
    ("payload", "recorded", "results"),
    [
        (
            message(entry(), entry(route=None), entry(route={})),
            1,
            {"recorded": 1, "unrouted": 1, "malformed": 1},
        ),
        (b"\xff\xff", 0, {"dropped": 1}),  # not a message
        (b"\n" + b"\x00" * (accesslog.MAX_MESSAGE_BYTES + 1), 0, {"dropped": 1}),  # too large to read
        (
            message(*[entry()] * (accesslog.MAX_ENTRIES_PER_MESSAGE + 3)),
            accesslog.MAX_ENTRIES_PER_MESSAGE,
            None,
        ),
        (als_pb2.StreamAccessLogsMessage().SerializeToString(), 0, {}),  # the identifier alone
    ],
)
def test_a_message_is_bounded_and_every_entry_counted(
    payload: bytes, recorded: int, results: dict[str, int] | None
) -> None:
    sinks = Sinks()
    sinks.service().message(payload)
    assert len(sinks.logged) == recorded
    if results is None:
        results = {"recorded": accesslog.MAX_ENTRIES_PER_MESSAGE, "dropped": 3}
    assert sinks.results == results


def test_an_entry_the_metrics_refuse_is_counted_as_dropped() -> None:
    sinks = Sinks(accept=False)
    sinks.service().message(message(entry()))
    assert sinks.results == {"dropped": 1}


def test_shutdown_ends_every_open_call_once() -> None:
    service = Sinks().service()
    ended: list[str] = []

    def first() -> None:
        ended.append("first")
        service.closed(first)

    service.opened(first)
    service.opened(lambda: ended.append("second"))
    service.shutting_down()
    assert sorted(ended) == ["first", "second"]
    assert service.open_calls == 1  # the second never said it closed
