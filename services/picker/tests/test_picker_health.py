"""gRPC health as upstream names it: the board, and Check and Watch as the native server answers them."""

from __future__ import annotations

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2
from grpc_health.v1 import health_pb2

from pointsman_picker.h2grpc.calls import Status
from pointsman_picker.health import (
    EXT_PROC_SERVICE,
    HEALTH_CHECK_PATH,
    HEALTH_WATCH_PATH,
    LIVENESS,
    NOT_SERVING,
    READINESS_SERVICES,
    SERVICE_UNKNOWN,
    SERVING,
    HealthBoard,
    health_methods,
)


class Answers:
    """A call's response side, kept."""

    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.finished: tuple[Status, str] | None = None

    def send(self, payload: bytes) -> None:
        assert self.finished is None
        self.statuses.append(health_pb2.HealthCheckResponse.FromString(payload).status)

    def finish(self, status: Status = Status.OK, message: str = "") -> None:
        self.finished = (status, message)


def request(service: str) -> bytes:
    return health_pb2.HealthCheckRequest(service=service).SerializeToString()


def call(board: HealthBoard, path: str, payload: bytes) -> tuple[Answers, object]:
    answers = Answers()
    handler = health_methods(board)[path](answers)
    handler.message(payload)
    handler.half_closed()
    return answers, handler


def test_the_ext_proc_service_name_is_the_protobuf_s():
    names = external_processor_pb2.DESCRIPTOR.services_by_name
    assert names["ExternalProcessor"].full_name == EXT_PROC_SERVICE


def test_upstream_s_names_are_all_served():
    assert set(READINESS_SERVICES) | {LIVENESS} == {
        "",
        "liveness",
        "readiness",
        "inference-extension",
        "envoy.service.ext_proc.v3.ExternalProcessor",
    }


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        ([], dict.fromkeys(["liveness", *READINESS_SERVICES], NOT_SERVING)),
        (["live"], {"liveness": SERVING} | dict.fromkeys(READINESS_SERVICES, NOT_SERVING)),
        (["live", "ready"], dict.fromkeys(["liveness", *READINESS_SERVICES], SERVING)),
        (["live", "ready", "shut_down"], dict.fromkeys(["liveness", *READINESS_SERVICES], NOT_SERVING)),
    ],
)
def test_the_board_s_statuses(steps, expected):
    board = HealthBoard()
    for step in steps:
        getattr(board, step)()
    assert dict(board.items()) == expected


@pytest.mark.parametrize("service", ["liveness", "readiness", "", "inference-extension", EXT_PROC_SERVICE])
def test_check_answers_each_service_from_the_board(service):
    board = HealthBoard()
    board.live()
    answers, _ = call(board, HEALTH_CHECK_PATH, request(service))
    assert answers.statuses == [SERVING if service == "liveness" else NOT_SERVING]
    assert answers.finished == (Status.OK, "")


@pytest.mark.parametrize(
    ("payload", "status"), [(request("nope"), Status.NOT_FOUND), (b"\xff\xff", Status.INVALID_ARGUMENT)]
)
def test_check_refuses_an_unknown_service_or_a_bad_request(payload, status):
    answers, _ = call(HealthBoard(), HEALTH_CHECK_PATH, payload)
    assert answers.statuses == []
    assert answers.finished is not None
    assert answers.finished[0] is status


def test_watch_sends_the_status_then_each_change_until_cancelled():
    board = HealthBoard()
    answers, handler = call(board, HEALTH_WATCH_PATH, request("readiness"))
    board.live()  # another service: not told
    board.ready()
    board.ready()  # no change: not told again
    assert answers.statuses == [NOT_SERVING, SERVING]
    handler.cancelled()
    assert board.watchers == 0
    board.shut_down()
    assert answers.statuses == [NOT_SERVING, SERVING]
    assert answers.finished is None


def test_watch_of_an_unknown_service_says_so_and_stays():
    answers, _ = call(HealthBoard(), HEALTH_WATCH_PATH, request("nope"))
    assert answers.statuses == [SERVICE_UNKNOWN]
    assert answers.finished is None


def test_shutdown_tells_watchers_then_ends_their_calls():
    board = HealthBoard()
    board.live()
    board.ready()
    answers, _ = call(board, HEALTH_WATCH_PATH, request(""))
    board.shut_down()
    assert answers.statuses == [SERVING, NOT_SERVING]
    assert answers.finished is not None
    assert answers.finished[0] is Status.UNAVAILABLE
    assert board.watchers == 0
