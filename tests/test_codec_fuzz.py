"""Every decoder is total: random and mutated bytes give a message or a typed Reject/Ignore, nothing else."""

from __future__ import annotations

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode.protocol.codec import decode, encode
from swarmnode.protocol.envelope import Envelope, ReplayWindow, open_envelope, seal
from swarmnode.protocol.errors import ProtocolError
from swarmnode.protocol.messages import MESSAGE_TYPES
from tests.conformance.keys import NOW_MS, RUN, vector_identity
from tests.conformance.samples import every_message

SAMPLES = every_message()
ENCODED = [encode(s) for s in SAMPLES]
SEALED = [seal(vector_identity(1), s, run=RUN, seq=i, ts=NOW_MS) for i, s in enumerate(SAMPLES)]
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decode_all(data: bytes) -> None:
    for cls in MESSAGE_TYPES.values():
        try:
            decode(cls, data)
        except ProtocolError:
            pass
    try:
        open_envelope(data, run=RUN, now_ms=NOW_MS, replay=ReplayWindow())
    except ProtocolError:
        pass


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes(data):
    _decode_all(data)


def _mutate(data: bytes, draw) -> bytes:
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, max(len(buf) - 1, 0)))
        if op == "flip" and buf:
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            buf[pos:pos] = bytes([draw(st.integers(0, 255))])
        elif op == "delete" and buf:
            del buf[pos]
        elif op == "truncate":
            del buf[pos:]
    return bytes(buf)


@FUZZ
@given(st.data())
def test_mutated_messages(data):
    original = data.draw(st.sampled_from(ENCODED + SEALED))
    _decode_all(_mutate(original, data.draw))


json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)


@FUZZ
@given(json_like)
def test_arbitrary_msgpack_structures(value):
    _decode_all(msgpack.packb(value, use_bin_type=True))


def test_deep_nesting_is_rejected_not_crashing():
    _decode_all(b"\x91" * 100_000 + b"\xc0")


def test_huge_declared_length_does_not_allocate():
    _decode_all(b"\xc6\xff\xff\xff\xff")  # bin32 claiming 4 GiB
    _decode_all(b"\xdd\xff\xff\xff\xff")  # array32 claiming 4 billion items


def test_every_sample_roundtrips_through_its_envelope():
    replay = ReplayWindow()
    for sample, sealed in zip(SAMPLES, SEALED, strict=True):
        opened = open_envelope(sealed, run=RUN, now_ms=NOW_MS, replay=replay)
        assert opened.message == sample
        assert isinstance(opened.envelope, Envelope)
