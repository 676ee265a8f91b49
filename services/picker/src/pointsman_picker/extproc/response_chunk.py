"""A response body chunk read straight off the wire: the one ext_proc message a streamed response sends
per token, without decoding a ``ProcessingRequest``.

Envoy serializes a response body message as field 5 (``response_body``, an ``HttpBody``), then field 8
(``metadata_context``: Envoy 1.40 sends it with every message, empty unless metadata namespaces are
forwarded; the stream never reads it, so it is skipped unread): ``HttpBody`` is field 1 (``body``,
bytes) and field 2 (``end_of_stream``, bool), each left out when empty or false. :func:`response_body`
reads exactly that shape and answers ``None`` for anything else (another message, another field, a
malformed one), which then goes through the full decode.
"""

from __future__ import annotations

_RESPONSE_BODY_TAG = 0x2A  # field 5, length-delimited
_BODY_TAG = 0x0A  # HttpBody field 1, length-delimited
_END_OF_STREAM_TAG = 0x10  # HttpBody field 2, varint
_METADATA_CONTEXT_TAG = 0x42  # field 8, length-delimited


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at ``at`` and the offset after it (IndexError past the end)."""
    byte = data[at]
    if byte < 0x80:
        return byte, at + 1
    value, shift = byte & 0x7F, 7
    while True:
        at += 1
        byte = data[at]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at + 1
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


def response_body(payload: bytes) -> tuple[bytes, bool] | None:
    """``(chunk, end_of_stream)`` of a ``ProcessingRequest`` holding only a ``response_body``
    (and ``metadata_context``); else None."""
    if not payload or payload[0] != _RESPONSE_BODY_TAG:
        return None
    try:
        # A token's event takes a length of two bytes, Envoy's empty metadata one: those are read
        # in place, longer ones by _varint.
        length = payload[1]
        at = 2
        if length >= 0x80:
            if payload[2] < 0x80:
                length = (length & 0x7F) | payload[2] << 7
                at = 3
            else:
                length, at = _varint(payload, 1)
        end = at + length
        size = len(payload)
        if end != size and not (
            end + 2 == size and payload[end] == _METADATA_CONTEXT_TAG and not payload[end + 1]
        ):
            # Only metadata_context may follow, and nothing after it.
            if end > size or payload[end] != _METADATA_CONTEXT_TAG:
                return None
            length, after = _varint(payload, end + 1)
            if after + length != size:
                return None
        chunk = b""
        end_of_stream = False
        if at < end and payload[at] == _BODY_TAG:
            length = payload[at + 1]
            if length < 0x80:
                at += 2
            elif payload[at + 2] < 0x80:
                length = (length & 0x7F) | payload[at + 2] << 7
                at += 3
            else:
                length, at = _varint(payload, at + 1)
            if at + length > end:
                return None
            chunk = payload[at : at + length]
            at += length
        if at < end and payload[at] == _END_OF_STREAM_TAG:
            flag, at = _varint(payload, at + 1)
            end_of_stream = flag != 0
    except IndexError:
        return None
    return (chunk, end_of_stream) if at == end else None
