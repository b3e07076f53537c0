"""Authenticate before allocate: hostile frames cost a small multiple of their size and end in a typed Reject.

Peak heap is measured with tracemalloc around one decode (the frame itself is allocated before).
Two bounds (spec/wire.md, "Decoding limits"):
- a frame whose *structure* is hostile (containers where the schema has none, huge declared lengths,
  deep nesting) peaks at K_STRUCTURE x its size: the decoder refuses at the first misplaced type byte
  (2 x: msgpack's own copy of the buffer plus the body bytes of an envelope);
- a frame valid up to its last field costs what the decoded message costs, K_VALUE x its size at
  most (Python ints for token ids: ~36 bytes per 3-byte uint16).
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.protocol.codec import decode, to_wire
from swarmnode.protocol.envelope import Envelope, open_envelope, signing_digest
from swarmnode.protocol.errors import Reason, Reject
from swarmnode.protocol.messages import RolloutSubmission
from swarmnode.protocol.types import MIB
from tests.conformance.keys import NOW_MS, RUN, vector_identity
from tests.conformance.samples import rollout_submission

K_STRUCTURE = 2.5
K_VALUE = 16.0
SLACK = 256 * 1024  # fixed cost of one decode (unpacker, schema caches), independent of the frame
FRAME = 16 * MIB - 64


def _peak(fn: Callable[[], Any]) -> tuple[int, BaseException | None]:
    gc.collect()
    tracemalloc.start()
    error: BaseException | None = None
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - returned to the caller, which asserts its type
        error = exc
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, error


def _array32(n: int) -> bytes:
    return b"\xdd" + n.to_bytes(4, "big")


def _submission_wire() -> dict[str, Any]:
    return to_wire(rollout_submission(groups=1, group_size=1))


def _with_completions(completion: dict[str, Any], count: int) -> bytes:
    wire = _submission_wire()
    wire["groups"][0]["completions"] = [completion] * count
    return msgpack.packb(wire, use_bin_type=True)


def _completion(**fields: Any) -> dict[str, Any]:
    return {**_submission_wire()["groups"][0]["completions"][0], "logprobs": b"", "proofs": [], **fields}


HOSTILE_STRUCTURES = {
    "array of empty maps": _array32(FRAME) + b"\x80" * FRAME,
    "array of empty arrays": _array32(FRAME) + b"\x90" * FRAME,
    "map of empty keys": b"\xdf" + (FRAME // 2).to_bytes(4, "big") + b"\xa0\x90" * (FRAME // 2),
    "deep nesting": b"\x91" * FRAME + b"\xc0",
    "huge declared array": b"\xdd\xff\xff\xff\xff",
    "huge declared bin": b"\xc6\xff\xff\xff\xff",
    "token ids of nested arrays": _with_completions(_completion(token_ids=[[]] * 65536), FRAME // 65700),
    "token ids of negative ints": _with_completions(_completion(token_ids=[-32] * 65536), FRAME // 65700),
    "proofs of maps": _with_completions(_completion(proofs=[{}] * 2048), FRAME // 2200),
}


@pytest.mark.parametrize("name", list(HOSTILE_STRUCTURES))
@pytest.mark.parametrize("cls", [Envelope, RolloutSubmission])
def test_hostile_structure_costs_a_small_multiple_of_the_frame(name: str, cls: type) -> None:
    data = HOSTILE_STRUCTURES[name]
    peak, error = _peak(lambda: decode(cls, data, max_size=len(data)))
    assert isinstance(error, Reject), error
    assert error.reason.error_class == "malformed"
    assert peak <= K_STRUCTURE * len(data) + SLACK, f"{name}: {peak / max(len(data), 1):.1f} x the frame"


def test_a_frame_valid_until_its_last_field_costs_at_most_its_decoded_message() -> None:
    ids = list(range(300, 300 + 65536))  # uint16 token ids: the costliest valid ints per byte
    good = _completion(token_ids=ids)
    wire = _submission_wire()
    wire["groups"][0]["completions"] = [good] * 9 + [_completion(token_ids=[*ids[:-1], -1])]
    data = msgpack.packb(wire, use_bin_type=True)
    peak, error = _peak(lambda: decode(RolloutSubmission, data))
    assert isinstance(error, Reject) and error.reason == Reason.OUT_OF_RANGE
    assert peak <= K_VALUE * len(data) + SLACK, f"{peak / len(data):.1f} x the frame"


def test_a_signed_envelope_with_a_hostile_body_is_refused_cheaply() -> None:
    """The body is decoded only after the signature: a free identity signs 16 MiB of nested arrays."""
    alice = vector_identity(1)
    body = HOSTILE_STRUCTURES["token ids of nested arrays"]
    digest = signing_digest("rollout_submission", RUN, alice.address, 1, NOW_MS, body)
    env = to_wire(Envelope(1, "rollout_submission", RUN, alice.address, 1, NOW_MS, body, alice.sign(digest)))
    data = msgpack.packb(env, use_bin_type=True)
    peak, error = _peak(lambda: open_envelope(data, run=RUN, now_ms=NOW_MS, replay=None))
    assert isinstance(error, Reject) and error.reason == Reason.WRONG_FIELD_TYPE
    assert peak <= K_STRUCTURE * len(data) + SLACK, f"{peak / len(data):.1f} x the frame"


_atoms = st.sampled_from(
    [b"\x80", b"\x90", b"\x91\x90", b"\x81\xa0\x90", b"\xe0", b"\xc0", b"\xa0", b"\xc4\x00"]
)


@settings(max_examples=15, deadline=None)
@given(st.lists(_atoms, min_size=1, max_size=6), st.sampled_from([Envelope, RolloutSubmission]))
def test_any_run_of_small_objects_is_refused_within_the_bound(pattern: list[bytes], cls: type) -> None:
    unit = b"".join(pattern)
    count = MIB // len(unit)
    map32 = b"\xdf" + count.to_bytes(4, "big") + (b"\xa0" + unit) * count
    for data in (_array32(count) + unit * count, map32):
        peak, error = _peak(lambda: decode(cls, data, max_size=len(data)))  # noqa: B023 - called at once
        assert isinstance(error, Reject), error
        assert peak <= K_STRUCTURE * len(data) + SLACK
