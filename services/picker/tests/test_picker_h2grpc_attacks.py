"""Each attack of issue #14 replayed against the sans-IO protocol: what the server answers, and that it
stays bounded in what it holds (``buffered_bytes``, ``queued_bytes``, open streams) and in the work a
flood buys (the calls it starts, the frames it reads before it hangs up).

The flood budgets run on the protocol's clock, which these tests hold still (a flood arrives in an
instant) or move (a client keeping to the rate is never cut). The same attacks over real sockets,
against both servers and with a well-behaved client alongside: test_picker_h2grpc_floods.py.
"""

from __future__ import annotations

import time

import pytest
from hpack import Encoder
from test_picker_h2grpc_protocol import ECHO, Calls, Frame, Later, Peer, only

from pointsman_picker.h2grpc import wire
from pointsman_picker.h2grpc.calls import Status
from pointsman_picker.h2grpc.limits import Limits, Rate
from pointsman_picker.h2grpc.wire import END_HEADERS, END_STREAM, ErrorCode, FrameType, Setting

RESOURCE_EXHAUSTED = str(Status.RESOURCE_EXHAUSTED.value).encode()


def goaway(frames: list[Frame]) -> ErrorCode | None:
    found = only(frames, FrameType.GOAWAY)
    return ErrorCode(wire.u32(found[-1].payload, 4)) if found else None


def connected(**limits: object) -> Peer:
    peer = Peer(limits=Limits(**limits))  # type: ignore[arg-type]
    peer.connect()
    return peer


def still_answers(peer: Peer, stream_id: int) -> None:
    frames = peer.send(peer.headers(stream_id), peer.message(stream_id, b"ok", end_stream=True))
    assert peer.call_result(frames, stream_id)[1][b"grpc-status"] == b"0"


# -- a refused message must not take the connection with it ------------------------------------------
@pytest.mark.parametrize(
    ("body", "status"),
    [
        pytest.param(b"\0\xff\xff\xff\xff", Status.RESOURCE_EXHAUSTED, id="a 4 GiB length prefix"),
        pytest.param(b"\1\0\0\0\1z", Status.UNIMPLEMENTED, id="the compressed flag"),
        pytest.param(wire.grpc_message(b"fail"), Status.INTERNAL, id="a message the method fails on"),
    ],
)
def test_a_refused_message_in_the_last_frame_ends_only_its_stream(body, status):
    peer = connected()
    peer.send(peer.headers(1), peer.headers(3), peer.message(3, b"three"))
    frames = peer.send(peer.data(1, body, end_stream=True))
    assert peer.call_result(frames, 1)[1][b"grpc-status"] == str(status.value).encode()
    assert goaway(frames) is None
    frames = peer.send(peer.message(3, b"still", end_stream=True))  # the other call goes on
    body3, trailers = peer.call_result(frames, 3)
    assert body3 == wire.grpc_message(b"still")
    assert trailers[b"grpc-status"] == b"0"


# -- memory --------------------------------------------------------------------------------------------
def test_unfinished_messages_on_many_streams_are_held_within_the_connections_budget():
    # 150 streams each sending most of a big message held 650 MB; now the connection holds at most
    # max_buffered_bytes (plus one message) and refuses the streams past it.
    budget = 1024 * 1024
    peer = Peer(
        max_message_bytes=4 * 1024 * 1024,
        limits=Limits(max_concurrent_streams=200, max_buffered_bytes=budget),
    )
    peer.connect()
    part = wire.grpc_message(b"m" * 400_000)[:300_000]  # a 400 KB message, 300 KB of it sent
    refused = held_most = 0
    for stream_id in range(1, 301, 2):
        frames = peer.send(peer.headers(stream_id), peer.data(stream_id, part))
        held_most = max(held_most, peer.protocol.buffered_bytes)
        for frame in only(frames, FrameType.HEADERS, stream_id):
            fields = dict(peer.decoder.decode(frame.payload, raw=True))
            refused += fields.get(b"grpc-status") == RESOURCE_EXHAUSTED
    assert held_most <= budget + 400_005
    assert refused == 150 - budget // 400_005  # all but the streams that fit
    still_answers(peer, 401)


