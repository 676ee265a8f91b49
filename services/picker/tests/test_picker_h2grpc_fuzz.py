"""Fuzzing the native server's parsers, in the test suite's time: hypothesis properties for the frame
decoder, the HPACK decoder and the gRPC body parser; each atheris target (bench/fuzz/targets.py) for a
few thousand coverage-guided runs; and every crash atheris ever found, replayed.

``make fuzz`` runs the atheris targets for FUZZ_SECONDS each.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest
from hpack import Encoder
from hypothesis import given
from hypothesis import strategies as st
from test_picker_h2grpc_protocol import Peer

from pointsman_picker.h2grpc import wire
from pointsman_picker.h2grpc.wire import FrameType, H2ConnectionError, HeaderDecoder

FUZZ = Path(__file__).resolve().parents[3] / "bench" / "fuzz"
sys.path.insert(0, str(FUZZ))
import targets  # noqa: E402

CRASHES = sorted((FUZZ / "crashes").glob("*"))


@pytest.mark.parametrize("crash", CRASHES, ids=[c.name for c in CRASHES])
def test_every_crash_atheris_found_stays_fixed(crash):
    targets.run(crash.name.split("-")[0], crash.read_bytes())


@pytest.mark.parametrize("target", targets.TARGETS)
def test_each_atheris_target_runs_clean_for_a_few_thousand_inputs(target, tmp_path):
    done = subprocess.run(
        [sys.executable, str(FUZZ / "targets.py"), target, "-runs=3000", "-seed=1", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "DONE" in done.stderr


# -- hypothesis -------------------------------------------------------------------------------------------
frame_kinds = st.sampled_from([*range(10), 0x42])
a_frame = st.builds(
    lambda kind, flags, stream_id, payload: wire.frame(kind, flags, stream_id, payload),
    frame_kinds,
    st.integers(0, 255),
    st.sampled_from([0, 1, 2, 3, 5, 2**31 - 1]),
    st.binary(max_size=64),
)


@given(st.lists(a_frame, max_size=30), st.integers(1, 64))
def test_any_frames_end_in_an_answer_never_an_exception(frames, cut):
    targets.run("frames", bytes([cut]) + b"".join(frames))


fields = st.lists(
    st.tuples(
        st.text(st.characters(codec="ascii", categories=["Ll", "Nd"]), min_size=1, max_size=20),
        st.text(st.characters(codec="ascii", min_codepoint=0x21, max_codepoint=0x7E), max_size=200),
    ),
    max_size=20,
)


@given(st.lists(fields, min_size=1, max_size=5), st.booleans())
def test_hpack_blocks_from_a_real_encoder_decode_to_what_was_encoded(blocks, huffman):
    encoder, decoder = Encoder(), HeaderDecoder()
    for block in blocks:
        decoded = decoder.decode(encoder.encode(block, huffman=huffman))
        assert decoded == [(n.encode(), v.encode()) for n, v in block]
        assert decoder.malformed is None


@given(st.binary(max_size=300))
def test_any_bytes_as_a_header_block_decode_or_raise_a_compression_error(block):
    with contextlib.suppress(H2ConnectionError):
        HeaderDecoder().decode(block)


@given(st.lists(st.binary(max_size=3000), max_size=6), st.lists(st.integers(1, 500), min_size=1, max_size=20))
def test_messages_arrive_whole_however_the_body_is_cut(messages, cuts):
    peer = Peer()
    peer.connect()
    body = b"".join(wire.grpc_message(m) for m in messages)
    frames = [peer.headers(1)]
    at, i = 0, 0
    while at < len(body):
        step = cuts[i % len(cuts)]
        frames.append(peer.data(1, body[at : at + step]))
        at, i = at + step, i + 1
    frames.append(wire.frame(FrameType.DATA, wire.END_STREAM, 1))
    answered = peer.send(*frames)
    echoed, trailers = peer.call_result(answered, 1)
    assert peer.calls.messages == [m for m in messages if m != b"fail"]
    assert trailers[b"grpc-status"] == b"0"
    assert echoed == body


@given(st.binary(max_size=2000))
def test_any_body_bytes_end_the_call_cleanly(data):
    targets.run("body", data)
