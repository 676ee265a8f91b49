"""HTTP/2 frames (RFC 9113), HPACK header blocks (RFC 7541) and gRPC message framing: pure codecs.

Only what a gRPC server needs: the decoder reads any header block a client may send (indexed fields,
literals with and without indexing, Huffman strings, table size updates); the encoder writes the few
fixed response header blocks as literals without indexing, so the peer's decoder table never changes
and this side keeps no encoder state.
"""

from __future__ import annotations

import enum
import re
import struct
from collections.abc import Iterator
from typing import Final
from urllib.parse import quote

from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER_BYTES: Final = 9
DEFAULT_WINDOW: Final = 65_535
DEFAULT_MAX_FRAME: Final = 16_384
MAX_WINDOW: Final = 2**31 - 1
DEFAULT_HEADER_TABLE: Final = 4_096

_FRAME_HEADER = struct.Struct(">BHBBI")  # length as 1 + 2 bytes, type, flags, stream id
_SETTING = struct.Struct(">HI")
_U32 = struct.Struct(">I")
_GRPC_PREFIX = struct.Struct(">BI")


class FrameType:
    """Frame type codes. Plain ints: comparing with an IntEnum member cost 3x as much per frame."""

    DATA = 0
    HEADERS = 1
    PRIORITY = 2
    RST_STREAM = 3
    SETTINGS = 4
    PUSH_PROMISE = 5
    PING = 6
    GOAWAY = 7
    WINDOW_UPDATE = 8
    CONTINUATION = 9


# Frame flags, plain ints: IntFlag's operators run in Python and showed in the per-request profile.
END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY: Final = 0x20


class Setting(enum.IntEnum):
    HEADER_TABLE_SIZE = 1
    ENABLE_PUSH = 2
    MAX_CONCURRENT_STREAMS = 3
    INITIAL_WINDOW_SIZE = 4
    MAX_FRAME_SIZE = 5
    MAX_HEADER_LIST_SIZE = 6


class ErrorCode(enum.IntEnum):
    NO_ERROR = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2
    FLOW_CONTROL_ERROR = 3
    SETTINGS_TIMEOUT = 4
    STREAM_CLOSED = 5
    FRAME_SIZE_ERROR = 6
    REFUSED_STREAM = 7
    CANCEL = 8
    COMPRESSION_ERROR = 9
    CONNECT_ERROR = 10
    ENHANCE_YOUR_CALM = 11
    INADEQUATE_SECURITY = 12
    HTTP_1_1_REQUIRED = 13


class H2ConnectionError(Exception):
    """A connection error (RFC 9113 §5.4.1): the peer broke HTTP/2; the connection ends with GOAWAY and this
    code."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


# -- frames ----------------------------------------------------------------------------------------


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return _FRAME_HEADER.pack(size >> 16, size & 0xFFFF, kind, flags, stream_id) + payload


# The raw header: (length >> 16, length & 0xFFFF, type, flags, stream id with its reserved bit), for a
# read loop that cannot spare frame_header's call per frame.
unpack_frame_header: Final = _FRAME_HEADER.unpack_from


def frame_header(data: bytes | bytearray, at: int) -> tuple[int, int, int, int]:
    """(length, type, flags, stream id) of the frame header at ``at``."""
    high, low, kind, flags, stream_id = _FRAME_HEADER.unpack_from(data, at)
    return (high << 16) | low, kind, flags, stream_id & MAX_WINDOW


def settings_frame(settings: dict[Setting, int]) -> bytes:
    return frame(FrameType.SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in settings.items()))


def parse_settings(payload: bytes) -> Iterator[tuple[int, int]]:
    if len(payload) % 6:
        raise H2ConnectionError("SETTINGS payload is not a multiple of 6", ErrorCode.FRAME_SIZE_ERROR)
    for at in range(0, len(payload), 6):
        yield _SETTING.unpack_from(payload, at)


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(FrameType.WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream(stream_id: int, code: ErrorCode) -> bytes:
    return frame(FrameType.RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: ErrorCode, debug: bytes = b"") -> bytes:
    return frame(FrameType.GOAWAY, 0, 0, _U32.pack(last_stream_id) + _U32.pack(code) + debug)


def u32(payload: bytes, at: int = 0) -> int:
    value: int = _U32.unpack_from(payload, at)[0]
    return value


def unpad(payload: bytes, flags: int) -> bytes:
    """The frame's payload without its padding (PADDED flag)."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise H2ConnectionError("padding longer than the frame")
    return payload[1 : len(payload) - payload[0]]


