"""The codec's fast path and the reference it stands for give the same bytes, the same messages and the same
errors (type, reason and message) on every registered type and on the omittable-field classes of
tests/test_codec_omitted.py: generated messages at their bounds, messages with one hostile field at any depth,
non-canonical spellings of valid messages, omitted fields written at their default and mutated bytes."""

from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode.protocol._codec_fast import DECLINED, fast_decode, fast_encode
from swarmnode.protocol.codec import (
    FieldSpec,
    decode,
    encode,
    reference_decode,
    reference_encode,
    schema,
    to_wire,
)
from swarmnode.protocol.envelope import Envelope
from swarmnode.protocol.errors import Reason
from swarmnode.protocol.messages import MESSAGE_TYPES
from tests.test_codec_omitted import OMITTING

CLASSES = [*MESSAGE_TYPES.values(), Envelope, *OMITTING]
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BIG_EDGE = 1 << 17  # bytes fields up to this cap are also drawn at their cap exactly
INT_EDGES = (0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63, 2**64 - 1)


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _value(spec: FieldSpec, at_cap: bool = True) -> st.SearchStrategy[Any]:
    """Valid values of one field, its bounds' edges drawn often (a str or bytes at its cap if `at_cap`)."""
    kind = spec.kind
    if kind == "int":
        near = (spec.lo, spec.hi, spec.lo + 1, spec.hi - 1)
        edges = [x for x in (*INT_EDGES, *near) if spec.lo <= x <= spec.hi]
        return st.sampled_from(edges) | st.integers(spec.lo, spec.hi)
    if kind == "bool":
        return st.booleans()
    if kind == "float":
        return st.floats(allow_nan=False, allow_infinity=False)
    cap = spec.max_len or 0
    if kind == "str":
        if spec.pattern is not None:
            text = st.from_regex(spec.pattern, fullmatch=True)
        else:
            text = st.text(max_size=min(cap, 40))
            if at_cap:
                text |= st.just("a" * cap) | st.just("é" * (cap // 2))
        return text.filter(lambda t: _utf8_len(t) <= cap)
    if kind == "bytes":
        if spec.size is not None:
            return st.binary(min_size=spec.size, max_size=spec.size)
        edge = st.just(bytes(cap)) if at_cap and cap <= BIG_EDGE else st.nothing()
        return st.binary(max_size=min(cap, 300)) | edge
    if kind == "message":
        assert spec.message_cls is not None
        return st.deferred(lambda: message_of(spec.message_cls))  # type: ignore[arg-type]
    assert kind == "tuple" and spec.item is not None
    item = _value(spec.item, at_cap=False)
    few = st.lists(_value(spec.item), max_size=min(cap, 4)).map(tuple)
    if spec.item.kind in ("message", "tuple"):
        return few | (st.lists(item, min_size=cap, max_size=cap).map(tuple) if cap <= 16 else st.nothing())
    return few | item.map(lambda v: (v,) * cap)  # at MaxLen: one value repeated, cheap to draw


def _field(spec: FieldSpec) -> st.SearchStrategy[Any]:
    """Valid values of a field; an omittable one often at its default, so that it is left out."""
    return st.just(spec.default) | _value(spec) if spec.omittable else _value(spec)


def message_of(cls: type) -> st.SearchStrategy[Any]:
    return st.tuples(*(_field(spec) for spec in schema(cls))).map(lambda values: cls(*values))


def _outcome(fn: Any, *args: Any) -> tuple[Any, ...]:
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 - the outcome is compared whole: type and message
        return ("raised", type(exc), str(exc))


@given(data=st.data())
@SETTINGS
def test_fast_path_takes_and_matches_every_valid_message(data: st.DataObject) -> None:
    cls = data.draw(st.sampled_from(CLASSES))
    message = data.draw(message_of(cls))
    encoded = reference_encode(message)
    assert fast_encode(message) == encoded  # taken: the fast path does not decline a valid message
    if len(encoded) > cls.MAX_SIZE:  # valid fields, too big a whole: refused before either decoder
        assert _outcome(decode, cls, encoded) == _outcome(reference_decode, cls, encoded)
        return
    assert fast_decode(cls, encoded) == message == reference_decode(cls, encoded)
    assert encode(message) == encoded and decode(cls, encoded) == message
    trailing = encoded + b"\x00"
    with pytest.raises(DECLINED):
        fast_decode(cls, trailing)
    assert _outcome(decode, cls, trailing) == _outcome(reference_decode, cls, trailing)


# --- hostile values ------------------------------------------------------------------------------

HOSTILE = st.sampled_from([
    True, False, 0, 1, -1, 2**64, 1.5, math.nan, math.inf, -0.0, "", "x", "\ud800", b"", b"x", None, (), [],
    (1,), [1], (True,), (-1,), (2**64,), (1.5,), ("x",), (b"x",), ((),), Reason.OVERSIZED, object(),
])


def _edge(spec: FieldSpec) -> st.SearchStrategy[Any]:
    """Values just past a field's bounds, or of a wrong kind built from its own edges."""
    cap = spec.max_len or 0
    if spec.kind == "int":
        return st.sampled_from([spec.lo - 1, spec.hi + 1, float(spec.lo), bool(spec.lo)])
    if spec.kind == "str":
        return st.sampled_from(["a" * (cap + 1), "é" * (cap // 2 + 1), "\ud800" * (cap // 3 + 1), "A B"])
    if spec.kind == "bytes":
        sizes = [cap + 1] + ([spec.size - 1] if spec.size else [])
        return st.sampled_from([bytes(n) for n in sizes if n <= BIG_EDGE + 1] or [bytearray(1)])
    if spec.kind == "tuple":
        assert spec.item is not None
        item = _value(spec.item, at_cap=False)
        if spec.item.kind in ("message", "tuple"):  # cap + 1 copies of a nested value: walking them is the
            # cost (4097 groups of 65536 tokens each took minutes and 8 GB in a fresh-database CI run)
            return st.lists(item, min_size=cap + 1, max_size=cap + 1).map(tuple) if cap <= 16 else HOSTILE
        return item.map(lambda v: (v,) * (cap + 1)) if cap <= 4096 else HOSTILE
    return HOSTILE


def _spoil(message: Any, draw: Any) -> Any:
    """One field of the message, or of a message nested in it, replaced by a hostile value."""
    specs = schema(type(message))
    if not specs:
        return message
    spec = draw(st.sampled_from(specs))
    value = getattr(message, spec.name)
    if spec.kind == "message" and draw(st.booleans()):
        return dataclasses.replace(message, **{spec.name: _spoil(value, draw)})
    if spec.kind == "tuple" and value and spec.item and spec.item.kind == "message" and draw(st.booleans()):
        i = draw(st.integers(0, len(value) - 1))
        items = (*value[:i], _spoil(value[i], draw), *value[i + 1 :])
        return dataclasses.replace(message, **{spec.name: items})
    if spec.kind == "tuple" and value and draw(st.booleans()):  # one hostile item among valid ones
        i = draw(st.integers(0, len(value) - 1))
        items = (*value[:i], draw(HOSTILE | _edge(spec.item)), *value[i + 1 :])  # type: ignore[arg-type]
        return dataclasses.replace(message, **{spec.name: items})
    return dataclasses.replace(message, **{spec.name: draw(HOSTILE | _edge(spec))})


@given(data=st.data())
@SETTINGS
def test_hostile_message_gets_the_reference_error(data: st.DataObject) -> None:
    cls = data.draw(st.sampled_from(CLASSES))
    message = _spoil(data.draw(message_of(cls)), data.draw)
    assert _outcome(encode, message) == _outcome(reference_encode, message)


@given(data=st.data())
@SETTINGS
def test_hostile_wire_value_gets_the_reference_error(data: st.DataObject) -> None:
    """Well-formed msgpack whose message holds one hostile value: same message or same Reject."""
    cls = data.draw(st.sampled_from(CLASSES))
    message = _spoil(data.draw(message_of(cls)), data.draw)
    try:
        wire = msgpack.packb(to_wire(message), use_bin_type=True)
    except (TypeError, ValueError, OverflowError):  # not representable in msgpack at all
        return
    assert _outcome(decode, cls, wire) == _outcome(reference_decode, cls, wire)


# --- non-canonical spellings ---------------------------------------------------------------------

def _loose(value: Any, draw: Any) -> bytes:
    """A msgpack encoding of `value` in which any header may take a longer form than it needs, floats may be
    float32 and maps may repeat, drop or reorder a key: what a careless or hostile encoder writes."""
    longer = draw(st.booleans()) and draw(st.booleans())  # a quarter of the headers

    def head(n: int, fix: int | None, fix_cap: int, forms: tuple[tuple[int, int], ...]) -> bytes:
        if fix is not None and n < fix_cap and not longer:
            return bytes([fix | n])
        fitting = [(code, width) for code, width in forms if n < 1 << (8 * width)]
        code, width = fitting[-1] if longer else fitting[0]
        return bytes([code]) + n.to_bytes(width, "big")

    if isinstance(value, bool) or value is None:
        return msgpack.packb(value)
    if isinstance(value, int):
        if 0 <= value < 128 and not longer:
            return bytes([value])
        if value < 0:
            return msgpack.packb(value)
        return head(value, None, 0, ((0xCC, 1), (0xCD, 2), (0xCE, 4), (0xCF, 8)))
    if isinstance(value, float):
        if longer and abs(value) < 3e38:  # float32 where it can hold the value at all
            return b"\xca" + struct.pack(">f", value)
        return b"\xcb" + struct.pack(">d", value)
    if isinstance(value, str):
        raw = value.encode("utf-8", "surrogatepass")
        return head(len(raw), 0xA0, 32, ((0xD9, 1), (0xDA, 2), (0xDB, 4))) + raw
    if isinstance(value, bytes):
        return head(len(value), None, 0, ((0xC4, 1), (0xC5, 2), (0xC6, 4))) + value
    if isinstance(value, (list, tuple)):
        return head(len(value), 0x90, 16, ((0xDC, 2), (0xDD, 4))) + b"".join(_loose(v, draw) for v in value)
    assert isinstance(value, dict)
    items = list(value.items())
    if items and draw(st.integers(0, 7)) == 0:
        change = draw(st.sampled_from(["repeat", "drop", "swap", "extra"]))
        i = draw(st.integers(0, len(items) - 1))
        if change == "repeat":
            items.insert(i, items[i])
        elif change == "drop":
            del items[i]
        elif change == "swap":
            items[i], items[-1] = items[-1], items[i]
        else:
            items.insert(i, ("zz", 0))
    body = b"".join(_loose(k, draw) + _loose(v, draw) for k, v in items)
    return head(len(items), 0x80, 16, ((0xDE, 2), (0xDF, 4))) + body


@given(data=st.data())
@SETTINGS
def test_non_canonical_spelling_gets_the_reference_error(data: st.DataObject) -> None:
    cls = data.draw(st.sampled_from(CLASSES))
    message = data.draw(message_of(cls))
    spelled = _loose(to_wire(message), data.draw)
    assert _outcome(decode, cls, spelled) == _outcome(reference_decode, cls, spelled)
    if spelled == reference_encode(message):
        assert decode(cls, spelled) == message


def _defaults_written(message: Any, draw: Any) -> tuple[dict[str, Any], bool]:
    """The message's wire map with some of its omitted fields written at their default, at any depth, and
    whether any was: each one so written makes the map non-canonical."""
    kept = to_wire(message).keys()
    wire, written = {}, False
    for spec in schema(type(message)):
        value, deeper = getattr(message, spec.name), False
        if spec.kind == "message":
            value, deeper = _defaults_written(value, draw)
        elif spec.kind == "tuple" and spec.item is not None and spec.item.kind == "message":
            pairs = [_defaults_written(item, draw) for item in value]
            value, deeper = [w for w, _ in pairs], any(d for _, d in pairs)
        if spec.name in kept or draw(st.booleans()):
            wire[spec.name] = value
            written |= deeper or spec.name not in kept
    return wire, written


@given(data=st.data())
@SETTINGS
def test_an_omitted_field_written_at_its_default_gets_the_reference_error(data: st.DataObject) -> None:
    cls = data.draw(st.sampled_from(CLASSES))
    message = data.draw(message_of(cls))
    wire, written = _defaults_written(message, data.draw)
    encoded = msgpack.packb(wire, use_bin_type=True)
    outcome = _outcome(decode, cls, encoded)
    assert outcome == _outcome(reference_decode, cls, encoded)
    if written and len(encoded) <= cls.MAX_SIZE:
        assert outcome[0] == "raised" and "holds its default: omit it" in outcome[2]
    elif not written:
        assert encoded == reference_encode(message)


@given(data=st.data())
@SETTINGS
def test_mutated_bytes_get_the_reference_outcome(data: st.DataObject) -> None:
    cls = data.draw(st.sampled_from(CLASSES))
    encoded = bytearray(reference_encode(data.draw(message_of(cls))))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(encoded)))
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if op == "flip" and i < len(encoded):
            encoded[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "insert":
            encoded[i:i] = bytes([data.draw(st.integers(0, 255))])
        elif op == "delete":
            del encoded[i : i + 1]
        else:
            del encoded[i:]
    mutated = bytes(encoded)
    assert _outcome(decode, cls, mutated) == _outcome(reference_decode, cls, mutated)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_fast_path_declines_what_it_does_not_read(cls: type) -> None:
    """Faults the fast path never names: each declines, and the public decoder names it as the reference."""
    hostile = (b"", b"\xc1", b"\x80\x00", b"\x91" * 2000 + b"\xc0", b"\xdf\xff\xff\xff\xff", bytearray(1))
    for data in hostile:
        with pytest.raises(DECLINED):
            fast_decode(cls, data)
        assert _outcome(decode, cls, data) == _outcome(reference_decode, cls, data)
        assert _outcome(decode, cls, data)[0] == "raised"
