"""Conformance cases for identity, Merkle trees, the canonical codec and the signed envelope.

Each generator yields vector dicts `{name, kind, input, expect}`; `scripts/gen_vectors.py` writes
them to spec/vectors/, and tests/conformance replays both the live cases and the committed files.
Invalid cases outnumber valid ones on purpose: the reasons are the contract.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator
from typing import Any

import msgpack

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.crypto.signing import _SECP256K1_N
from swarmnode.protocol import ledger_messages as lm
from swarmnode.protocol import messages as m
from swarmnode.protocol.codec import encode, to_wire
from swarmnode.protocol.envelope import ENVELOPE_VERSION, REPLAY_WINDOW, Envelope, seal, signing_digest
from swarmnode.protocol.errors import Reason
from swarmnode.protocol.wire_conformance import check_codec, check_envelope, check_identity, check_merkle
from tests.conformance.keys import NOW_MS, RUN, vector_identity
from tests.conformance.samples import every_message

Vector = dict[str, Any]


def _h(data: bytes) -> str:
    return "0x" + data.hex()


def _case(name: str, kind: str, inp: dict[str, Any], expect: dict[str, Any]) -> Vector:
    return {"name": name, "kind": kind, "input": inp, "expect": expect}


def _reject(reason: Reason) -> dict[str, Any]:
    verdict = "ignore" if reason.error_class == "ignore" else "reject"
    return {"verdict": verdict, "reason": int(reason)}


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


# --- identity and Merkle -------------------------------------------------------------------------

def identity_cases() -> Iterator[Vector]:
    keys = [("key-one", (1).to_bytes(32, "big")), ("key-n-minus-one", (_SECP256K1_N - 1).to_bytes(32, "big"))]
    keys += [(f"vector-key-{n}", vector_identity(n).private_key) for n in range(1, 4)]
    for name, key in keys:
        inp = {"private_key": _h(key)}
        yield _case(f"identity/{name}", "identity", inp, check_identity(inp))


def merkle_cases() -> Iterator[Vector]:
    for size in (0, 1, 2, 3, 5, 7, 8):
        inp = {"leaves": [_h(bytes([i]) * (i + 1)) for i in range(size)]}
        yield _case(f"merkle/{size}-leaves", "merkle", inp, check_merkle(inp))


# --- codec ---------------------------------------------------------------------------------------

def _codec(name: str, type_name: str, data: bytes, expect: dict[str, Any] | None = None) -> Vector:
    inp = {"type": type_name, "bytes": _h(data)}
    return _case(f"codec/{name}", "codec", inp, expect if expect is not None else check_codec(inp))


def codec_cases() -> Iterator[Vector]:
    for message in every_message():
        yield _codec(f"valid/{message.TYPE}", message.TYPE, encode(message))

    verdict = next(x for x in every_message() if isinstance(x, m.Verdict))
    wire = to_wire(verdict)
    good = encode(verdict)
    items = list(wire.items())

    yield _codec("invalid/truncated", "verdict", good[:-3], _reject(Reason.UNDECODABLE))
    yield _codec("invalid/empty", "verdict", b"", _reject(Reason.UNDECODABLE))
    yield _codec("invalid/trailing-bytes", "verdict", good + b"\x00", _reject(Reason.TRAILING_BYTES))
    yield _codec("invalid/not-a-map", "verdict", _pack(list(wire.values())), _reject(Reason.WRONG_FIELD_TYPE))
    yield _codec("invalid/unknown-field", "verdict", _pack({**wire, "extra": 1}),
                 _reject(Reason.UNKNOWN_FIELD))
    missing = dict(items[:-1])
    yield _codec("invalid/missing-field", "verdict", _pack(missing), _reject(Reason.MISSING_FIELD))
    swapped = dict([items[1], items[0], *items[2:]])
    yield _codec("invalid/wrong-field-order", "verdict", _pack(swapped), _reject(Reason.FIELD_ORDER))
    yield _codec("invalid/str-for-int", "verdict", _pack({**wire, "step": "7"}),
                 _reject(Reason.WRONG_FIELD_TYPE))
    yield _codec("invalid/bool-for-int", "verdict", _pack({**wire, "step": True}),
                 _reject(Reason.WRONG_FIELD_TYPE))
    yield _codec("invalid/int-for-float", "verdict", _pack({**wire, "mean_mant_err": 3}),
                 _reject(Reason.WRONG_FIELD_TYPE))
    yield _codec("invalid/str-for-bytes", "verdict", _pack({**wire, "worker": "0x" + "11" * 20}),
                 _reject(Reason.WRONG_FIELD_TYPE))
    yield _codec("invalid/negative-int", "verdict", _pack({**wire, "step": -1}), _reject(Reason.OUT_OF_RANGE))
    yield _codec("invalid/int-above-range", "verdict", _pack({**wire, "reason_code": 1000}),
                 _reject(Reason.OUT_OF_RANGE))
    register = next(x for x in every_message() if isinstance(x, lm.RegisterRun))
    yield _codec("invalid/challenge-window-above-bound", register.TYPE,
                 _pack({**to_wire(register), "challenge_window_epochs": lm.MAX_CHALLENGE_WINDOW_EPOCHS + 1}),
                 _reject(Reason.OUT_OF_RANGE))
    yield _codec("invalid/nan-float", "verdict", _pack({**wire, "mean_mant_err": float("nan")}),
                 _reject(Reason.OUT_OF_RANGE))
    yield _codec("invalid/short-address", "verdict", _pack({**wire, "worker": b"\x01" * 19}),
                 _reject(Reason.OUT_OF_RANGE))
    yield _codec("invalid/oversized-field", "verdict", _pack({**wire, "detail": "x" * 513}),
                 _reject(Reason.OVERSIZED))
    yield _codec("invalid/too-many-items", "verdict", _pack({**wire, "failing_chunks": list(range(4097))}),
                 _reject(Reason.OVERSIZED))
    yield _codec("invalid/bad-run-id", "verdict", _pack({**wire, "run": "Run With Spaces"}),
                 _reject(Reason.OUT_OF_RANGE))
    yield _codec("invalid/oversized-message", "ping", _pack({"nonce": b"\x00" * 200}),
                 _reject(Reason.OVERSIZED))
    yield _codec("invalid/duplicate-key", "ping",
                 b"\x82\xa5nonce\xc4\x08" + b"\x00" * 8 + b"\xa5nonce\xc4\x08" + b"\x01" * 8,
                 _reject(Reason.NON_CANONICAL))
    long_int = b"\x81\xa5nonce\xc4\x08" + b"\x00" * 8
    yield _codec("valid/ping-minimal", "ping", long_int)
    step_pos = good.index(b"\xa4step") + 5
    non_minimal = good[:step_pos] + b"\xcf" + (7).to_bytes(8, "big") + good[step_pos + 1:]
    yield _codec("invalid/non-minimal-int", "verdict", non_minimal, _reject(Reason.NON_CANONICAL))
    ext = _pack({**wire, "detail": msgpack.ExtType(1, b"x")})
    yield _codec("invalid/ext-type", "verdict", ext, _reject(Reason.UNDECODABLE))
    bad_utf8 = good.replace(b"TOPLOC", b"TOP\xffOC")
    yield _codec("invalid/bad-utf8", "verdict", bad_utf8, _reject(Reason.UNDECODABLE))
    nested = to_wire(next(x for x in every_message() if isinstance(x, m.RunDescriptor)))
    nested["grpo"] = {**nested["grpo"], "surprise": 1}
    yield _codec("invalid/unknown-nested-field", "run_descriptor", _pack(nested),
                 _reject(Reason.UNKNOWN_FIELD))
    yield from _structure_cases(wire, good)


def _structure_cases(wire: dict[str, Any], good: bytes) -> Iterator[Vector]:
    """Frames a decoder must refuse from a type byte or a declared length, before building the value."""
    yield _codec("invalid/array-of-empty-maps", "verdict", b"\xdc\x10\x00" + b"\x80" * 4096,
                 _reject(Reason.WRONG_FIELD_TYPE))
    yield _codec("invalid/declared-array-beyond-input", "verdict", b"\xdd\xff\xff\xff\xff\x80",
                 _reject(Reason.UNDECODABLE))
    yield _codec("invalid/declared-bin-beyond-input", "verdict", b"\xc6\xff\xff\xff\xff",
                 _reject(Reason.UNDECODABLE))
    yield _codec("invalid/nesting-beyond-stack", "verdict", b"\x91" * 5000 + b"\xc0",
                 _reject(Reason.UNDECODABLE))
    yield _codec("invalid/container-for-int", "verdict", _pack({**wire, "step": [[]] * 16}),
                 _reject(Reason.WRONG_FIELD_TYPE))
    yield _codec("invalid/map-for-str", "verdict", _pack({**wire, "detail": {"a": 1}}),
                 _reject(Reason.WRONG_FIELD_TYPE))
    yield _codec("invalid/array-in-int-tuple", "verdict", _pack({**wire, "failing_chunks": [1, [2], 3]}),
                 _reject(Reason.WRONG_FIELD_TYPE))
    yield _codec("invalid/map-in-int-tuple", "verdict", _pack({**wire, "failing_chunks": [{}]}),
                 _reject(Reason.WRONG_FIELD_TYPE))
    yield _codec("invalid/declared-items-over-cap", "verdict",
                 good.replace(b"\xaefailing_chunks\x93", b"\xaefailing_chunks\xdd\xff\xff\xff\xff", 1),
                 _reject(Reason.UNDECODABLE))  # framing first: the input ends long before 2^32 items
    yield _codec("invalid/long-key", "verdict", _pack({**wire, "k" * 100: 1}), _reject(Reason.UNKNOWN_FIELD))
    yield _codec("invalid/bin-key", "verdict", _pack({b"run": wire["run"]}), _reject(Reason.UNKNOWN_FIELD))
    yield _codec("invalid/int-key", "verdict", _pack({1: wire["run"]}), _reject(Reason.UNDECODABLE))
    yield _codec("invalid/more-keys-than-fields", "ping",
                 b"\x83" + (b"\xa5nonce\xc4\x08" + b"\x00" * 8) * 3, _reject(Reason.NON_CANONICAL))
    map16 = b"\xde\x00" + bytes([good[0] & 0x0F]) + good[1:]
    yield _codec("invalid/map16-for-small-map", "verdict", map16, _reject(Reason.NON_CANONICAL))
    step_pos = good.index(b"\xa4step") + 5
    int16 = _pack({**wire, "step": 300})
    # 300 as int16: the size of uint16, not canonical
    int16 = int16[:step_pos] + b"\xd1" + int16[step_pos + 1 :]
    yield _codec("invalid/int16-for-uint16", "verdict", int16, _reject(Reason.NON_CANONICAL))
    float32 = good.replace(b"\xcb" + struct.pack(">d", 12.5), b"\xca" + struct.pack(">f", 12.5), 1)
    yield _codec("invalid/float32", "verdict", float32, _reject(Reason.NON_CANONICAL))


# --- envelope ------------------------------------------------------------------------------------

def _sealed_with(identity: NodeIdentity, message: Any, *, seq: int, ts: int = NOW_MS, run: str = RUN,
                 sign_type: str | None = None, sign_run: str | None = None, sender: bytes | None = None,
                 version: int = ENVELOPE_VERSION, label: str | None = None) -> bytes:
    """Seal with optional deliberate faults (domain, run or sender differing from what is signed)."""
    body = encode(message)
    sender = sender or identity.address
    digest = signing_digest(sign_type or message.TYPE, sign_run or run, sender, seq, ts, body)
    envelope = Envelope(version, label or message.TYPE, run, sender, seq, ts, body, identity.sign(digest))
    return encode(envelope)


def _env(name: str, envelope: bytes, expect: dict[str, Any] | None = None, *, before: list[bytes] = (),
         run: str = RUN, now_ms: int = NOW_MS) -> Vector:
    inp = {"run": run, "now_ms": now_ms, "envelope": _h(envelope), "accepted_before": [_h(b) for b in before]}
    return _case(f"envelope/{name}", "envelope", inp, expect if expect is not None else check_envelope(inp))


def envelope_cases() -> Iterator[Vector]:
    alice, bob = vector_identity(1), vector_identity(2)
    samples = every_message()
    for seq, message in enumerate(samples, start=1):
        yield _env(f"valid/{message.TYPE}", seal(alice, message, run=RUN, seq=seq, ts=NOW_MS))

    verdict = next(x for x in samples if isinstance(x, m.Verdict))
    good = seal(alice, verdict, run=RUN, seq=100, ts=NOW_MS)
    yield _env("valid/out-of-order-seq", seal(alice, verdict, run=RUN, seq=99, ts=NOW_MS), before=[good])

    flipped = bytearray(good)
    flipped[-10] ^= 0x01
    yield _env("invalid/bad-signature", bytes(flipped), _reject(Reason.BAD_SIGNATURE))
    yield _env("invalid/wrong-domain", _sealed_with(alice, verdict, seq=100, sign_type="submit_ack"),
               _reject(Reason.BAD_SIGNATURE))
    yield _env("invalid/signed-for-other-run", _sealed_with(alice, verdict, seq=100, sign_run="other-run"),
               _reject(Reason.BAD_SIGNATURE))
    yield _env("invalid/sender-not-signer", _sealed_with(alice, verdict, seq=100, sender=bob.address),
               _reject(Reason.BAD_SIGNATURE))
    yield _env("invalid/replayed-seq", good, _reject(Reason.REPLAYED_SEQ), before=[good])
    yield _env("invalid/seq-below-window", seal(alice, verdict, run=RUN, seq=100, ts=NOW_MS),
               _reject(Reason.REPLAYED_SEQ),
               before=[seal(alice, verdict, run=RUN, seq=100 + REPLAY_WINDOW, ts=NOW_MS)])
    yield _env("invalid/wrong-run", good, _reject(Reason.WRONG_RUN), run="another-run")
    yield _env("invalid/clock-skew", good, _reject(Reason.CLOCK_SKEW), now_ms=NOW_MS + 10 * 60 * 1000)
    yield _env("invalid/unknown-type", _sealed_with(alice, verdict, seq=100, label="mystery"),
               _reject(Reason.UNKNOWN_TYPE))
    hello = next(x for x in samples if isinstance(x, m.Hello))
    yield _env("invalid/type-label-mismatch", _sealed_with(alice, hello, seq=100, label="submit_ack"),
               _reject(Reason.BAD_SIGNATURE))
    yield _env("invalid/body-over-type-cap", _sealed_with(alice, verdict, seq=100, label="ping"),
               _reject(Reason.OVERSIZED))
    yield _env("invalid/unsupported-version", _sealed_with(alice, verdict, seq=100, version=2),
               _reject(Reason.UNSUPPORTED_VERSION))
    yield _env("invalid/truncated", good[:-1], _reject(Reason.UNDECODABLE))
    env = dataclasses.asdict(_decode_env(good))
    r, s, v = env["sig"][:32], int.from_bytes(env["sig"][32:64], "big"), env["sig"][64]
    high_s = r + (_SECP256K1_N - s).to_bytes(32, "big") + bytes([55 - v])
    yield _env("invalid/high-s-signature", _pack({**env, "sig": high_s}), _reject(Reason.BAD_SIGNATURE))
    yield _env("invalid/short-signature", _pack({**env, "sig": env["sig"][:64]}),
               _reject(Reason.OUT_OF_RANGE))
    big_body = _pack({"nonce": b"\x00" * 200})
    digest = signing_digest("ping", RUN, alice.address, 5, NOW_MS, big_body)
    oversized = encode(Envelope(1, "ping", RUN, alice.address, 5, NOW_MS, big_body, alice.sign(digest)))
    yield _env("invalid/oversized-body", oversized, _reject(Reason.OVERSIZED))
    bad_body = _pack({"nonce": b"\x00" * 7})
    digest = signing_digest("ping", RUN, alice.address, 6, NOW_MS, bad_body)
    malformed = encode(Envelope(1, "ping", RUN, alice.address, 6, NOW_MS, bad_body, alice.sign(digest)))
    yield _env("invalid/signed-malformed-body", malformed, _reject(Reason.OUT_OF_RANGE))
    # the clock and the replay window are checked before the body is decoded
    yield _env("invalid/stale-malformed-body", malformed, _reject(Reason.CLOCK_SKEW),
               now_ms=NOW_MS + 10 * 60 * 1000)
    digest = signing_digest("ping", RUN, alice.address, 100, NOW_MS, bad_body)
    replayed_bad = encode(Envelope(1, "ping", RUN, alice.address, 100, NOW_MS, bad_body, alice.sign(digest)))
    yield _env("invalid/replayed-seq-malformed-body", replayed_bad, _reject(Reason.REPLAYED_SEQ),
               before=[good])
    structure = _pack({"v": 1, "type": [{}] * 64})
    yield _env("invalid/container-for-header-field", structure, _reject(Reason.WRONG_FIELD_TYPE))


def _decode_env(data: bytes) -> Envelope:
    from swarmnode.protocol.codec import decode

    return decode(Envelope, data)


SUITES = {
    "identity": identity_cases,
    "merkle": merkle_cases,
    "codec": codec_cases,
    "envelope": envelope_cases,
}