# -- gRPC messages -----------------------------------------------------------------------------------


def grpc_message(payload: bytes) -> bytes:
    """A length-prefixed, uncompressed gRPC message."""
    return _GRPC_PREFIX.pack(0, len(payload)) + payload


unpack_grpc_prefix: Final = _GRPC_PREFIX.unpack_from  # grpc_prefix without its call


def grpc_prefix(data: bytes | bytearray, at: int) -> tuple[int, int]:
    """(compressed flag, length) of the gRPC message prefix at ``at``."""
    flag, length = _GRPC_PREFIX.unpack_from(data, at)
    return flag, length


# -- HPACK: decoding ---------------------------------------------------------------------------------

_STATIC: Final = HeaderTable.STATIC_TABLE
_STATIC_ENTRIES: Final = len(_STATIC)
_STATIC_SIZES: Final = tuple(len(name) + len(value) + 32 for name, value in _STATIC)
_ENTRY_OVERHEAD: Final = 32
# Envoy sends some values as Huffman literals on every stream (":path" of each ext_proc call); decoding
# one in Python costs ~0.16 µs a byte, a lookup in what this connection already decoded far less. The
# cache holds short strings only and is bounded in bytes: 100 distinct 1 MiB values once held 390 MB.
HUFFMAN_CACHE_BYTES: Final = 64 * 1024
_HUFFMAN_CACHE_STRING: Final = 1024  # longer strings are decoded each time, never cached
# RFC 9113 §8.2.1: a field name is lowercase token characters (a pseudo-header's after its colon); a
# value holds no NUL, CR or LF and neither starts nor ends with whitespace.
_BAD_NAME: Final = re.compile(rb"[^a-z0-9!#$%&'*+\-.^_`|~]")
_BAD_VALUE: Final = re.compile(rb"[\0\r\n]|^[ \t]|[ \t]$")


def field_problem(name: bytes, value: bytes) -> str | None:
    """Why a decoded field makes its message malformed (RFC 9113 §8.2.1), or None."""
    if not name or _BAD_NAME.search(name, 1 if name[0] == 0x3A else 0) or name == b":":
        return f"bad field name {name[:64]!r}"
    if value and _BAD_VALUE.search(value):
        return f"bad value for field {name[:64]!r}"
    return None


