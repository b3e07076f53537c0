"""The generated encoders and readers (protocol/_codec_fast.py) against the reference codec, on shapes the
registry hardly reaches: tuples of every scalar kind at and around the length where the reader switches
from walking items to one msgpack call, items spelled in every msgpack form (canonical, a longer unsigned
form, a signed form of the same length, a bool, a float, a negative), tuples of tuples, and every frozen
dataclass the protocol and ledger packages define. Same bytes, same message, or the same Reject."""

from __future__ import annotations

import dataclasses
import importlib
import math
import pkgutil
import struct
from dataclasses import dataclass
from typing import Annotated, Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from swarmnode import ledger, protocol
from swarmnode.protocol._codec_fast import DECLINED, WALKED_ITEMS, encoder, fast_decode, fast_encode, reader
from swarmnode.protocol.codec import (
    MaxLen,
    Pattern,
    Range,
    Size,
    decode,
    encode,
    reference_decode,
    reference_encode,
    schema,
)
from tests.test_codec_fast import message_of

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LENGTHS = (0, 1, 2, WALKED_ITEMS - 1, WALKED_ITEMS, WALKED_ITEMS + 1, WALKED_ITEMS + 2, 40, 64, 65)


@dataclass(frozen=True)
class Lists:
    """One tuple field of each scalar kind, and a tuple of tuples: the readers' every tuple shape."""

    ints: Annotated[tuple[int, ...], MaxLen(64)]
    ranged: Annotated[tuple[Annotated[int, Range(3, 300)], ...], MaxLen(64)]
    blobs: Annotated[tuple[Annotated[bytes, MaxLen(300)], ...], MaxLen(64)]
    sized: Annotated[tuple[Annotated[bytes, Size(4)], ...], MaxLen(64)]
    floats: Annotated[tuple[float, ...], MaxLen(64)]
    flags: Annotated[tuple[bool, ...], MaxLen(64)]
    names: Annotated[tuple[Annotated[str, MaxLen(40), Pattern("[a-z]*")], ...], MaxLen(64)]
    nested: Annotated[tuple[Annotated[tuple[int, ...], MaxLen(20)], ...], MaxLen(20)]


@dataclass(frozen=True)
class Holder:
    """A message holding messages: one alone and a tuple of them, after scalars of every kind."""

    flag: bool
    score: float
    name: Annotated[str, MaxLen(300)]
    step: Annotated[int, Range(1, 70000)]
    blob: Annotated[bytes, MaxLen(70000)]
    one: Lists
    many: Annotated[tuple[Lists, ...], MaxLen(3)]


@dataclass(frozen=True)
class KeywordOnly:
    """Built by keyword only: the reader declines every input and the reference decides."""

    a: int
    b: int = dataclasses.field(kw_only=True)


@dataclass(frozen=True)
class Empty:
    pass


SYNTHETIC = [Lists, Holder, KeywordOnly, Empty]


def _wire_classes() -> list[type]:
    """Every frozen dataclass in the protocol and ledger packages that has a schema."""
    found: dict[str, type] = {}
    for package in (protocol, ledger):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            for value in vars(module).values():
                if not (isinstance(value, type) and value.__module__ == module.__name__):
                    continue
                if not dataclasses.is_dataclass(value):
                    continue
                try:
                    schema(value)
                except (TypeError, NameError):
                    continue
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[name] for name in sorted(found)]


WIRE_CLASSES = _wire_classes()


def _outcome(fn: Any, *args: Any) -> tuple[Any, ...]:
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 - the outcome is compared whole: type and message
        return ("raised", type(exc), str(exc))


def test_the_registry_is_among_the_classes_found() -> None:
    from swarmnode.protocol.envelope import Envelope
    from swarmnode.protocol.messages import MESSAGE_TYPES

    assert {*MESSAGE_TYPES.values(), Envelope} <= set(WIRE_CLASSES)


@pytest.mark.parametrize("cls", WIRE_CLASSES + SYNTHETIC, ids=lambda cls: cls.__qualname__)
def test_every_class_compiles(cls: type) -> None:
    """Every encoder and reader is generated, and a message of no fields reads back."""
    assert callable(encoder(cls)) and callable(reader(cls))


