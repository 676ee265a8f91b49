"""The picker's errors; :func:`pointsman_picker.extproc.responses.error_response` is the one function that
turns them into an Envoy ImmediateResponse.

Each error carries the HTTP status Envoy answers with, upstream's canonical error code (the
``error_code`` label of ``inference_model_request_error_total``) and the ``result`` label of
``pointsman_picker_decisions_total``.

    PickerError
    ├── BadRequest      400  body not JSON, ``model`` missing or not a string
    ├── UnknownModel    404  no InferenceModel for ``model`` (with picker.passthroughUnknownModels off)
    ├── BodyTooLarge    413  body over ``picker.maxBodyBytes``
    ├── NoCapacity      429  the scheduler dropped a sheddable request
    │   ├── QueueFull   429  flow control: the request's band or the whole queue is at its bound
    │   └── ShedExpired 429  flow control: a sheddable request waited its band's time limit
    ├── QueueExpired    503  flow control: a request that may not be shed waited its time limit
    ├── Evicted         503  flow control: the picker stopped while the request waited
    ├── NoEndpoints     503  no pod, or no snapshot under FailClose
    └── Internal        500  anything else
"""

from __future__ import annotations

from typing import ClassVar


class PickerError(Exception):
    status: ClassVar[int] = 500
    code: ClassVar[str] = "Internal"
    result: ClassVar[str] = "internal"

    def __init__(self, message: str, *, model: str = "", target: str = "", explain: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.model = model
        self.target = target
        self.explain = explain  # the scheduling path, when it was asked for


class BadRequest(PickerError):
    status = 400
    code = "BadRequest"
    result = "bad_request"


class UnknownModel(PickerError):
    status = 404
    code = "BadConfiguration"
    result = "unknown_model"


class BodyTooLarge(PickerError):
    status = 413
    code = "RequestTooLarge"
    result = "body_too_large"


class NoCapacity(PickerError):
    status = 429
    code = "InferencePoolResourceExhausted"
    result = "no_capacity"


class QueueFull(NoCapacity):
    result = "queue_full"


class ShedExpired(NoCapacity):
    result = "queue_expired"


class QueueExpired(PickerError):
    status = 503
    code = "ServiceUnavailable"
    result = "queue_expired"


class Evicted(PickerError):
    status = 503
    code = "ServiceUnavailable"
    result = "evicted"


class NoEndpoints(PickerError):
    status = 503
    code = "ServiceUnavailable"
    result = "no_endpoints"


class Internal(PickerError):
    pass