class HeaderDecoder:
    """One connection's HPACK decoder (its dynamic table lives as long as the connection).

    :meth:`decode` counts the field list's size as RFC 9113 §6.5.2 does (name + value + 32 a field)
    while it decodes; past ``max_list_size`` it keeps decoding only what the dynamic table needs (the
    connection's compression state must follow every block) and reports the block ``oversized``. Literal
    fields are checked as they are decoded (an indexed field was checked when it entered the table);
    the first problem is left in ``malformed``. Both describe the last block decoded.
    """

    def __init__(self, max_table_size: int = DEFAULT_HEADER_TABLE, max_list_size: int = 2**32) -> None:
        self._max_allowed = max_table_size
        self._max = max_table_size
        self._size = 0
        self._dynamic: list[tuple[bytes, bytes]] = []  # newest first
        self._sizes: list[int] = []  # each entry's size, as RFC 7541 §4.1 counts it
        self._generation = 0  # moves whenever the table changes
        self._bad: set[tuple[bytes, bytes]] = set()  # malformed fields in the dynamic table
        self._huffman: dict[bytes, bytes] = {}
        self._huffman_bytes = 0
        # The last block that left the table as it was, and its fields: Envoy sends the same block of
        # table indexes on every stream of a connection.
        self._last: tuple[bytes, int, list[tuple[bytes, bytes]]] = (b"", -1, [])
        self.max_list_size = max_list_size
        self.oversized = False
        self.malformed: str | None = None

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """The block's fields (the same list again for the same block: not to be changed)."""
        last_block, generation, fields = self._last
        if block == last_block and generation == self._generation:
            self.oversized = False
            self.malformed = None
            return fields
        self.oversized = False
        self.malformed = None
        generation = self._generation
        try:
            fields = self._decode(block)
        except IndexError:
            raise H2ConnectionError("truncated header block", ErrorCode.COMPRESSION_ERROR) from None
        if generation == self._generation and not self.oversized and self.malformed is None:
            self._last = (block, generation, fields)
        return fields

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        fields: list[tuple[bytes, bytes]] = []
        append = fields.append
        dynamic, sizes = self._dynamic, self._sizes
        at, end = 0, len(block)
        size, limit = 0, self.max_list_size
        # RFC 7541 §4.2: table size updates only before the first field, and at most two (the smallest
        # size since the last block, then the final one).
        updates = 0
        while at < end:
            first = block[at]
            if first & 0x80:  # indexed field
                if first != 0xFF:
                    index = first & 0x7F
                    at += 1
                else:
                    index, at = _integer(block, at, 7)
                if 0 < index <= _STATIC_ENTRIES:
                    field = _STATIC[index - 1]
                    size += _STATIC_SIZES[index - 1]
                else:
                    position = index - _STATIC_ENTRIES - 1
                    if index == 0 or position >= len(dynamic):
                        raise H2ConnectionError(
                            f"header index {index} out of range", ErrorCode.COMPRESSION_ERROR
                        )
                    field = dynamic[position]
                    size += sizes[position]
                    if self._bad and field in self._bad and self.malformed is None:
                        self.malformed = field_problem(*field)
            else:
                if first & 0x40:  # literal with incremental indexing
                    field, at = self._literal_field(block, at, 6, True)
                    self._add(field)
                elif first & 0x20:  # dynamic table size update
                    if fields or size or updates == 2:
                        raise H2ConnectionError(
                            "table size update not at the start of the block, or more than two",
                            ErrorCode.COMPRESSION_ERROR,
                        )
                    updates += 1
                    new_size, at = _integer(block, at, 5)
                    if new_size > self._max_allowed:
                        raise H2ConnectionError(
                            "table size update above the limit", ErrorCode.COMPRESSION_ERROR
                        )
                    self._max = new_size
                    self._generation += 1
                    self._evict()
                    continue
                else:  # literal without indexing (0000) or never indexed (0001)
                    field, at = self._literal_field(block, at, 4, size <= limit)
                size += len(field[0]) + len(field[1]) + _ENTRY_OVERHEAD
            if size <= limit:
                append(field)
            elif not self.oversized:
                self.oversized = True
                fields.clear()
        return fields

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if 0 < index <= _STATIC_ENTRIES:
            return _STATIC[index - 1]
        dynamic = index - _STATIC_ENTRIES - 1
        if index == 0 or dynamic >= len(self._dynamic):
            raise H2ConnectionError(f"header index {index} out of range", ErrorCode.COMPRESSION_ERROR)
        return self._dynamic[dynamic]

    def _literal_field(
        self, block: bytes, at: int, prefix: int, wanted: bool
    ) -> tuple[tuple[bytes, bytes], int]:
        """The literal at ``at``; when not ``wanted`` (a field past the list limit that the table does
        not keep), its strings are skipped, not decoded: only their raw lengths count."""
        index, at = _integer(block, at, prefix)
        if index:
            name = self._entry(index)[0]
        else:
            name, at = self._string(block, at, wanted)
        value, at = self._string(block, at, wanted)
        field = (name, value)
        if wanted and (value or not index):
            # A name from the table was checked when it got there; a new name and any value are not.
            problem = field_problem(name, value) if not index else _value_problem(name, value)
            if problem is not None:
                if self.malformed is None:
                    self.malformed = problem
                if prefix == 6:  # entering the table: every later reference to it is malformed too
                    self._bad.add(field)
        return field, at

    def _string(self, block: bytes, at: int, wanted: bool = True) -> tuple[bytes, int]:
        huffman = block[at] & 0x80
        length, at = _integer(block, at, 7)
        end = at + length
        if end > len(block):
            raise H2ConnectionError("header string past the block", ErrorCode.COMPRESSION_ERROR)
        raw = block[at:end]
        if not huffman or not wanted:
            return raw, end
        decoded = self._huffman.get(raw)
        if decoded is None:
            try:
                decoded = decode_huffman(raw)
            except Exception as exc:  # hpack raises its own HPACKDecodingError
                raise H2ConnectionError(f"bad Huffman string: {exc}", ErrorCode.COMPRESSION_ERROR) from None
            if length <= _HUFFMAN_CACHE_STRING:
                cost = length + len(decoded)
                if self._huffman_bytes + cost > HUFFMAN_CACHE_BYTES:
                    self._huffman.clear()
                    self._huffman_bytes = 0
                self._huffman[raw] = decoded
                self._huffman_bytes += cost
        return decoded, end

    @property
    def huffman_cache_bytes(self) -> int:
        return self._huffman_bytes

    def _add(self, field: tuple[bytes, bytes]) -> None:
        size = len(field[0]) + len(field[1]) + _ENTRY_OVERHEAD
        self._dynamic.insert(0, field)
        self._sizes.insert(0, size)
        self._size += size
        self._generation += 1
        self._evict()

    def _evict(self) -> None:
        while self._size > self._max and self._dynamic:
            field = self._dynamic.pop()
            self._size -= self._sizes.pop()
            self._bad.discard(field)