@given(data=st.data())
@SETTINGS
def test_every_wire_class_takes_the_fast_path(data: st.DataObject) -> None:
    cls = data.draw(st.sampled_from([c for c in WIRE_CLASSES + SYNTHETIC if c is not KeywordOnly]))
    try:
        message = data.draw(message_of(cls))
    except ValueError:  # refused by the class's own __post_init__ (ledger.types.Params): not a message
        reject()
    encoded = reference_encode(message)
    assert fast_encode(message) == encoded
    if len(encoded) <= getattr(cls, "MAX_SIZE", len(encoded)):
        assert fast_decode(cls, encoded) == message == reference_decode(cls, encoded)


def test_keyword_only_classes_decline_and_the_reference_decides() -> None:
    message = KeywordOnly(1, b=2)
    encoded = encode(message)
    assert encoded == reference_encode(message) == msgpack.packb({"a": 1, "b": 2})
    with pytest.raises(DECLINED):
        fast_decode(KeywordOnly, encoded)
    assert decode(KeywordOnly, encoded) == message
    assert decode(Empty, b"\x80") == Empty() and fast_decode(Empty, b"\x80") == Empty()


# --- items in every spelling ---------------------------------------------------------------------

U64 = 2**64 - 1
INTS = st.sampled_from([0, 1, 3, 127, 128, 255, 256, 300, 32767, 32768, 65535, 65536, 2**31, 2**32, U64])


def _uint_forms(x: int) -> list[bytes]:
    """Every msgpack spelling of a non-negative int: canonical first, then longer and signed forms."""
    forms = [msgpack.packb(x)]
    for code, width in ((0xCC, 1), (0xCD, 2), (0xCE, 4), (0xCF, 8)):
        if x < 1 << (8 * width):
            forms.append(bytes([code]) + x.to_bytes(width, "big"))
    for code, width in ((0xD0, 1), (0xD1, 2), (0xD2, 4), (0xD3, 8)):
        if x < 1 << (8 * width - 1):
            forms.append(bytes([code]) + x.to_bytes(width, "big"))
    return list(dict.fromkeys(forms))


def _item_bytes(item: Any, draw: Any) -> bytes:
    """One item as msgpack, an int in any of its forms (mostly canonical)."""
    if type(item) is int and item >= 0 and draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(_uint_forms(item)))
    if type(item) is float and draw(st.integers(0, 3)) == 0 and abs(item) < 3e38:
        return b"\xca" + struct.pack(">f", item)
    return msgpack.packb(item, use_bin_type=True)


def _array_bytes(items: list[Any], draw: Any) -> bytes:
    n = len(items)
    if n < 16 and draw(st.integers(0, 7)):
        head = bytes([0x90 | n])
    else:
        head = b"\xdc" + n.to_bytes(2, "big") if draw(st.integers(0, 7)) else b"\xdd" + n.to_bytes(4, "big")
    return head + b"".join(_item_bytes(item, draw) for item in items)


HOSTILE_ITEMS = st.sampled_from([True, False, -1, 2**64, 1.5, math.inf, "x", b"x", None, 7, 0.0, ""])
VALID_ITEMS = {
    "ints": INTS,
    "ranged": st.integers(3, 300) | st.sampled_from([3, 127, 128, 255, 256, 300]),
    "blobs": st.binary(max_size=300) | st.just(bytes(300)) | st.just(bytes(256)),
    "sized": st.binary(min_size=4, max_size=4),
    "floats": st.floats(allow_nan=False, allow_infinity=False),
    "flags": st.booleans(),
    "names": st.from_regex("[a-z]{0,40}", fullmatch=True),
    "nested": st.lists(INTS, max_size=20).map(tuple),
}
EDGE_ITEMS = {
    "ranged": st.sampled_from([2, 301]),
    "blobs": st.just(bytes(301)),
    "sized": st.sampled_from([b"abc", b"abcde"]),
    "floats": st.sampled_from([math.nan, -math.inf]), "names": st.sampled_from(["A", "a" * 41, "\ud800"]),
    "nested": st.sampled_from([(True,), (-1,), (1.0,), tuple(range(21)), [1]]),
}


