"""The HTTP/2 + HPACK + gRPC framing codecs, against RFC 7541's own examples where it has them."""

from __future__ import annotations

import random

import pytest

from pointsman_picker.h2grpc import wire
from pointsman_picker.h2grpc.wire import ErrorCode, FrameType, H2ConnectionError, HeaderDecoder


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


# RFC 7541 C.3 (no Huffman) and C.4 (Huffman): three requests on one connection, so each block also
# checks the dynamic table the earlier ones left.
_REQUESTS = [
    [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"), (b":authority", b"www.example.com")],
    [
        (b":method", b"GET"),
        (b":scheme", b"http"),
        (b":path", b"/"),
        (b":authority", b"www.example.com"),
        (b"cache-control", b"no-cache"),
    ],
    [
        (b":method", b"GET"),
        (b":scheme", b"https"),
        (b":path", b"/index.html"),
        (b":authority", b"www.example.com"),
        (b"custom-key", b"custom-value"),
    ],
]


@pytest.mark.parametrize(
    "blocks",
    [
        pytest.param(
            [
                "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
                "8286 84be 5808 6e6f 2d63 6163 6865",
                "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
            ],
            id="C.3 literals",
        ),
        pytest.param(
            [
                "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
                "8286 84be 5886 a8eb 1064 9cbf",
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
            ],
            id="C.4 Huffman",
        ),
    ],
)
def test_rfc7541_request_examples(blocks):
    decoder = HeaderDecoder()
    assert [decoder.decode(h(block)) for block in blocks] == _REQUESTS


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (
            "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",
            (b"custom-key", b"custom-header"),
        ),
        ("040c 2f73 616d 706c 652f 7061 7468", (b":path", b"/sample/path")),  # without indexing
        ("1008 7061 7373 776f 7264 0673 6563 7265 74", (b"password", b"secret")),  # never indexed
        ("82", (b":method", b"GET")),
    ],
)
def test_rfc7541_single_fields(block, expected):
    assert HeaderDecoder().decode(h(block)) == [expected]


def test_only_incremental_literals_enter_the_table():
    decoder = HeaderDecoder()
    decoder.decode(h("040c 2f73 616d 706c 652f 7061 7468"))  # without indexing
    with pytest.raises(H2ConnectionError):
        decoder.decode(h("be"))  # index 62: the (empty) dynamic table


def test_old_entries_are_evicted_past_the_table_size():
    decoder = HeaderDecoder(max_table_size=60)  # room for one 1-byte name + 26-byte value entry
    decoder.decode(h("4001 61") + bytes([26]) + b"a" * 26)
    decoder.decode(h("4001 62") + bytes([26]) + b"b" * 26)
    assert decoder.decode(h("be")) == [(b"b", b"b" * 26)]
    with pytest.raises(H2ConnectionError):
        decoder.decode(h("bf"))


@pytest.mark.parametrize(
    ("block", "why"),
    [
        ("80", "index 0"),
        ("ff00", "index past both tables"),
        ("3fe21f", "table size update above the limit"),
        ("410f77", "string past the block"),
        ("41", "truncated"),
        ("ffffffffff7f", "integer too large"),
        ("4181ff", "bad Huffman padding"),
    ],
)
def test_malformed_blocks_are_compression_errors(block, why):
    with pytest.raises(H2ConnectionError) as raised:
        HeaderDecoder().decode(h(block))
    assert raised.value.code is ErrorCode.COMPRESSION_ERROR, why


@pytest.mark.parametrize(
    ("status", "message", "expected"),
    [
        (0, "", [(b"grpc-status", b"0")]),
        (13, "internal error", [(b"grpc-status", b"13"), (b"grpc-message", b"internal error")]),
        (3, "50% ü", [(b"grpc-status", b"3"), (b"grpc-message", b"50%25 %C3%BC")]),
    ],
)
def test_trailers_decode_to_status_and_percent_encoded_message(status, message, expected):
    assert HeaderDecoder().decode(wire.trailers(status, message)) == expected


def test_a_trailers_only_answer_carries_status_and_content_type():
    assert HeaderDecoder().decode(wire.trailers_only(12, "no")) == [
        (b":status", b"200"),
        (b"content-type", b"application/grpc"),
        (b"grpc-status", b"12"),
        (b"grpc-message", b"no"),
    ]


def test_long_values_use_multi_byte_lengths():
    message = "x" * 300
    [_, (name, value)] = HeaderDecoder().decode(wire.trailers(2, message))
    assert (name, value) == (b"grpc-message", message.encode())


def test_frames_round_trip():
    raw = wire.frame(FrameType.HEADERS, wire.END_HEADERS | wire.END_STREAM, 7, b"abc")
    assert wire.frame_header(raw, 0) == (3, FrameType.HEADERS, 0x5, 7)
    assert raw[wire.FRAME_HEADER_BYTES :] == b"abc"
    big = wire.frame(FrameType.DATA, 0, 1, b"z" * 70_000)
    assert wire.frame_header(big, 0)[0] == 70_000


def test_the_stream_ids_reserved_bit_is_ignored():
    raw = bytearray(wire.frame(FrameType.DATA, 0, 5))
    raw[5] |= 0x80
    assert wire.frame_header(raw, 0)[3] == 5


def test_settings_round_trip_and_reject_a_torn_payload():
    raw = wire.settings_frame({wire.Setting.INITIAL_WINDOW_SIZE: 10, wire.Setting.MAX_FRAME_SIZE: 16_384})
    payload = raw[wire.FRAME_HEADER_BYTES :]
    assert list(wire.parse_settings(payload)) == [(4, 10), (5, 16_384)]
    with pytest.raises(H2ConnectionError):
        list(wire.parse_settings(payload[:5]))


@pytest.mark.parametrize(
    ("payload", "flags", "expected"),
    [
        (b"abc", 0, b"abc"),
        (b"\x02abcXX", wire.PADDED, b"abc"),
        (b"\x00", wire.PADDED, b""),
    ],
)
def test_unpad(payload, flags, expected):
    assert wire.unpad(payload, flags) == expected


def test_padding_longer_than_the_frame_is_a_protocol_error():
    with pytest.raises(H2ConnectionError):
        wire.unpad(b"\x05ab", wire.PADDED)


def test_grpc_messages_are_length_prefixed():
    raw = wire.grpc_message(b"hello")
    assert raw == b"\x00\x00\x00\x00\x05hello"
    assert wire.grpc_prefix(raw, 0) == (0, 5)


def test_blocks_from_an_independent_encoder_decode_to_what_it_encoded():
    # hpack's own encoder as the peer: indexing, eviction from a small table, Huffman, never-indexed
    # values, and the same Huffman literal again and again (the decoder caches those).
    from hpack import Encoder
    from hpack.struct import NeverIndexedHeaderTuple

    encoder = Encoder()
    encoder.header_table_size = 256
    decoder = HeaderDecoder()
    rng = random.Random(7)
    for i in range(300):
        fields = [(b":method", b"POST"), (b":path", b"/envoy.service.ext_proc.v3.ExternalProcessor/Process")]
        fields += [
            (f"x-h{rng.randrange(40)}".encode(), f"v{rng.randrange(10 ** rng.randrange(1, 8))}".encode())
        ]
        fields.append(NeverIndexedHeaderTuple(b"x-request-id", f"rid-{i}".encode()))
        assert decoder.decode(encoder.encode(fields)) == [tuple(f) for f in fields]