def _value_problem(name: bytes, value: bytes) -> str | None:
    if _BAD_VALUE.search(value):
        return f"bad value for field {name[:64]!r}"
    return None


def _integer(block: bytes, at: int, prefix: int) -> tuple[int, int]:
    mask = (1 << prefix) - 1
    value = block[at] & mask
    at += 1
    if value < mask:
        return value, at
    shift = 0
    while True:
        byte = block[at]
        at += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at
        if shift > 28:
            raise H2ConnectionError("HPACK integer too large", ErrorCode.COMPRESSION_ERROR)


# -- HPACK: the server's fixed header blocks -----------------------------------------------------------

_STATUS_200: Final = b"\x88"  # static index 8
_CONTENT_TYPE_INDEX: Final = 31


def _encode_integer(value: int, prefix: int, first: int = 0) -> bytes:
    mask = (1 << prefix) - 1
    if value < mask:
        return bytes([first | value])
    out = bytearray([first | mask])
    value -= mask
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal_string(raw: bytes) -> bytes:
    return _encode_integer(len(raw), 7) + raw


def encode_literal(name: bytes | int, value: bytes) -> bytes:
    """A literal field without indexing, its name a static index or a string."""
    if isinstance(name, int):
        return _encode_integer(name, 4) + _literal_string(value)
    return b"\x00" + _literal_string(name) + _literal_string(value)


RESPONSE_HEADERS: Final = _STATUS_200 + encode_literal(_CONTENT_TYPE_INDEX, b"application/grpc")


def trailers(status: int, message: str = "") -> bytes:
    """The trailer block ending a call: grpc-status, and grpc-message percent-encoded as gRPC asks."""
    if status == 0 and not message:
        return _OK_TRAILERS
    block = encode_literal(b"grpc-status", str(status).encode())
    if message:
        block += encode_literal(
            b"grpc-message", quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode()
        )
    return block


def trailers_only(status: int, message: str = "") -> bytes:
    """A call answered by its status alone (one HEADERS frame that ends the stream)."""
    return RESPONSE_HEADERS + trailers(status, message)


_OK_TRAILERS: Final = encode_literal(b"grpc-status", b"0")