def _items(field: str, draw: Any, hostile: bool) -> list[Any]:
    n = draw(st.sampled_from(LENGTHS))
    items = [draw(VALID_ITEMS[field]) for _ in range(min(n, 3))]
    items = (items * n)[:n] if items else []  # long tuples repeat a few drawn values: cheap to draw
    if hostile and items:
        bad = HOSTILE_ITEMS | EDGE_ITEMS.get(field, st.nothing())
        items[draw(st.integers(0, n - 1))] = draw(bad)
    return items


def _lists_fields(draw: Any, hostile: bool) -> dict[str, list[Any]]:
    target = draw(st.sampled_from(list(VALID_ITEMS)))
    return {field: _items(field, draw, hostile and field == target) for field in VALID_ITEMS}


@given(data=st.data())
@SETTINGS
def test_tuples_of_every_kind_encode_like_the_reference(data: st.DataObject) -> None:
    fields = _lists_fields(data.draw, hostile=data.draw(st.booleans()))
    as_tuples = {name: tuple(items) for name, items in fields.items()}
    message = Lists(**as_tuples)
    assert _outcome(encode, message) == _outcome(reference_encode, message)
    if data.draw(st.booleans()):  # lists are accepted where tuples are, and give the same bytes
        as_lists = Lists(**fields)  # type: ignore[arg-type]
        assert _outcome(encode, as_lists) == _outcome(reference_encode, as_lists)


@given(data=st.data())
@SETTINGS
def test_tuples_in_every_spelling_decode_like_the_reference(data: st.DataObject) -> None:
    """Valid or hostile items, each int in any msgpack form: the public decoder gives the reference's
    outcome, and the fast path takes every canonical valid message."""
    fields = _lists_fields(data.draw, hostile=data.draw(st.booleans()))
    try:
        body = b"".join(msgpack.packb(k) + _array_bytes(items, data.draw) for k, items in fields.items())
    except (OverflowError, UnicodeEncodeError):  # 2**64 and a lone surrogate ('\ud800') have no msgpack form
        return
    encoded = bytes([0x80 | len(fields)]) + body
    expected = _outcome(reference_decode, Lists, encoded)
    assert _outcome(decode, Lists, encoded) == expected
    if expected[0] == "ok" and reference_encode(expected[1]) == encoded:
        assert fast_decode(Lists, encoded) == expected[1]


@given(data=st.data())
@SETTINGS
def test_mutated_nested_messages_get_the_reference_outcome(data: st.DataObject) -> None:
    encoded = bytearray(reference_encode(data.draw(message_of(Holder))))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(encoded)))
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "truncate", "set"]))
        if op == "flip" and i < len(encoded):
            encoded[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "set" and i < len(encoded):  # a type byte a reader branches on
            encoded[i] = data.draw(st.sampled_from([0xC2, 0xC3, 0xC4, 0xC5, 0xC6, 0xCB, 0xCC, 0xCD, 0xD1]))
        elif op == "insert":
            encoded[i:i] = bytes([data.draw(st.integers(0, 255))])
        elif op == "delete":
            del encoded[i : i + 1]
        else:
            del encoded[i:]
    mutated = bytes(encoded)
    assert _outcome(decode, Holder, mutated) == _outcome(reference_decode, Holder, mutated)


def test_same_length_signed_ints_are_declined() -> None:
    """int16 256 is as long as uint16 256: only the packed bytes tell them apart, in both reader paths."""
    for n in (1, WALKED_ITEMS + 1):
        canonical = b"\xa4ints" + bytes([0x90 | n] if n < 16 else [0xDC, 0, n]) + b"\xcd\x01\x00" * n
        rest = b"".join(msgpack.packb(name) + b"\x90" for name in list(VALID_ITEMS)[1:])
        good, bad = (b"\x88" + body + rest for body in (canonical, canonical.replace(b"\xcd", b"\xd1")))
        assert fast_decode(Lists, good).ints == (256,) * n
        with pytest.raises(DECLINED):
            fast_decode(Lists, bad)
        assert _outcome(decode, Lists, bad) == _outcome(reference_decode, Lists, bad)
        assert _outcome(decode, Lists, bad)[0] == "raised"
