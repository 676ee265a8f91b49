"""What the picker reads from a request body (Go's encoding/json rules, spec §1), and the rewrite of its
``model``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pointsman_picker import goencoding
from pointsman_picker.errors import BadRequest, Internal


@dataclass(frozen=True, slots=True)
class RequestBody:
    raw: bytes
    doc: dict[str, Any]
    model: str


def parse_body(raw: bytes) -> RequestBody:
    """Raise :class:`BadRequest` when the body is not a JSON object with a string ``model``."""
    try:
        doc = goencoding.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if doc is None:  # Go decodes null into a nil map
        doc = {}
    if not isinstance(doc, dict):
        raise BadRequest("request body is not a JSON object")
    model = doc.get("model")
    if model is None:
        raise BadRequest("model not found in request body")
    if not isinstance(model, str):
        raise BadRequest("model in request body is not a string")
    return RequestBody(raw=raw, doc=doc, model=model)


def with_model(body: RequestBody, target: str) -> bytes:
    """The body to forward: the original bytes, or the re-encoded map when ``model`` changes."""
    if target == body.model:
        return body.raw
    try:
        return goencoding.dumps({**body.doc, "model": target})
    except (TypeError, ValueError) as exc:
        raise Internal(f"cannot re-encode the request body: {exc}", model=body.model, target=target) from exc