def test_one_message_larger_than_the_budget_still_fits_when_nothing_else_is_held():
    peer = Peer(max_message_bytes=2 * 1024 * 1024, limits=Limits(max_buffered_bytes=64 * 1024))
    peer.connect()
    message = wire.grpc_message(b"B" * 1_500_000)
    frames = peer.send(peer.headers(1))
    for at in range(0, len(message), 500_000):
        frames += peer.send(peer.data(1, message[at : at + 500_000]))
    assert peer.calls.messages == [b"B" * 1_500_000]


def test_an_unfinished_header_block_is_held_within_its_limit():
    # 200 connections each holding an unfinished header block held 460 MB: each now holds at most
    # max_header_block bytes, and one past it ends the connection.
    peer = connected()
    limit = Limits().max_header_block
    frames = peer.send(wire.frame(FrameType.HEADERS, 0, 1, b"\x40" * 16_000))
    for _ in range(limit // 16_000 + 1):
        frames += peer.send(wire.frame(FrameType.CONTINUATION, 0, 1, b"\x40" * 16_000))
        assert peer.protocol.buffered_bytes <= limit
    assert goaway(frames) is ErrorCode.COMPRESSION_ERROR


def test_the_huffman_cache_is_bounded_in_bytes():
    # 100 distinct 1 MiB Huffman values held 390 MB; the list limit now stops such values, and the
    # cache keeps at most HUFFMAN_CACHE_BYTES of short strings whatever comes.
    encoder = Encoder()
    decoder = wire.HeaderDecoder()
    for i in range(2_000):
        decoder.decode(encoder.encode([(f"x-{i}", f"{i:04d}" * 100)], huffman=True))
        assert decoder.huffman_cache_bytes <= wire.HUFFMAN_CACHE_BYTES


def test_a_header_list_over_the_limit_is_resource_exhausted_and_the_connection_goes_on():
    peer = connected()
    fields = [(":method", "POST"), (":scheme", "http"), (":path", ECHO)] + [
        (f"x-{i}", "v" * 1000) for i in range(20)
    ]
    frames = peer.send(
        wire.frame(FrameType.HEADERS, END_HEADERS | END_STREAM, 1, peer.encoder.encode(fields))
    )
    _, trailers = peer.call_result(frames, 1)
    assert trailers[b"grpc-status"] == RESOURCE_EXHAUSTED
    assert b"header list larger than 16384" in trailers[b"grpc-message"]
    assert peer.calls.streams == []  # the method never saw it
    still_answers(peer, 3)  # and the HPACK table followed the block


def test_an_hpack_bomb_stops_at_the_list_limit():
    # One 4 KB entry in the table, then blocks of single-byte references to it: each block would decode
    # to megabytes; the decoder stops collecting at the limit and the stream is refused.
    peer = connected()
    big = wire.encode_literal(b"x-big", b"b" * 4000)
    first = b"\x40" + big[1:]  # the same literal, with incremental indexing
    peer.send(wire.frame(FrameType.HEADERS, END_HEADERS | END_STREAM, 1, peer.block() + first))
    bomb = b"\xbe" * 16_000  # index 62: the newest entry
    started = time.perf_counter()
    frames = peer.send(wire.frame(FrameType.HEADERS, END_HEADERS | END_STREAM, 3, bomb))
    assert time.perf_counter() - started < 0.5
    assert peer.call_result(frames, 3)[1][b"grpc-status"] == RESOURCE_EXHAUSTED


@pytest.mark.parametrize(
    "updates",
    [
        pytest.param(b"\x82\x3f\xe1\x1f", id="after a field"),
        pytest.param(b"\x20\x20\x20\x82", id="three at the start"),
    ],
)
def test_table_size_updates_only_where_rfc7541_allows_them(updates):
    peer = connected()
    assert (
        goaway(peer.send(wire.frame(FrameType.HEADERS, END_HEADERS, 1, updates)))
        is ErrorCode.COMPRESSION_ERROR
    )


def test_two_table_size_updates_at_the_start_are_fine():
    peer = connected()
    peer.encoder.header_table_size = 0  # the encoder then signals 0 first...
    peer.encoder.header_table_size = 4096  # ...and the final size
    frames = peer.send(peer.headers(1, end_stream=True))
    assert peer.call_result(frames, 1)[1][b"grpc-status"] == b"0"


# -- streams -------------------------------------------------------------------------------------------
def test_streams_past_the_advertised_limit_are_refused():
    # 20,000 concurrent streams were accepted on one connection.
    peer = connected()
    refused = []
    for stream_id in range(1, 2 * 150, 2):
        refused += only(peer.send(peer.headers(stream_id)), FrameType.RST_STREAM, stream_id)
    assert peer.protocol.open_streams == 100
    assert len(refused) == 50
    assert {wire.u32(f.payload) for f in refused} == {ErrorCode.REFUSED_STREAM}


def test_new_streams_beyond_the_per_read_limit_wait_for_the_next_turn():
    peer = connected()
    read = b"".join(peer.headers(i, end_stream=True) for i in range(1, 200, 2))  # 100 calls in one read
    peer.protocol.receive_data(read)
    assert peer.calls.half_closed == 32
    assert peer.protocol.backlog
    while peer.protocol.backlog:
        peer.protocol.receive_data(b"")
    assert peer.calls.half_closed == 100


# -- floods: past the budget, GOAWAY ENHANCE_YOUR_CALM; at the rate, never ------------------------------
def rapid_reset(peer: Peer, stream_id: int) -> bytes:
    return peer.headers(stream_id) + wire.rst_stream(stream_id, ErrorCode.CANCEL)


def empty_continuation(peer: Peer, stream_id: int) -> bytes:
    first = wire.frame(FrameType.HEADERS, 0, stream_id, peer.block()) if stream_id == 1 else b""
    return first + wire.frame(FrameType.CONTINUATION, 0, 1, b"")


FLOODS = {
    "rapid reset": (rapid_reset, "resets"),
    "PING": (lambda p, i: wire.frame(FrameType.PING, 0, 0, i.to_bytes(8, "big")), "pings"),
    "SETTINGS": (lambda p, i: wire.settings_frame({Setting.INITIAL_WINDOW_SIZE: 65_535 + i % 2}), "settings"),
    "empty DATA": (lambda p, i: p.headers(1) * (i == 1) + p.data(1, b""), "empty_frames"),
    "PRIORITY": (lambda p, i: wire.frame(FrameType.PRIORITY, 0, 1, b"\0\0\0\0\x10"), "empty_frames"),
    "unknown frame types": (lambda p, i: wire.frame(0x42, 0, 0, b""), "empty_frames"),
    "made-you-reset (WINDOW_UPDATE of 0)": (
        lambda p, i: p.headers(i) + wire.window_update(i, 0),
        "resets",
    ),
}


@pytest.mark.parametrize(("flood", "budget"), [pytest.param(*v, id=k) for k, v in FLOODS.items()])
def test_a_flood_gets_goaway_enhance_your_calm_at_its_budget(flood, budget):
    rate: Rate = getattr(Limits(), budget)
    peer = connected()
    sent = 0
    frames: list[Frame] = []
    started = time.perf_counter()
    for i in range(1, 2 * (rate.burst + 50), 2):
        frames = peer.send(flood(peer, i))
        sent += 1
        if peer.protocol.closing:
            break
    assert goaway(frames) is ErrorCode.ENHANCE_YOUR_CALM
    assert sent == rate.burst + 1 - (budget == "settings")  # the preface's SETTINGS took one
    assert len(peer.calls.streams) <= rate.burst + 1  # the calls a rapid reset made this side start
    assert time.perf_counter() - started < 2.0


@pytest.mark.parametrize(("flood", "budget"), [pytest.param(*v, id=k) for k, v in FLOODS.items()])
def test_a_client_within_its_rate_is_never_cut(flood, budget):
    rate: Rate = getattr(Limits(), budget)
    peer = connected()
    for i in range(1, 2 * 3 * rate.burst, 2):
        peer.now += 1.0 / rate.per_second  # just within the rate
        peer.send(flood(peer, i))
        assert not peer.protocol.closing


def test_zero_length_continuations_stop_at_the_continuation_limit():
    # 5 M zero-length CONTINUATION frames were accepted (CVE-2024-27316's shape).
    peer = connected()
    frames = peer.send(wire.frame(FrameType.HEADERS, 0, 1, peer.block()))
    for _ in range(Limits().max_continuations + 1):
        frames = peer.send(wire.frame(FrameType.CONTINUATION, 0, 1, b""))
    assert goaway(frames) is ErrorCode.ENHANCE_YOUR_CALM


def test_envoys_reset_after_each_answered_stream_is_not_counted():
    # Envoy ends every ext_proc stream with END_STREAM and RST_STREAM: thousands a second, all free.
    peer = connected(resets=Rate(10, 1.0))
    for stream_id in range(1, 2 * 200, 2):
        peer.send(
            peer.headers(stream_id),
            peer.message(stream_id, b"m", end_stream=True) + wire.rst_stream(stream_id, ErrorCode.CANCEL),
        )
    assert not peer.protocol.closing
    assert peer.calls.half_closed == 200


def test_a_reset_of_a_stream_already_answered_is_not_counted():
    # With response processing on, Envoy keeps the ext_proc stream open past the picker's answers and
    # resets it when the response ends: hundreds a second at load, none of them rapid reset (seen under
    # `make soak` at 450 req/s as GOAWAY ENHANCE_YOUR_CALM and 503s while these were counted).
    peer = connected(resets=Rate(10, 1.0))
    for stream_id in range(1, 2 * 200, 2):
        peer.send(peer.headers(stream_id), peer.message(stream_id, b"m"))  # answered by the echo
        peer.send(wire.rst_stream(stream_id, ErrorCode.CANCEL))
    assert not peer.protocol.closing
    assert peer.calls.cancelled == 200


# -- output the peer does not take ------------------------------------------------------------------------
def test_answers_queued_for_a_peer_granting_no_window_are_capped():
    peer = Peer(limits=Limits(max_queued_bytes=100_000))
    peer.connect({Setting.INITIAL_WINDOW_SIZE: 0})
    frames = peer.send(peer.headers(1))
    for _ in range(200):
        frames = peer.send(peer.message(1, b"q" * 1000))
        assert peer.protocol.queued_bytes <= 100_000 + 1005
        if peer.protocol.closing:
            break
    assert goaway(frames) is ErrorCode.ENHANCE_YOUR_CALM


# -- work per frame --------------------------------------------------------------------------------------
def count_drains(peer: Peer, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    drain = peer.protocol._drain

    def counted(stream: object) -> None:
        calls[0] += 1
        drain(stream)  # type: ignore[arg-type]

    monkeypatch.setattr(peer.protocol, "_drain", counted)
    return calls


def test_connection_window_updates_visit_only_streams_waiting_on_the_connection(monkeypatch):
    # Every connection-level WINDOW_UPDATE walked all open streams (600 frames: 3.7 s with 20,000).
    peer = Peer(method=Later)
    peer.connect({Setting.INITIAL_WINDOW_SIZE: 0})
    for stream_id in range(1, 200, 2):  # 100 streams, each with an answer waiting on its own window
        peer.send(peer.headers(stream_id))
    for stream in peer.calls.streams:
        stream.send(b"waiting")
    drains = count_drains(peer, monkeypatch)
    for _ in range(600):
        peer.send(wire.window_update(0, 1))
    assert drains[0] == 0
    peer.send(wire.window_update(1, 100))  # the stream's own window: that stream, once
    assert drains[0] == 1


def test_a_settings_change_visits_only_streams_waiting_on_their_window(monkeypatch):
    peer = Peer(method=Later)
    peer.connect()
    for stream_id in range(1, 200, 2):
        peer.send(peer.headers(stream_id))
    drains = count_drains(peer, monkeypatch)
    for i in range(50):
        peer.send(wire.settings_frame({Setting.INITIAL_WINDOW_SIZE: 70_000 + i}))  # growing, nothing waits
    assert drains[0] == 0
    assert isinstance(peer.calls, Calls)
