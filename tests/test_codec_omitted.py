"""Fields marked `OmitWhenDefault()`: trailing fields written only when they differ from their default, so
that a message can grow a field without changing the bytes of any message that leaves it at its default.
The reference codec and its fast path agree on them (tests/test_codec_fast.py runs its generated and hostile
messages over the classes here too); these are the cases that pin the rules down."""

from __future__ import annotations

import dataclasses
import linecache
from dataclasses import dataclass, make_dataclass
from typing import Annotated, Any, ClassVar

import msgpack
import pytest

from swarmnode.protocol._codec_fast import DECLINED, encoder, fast_decode, fast_encode, reader
from swarmnode.protocol.codec import (
    MaxLen,
    OmitWhenDefault,
    Range,
    Size,
    decode,
    encode,
    reference_decode,
    reference_encode,
    schema,
    to_json,
    unpack_limits,
)
from swarmnode.protocol.errors import Reason, Reject


@dataclass(frozen=True)
class Span:
    MAX_SIZE: ClassVar[int] = 1024

    start: int
    length: Annotated[int, Range(1, 100)]


@dataclass(frozen=True)
class Base:
    """A message as first released."""

    MAX_SIZE: ClassVar[int] = 4096

    name: Annotated[str, MaxLen(16)]
    count: int


@dataclass(frozen=True)
class Grown:
    """`Base` grown by three omittable fields: an int, a tuple of messages and a str."""

    MAX_SIZE: ClassVar[int] = 4096

    name: Annotated[str, MaxLen(16)]
    count: int
    level: Annotated[int, Range(0, 9), OmitWhenDefault()] = 0
    spans: Annotated[tuple[Span, ...], MaxLen(3), OmitWhenDefault()] = ()
    note: Annotated[str, MaxLen(8), OmitWhenDefault()] = ""


@dataclass(frozen=True)
class Outer:
    """Omittable fields nested (in `grown` and `many`) and of every other kind, with defaults other than
    zero: a fixed-size bin, a message, a non-empty tuple, a bool and a float."""

    MAX_SIZE: ClassVar[int] = 1 << 16

    grown: Grown
    many: Annotated[tuple[Grown, ...], MaxLen(2)]
    tag: Annotated[bytes, Size(2), OmitWhenDefault()] = b"ab"
    span: Annotated[Span, OmitWhenDefault()] = Span(0, 1)
    pair: Annotated[tuple[int, ...], MaxLen(4), OmitWhenDefault()] = (1, 2)
    flag: Annotated[bool, OmitWhenDefault()] = False
    ratio: Annotated[float, OmitWhenDefault()] = 0.5


@dataclass(frozen=True)
class AllOmittable:
    """No required field at all: the empty map is a message."""

    MAX_SIZE: ClassVar[int] = 1024

    a: Annotated[int, OmitWhenDefault()] = 0
    b: Annotated[str, MaxLen(8), OmitWhenDefault()] = "x"


# 15 required fields and 2 omittable ones: 15 keys take a fixmap header, 16 and 17 a map16 one.
Wide = make_dataclass(
    "Wide",
    [(f"f{i:02}", int) for i in range(15)]
    + [(name, Annotated[int, OmitWhenDefault()], dataclasses.field(default=0)) for name in ("x", "y")],
    frozen=True,
    namespace={"MAX_SIZE": 4096},
)

OMITTING = [Span, Base, Grown, Outer, AllOmittable, Wide]


def _rejected(cls: type, data: bytes) -> Reject:
    """The public decoder's Reject, checked to be the reference's, the fast path having declined."""
    with pytest.raises(DECLINED):
        fast_decode(cls, data)
    with pytest.raises(Reject) as public:
        decode(cls, data)
    with pytest.raises(Reject) as reference:
        reference_decode(cls, data)
    assert str(public.value) == str(reference.value)
    return public.value


def _taken(message: Any) -> bytes:
    """The message's bytes, checked to take the fast path both ways and to read back as the message."""
    data = reference_encode(message)
    assert fast_encode(message) == data == encode(message)
    assert fast_decode(type(message), data) == message == reference_decode(type(message), data)
    assert decode(type(message), data) == message
    return data


# --- bytes ---------------------------------------------------------------------------------------

def test_at_their_defaults_the_grown_message_has_the_old_bytes() -> None:
    old = _taken(Base("a", 7))
    assert _taken(Grown("a", 7)) == old
    assert decode(Base, old) == Base("a", 7) and decode(Grown, old) == Grown("a", 7)


@pytest.mark.parametrize("changes, written", [
    ({"level": 3}, {"level": 3}),
    ({"spans": (Span(5, 6),)}, {"spans": [{"start": 5, "length": 6}]}),
    ({"note": "hi"}, {"note": "hi"}),
    ({"level": 9, "note": "z"}, {"level": 9, "note": "z"}),
    ({"level": 1, "spans": (Span(0, 1), Span(2, 3)), "note": "n"},
     {"level": 1, "spans": [{"start": 0, "length": 1}, {"start": 2, "length": 3}], "note": "n"}),
])
def test_a_field_off_its_default_is_written_after_the_others(
    changes: dict[str, Any], written: dict[str, Any]
) -> None:
    message = Grown("a", 7, **changes)
    assert _taken(message) == msgpack.packb({"name": "a", "count": 7, **written})
    assert to_json(message) == {"name": "a", "count": 7, **written}  # no bytes here: JSON is the wire map


def test_every_omittable_kind_round_trips_on_and_off_its_default() -> None:
    inner = Grown("b", 0, level=2)
    plain = Outer(inner, (Grown("c", 1), inner))
    assert msgpack.unpackb(_taken(plain)).keys() == {"grown", "many"}
    for changes in ({"tag": b"xy"}, {"span": Span(0, 2)}, {"pair": ()}, {"pair": (2, 1)}, {"flag": True},
                    {"ratio": 0.0}, {"tag": b"zz", "ratio": -1.5}):
        message = dataclasses.replace(plain, **changes)
        assert msgpack.unpackb(_taken(message)).keys() == {"grown", "many", *changes}
    assert _taken(AllOmittable()) == b"\x80"
    assert _taken(AllOmittable(b="")) == msgpack.packb({"b": ""})


def test_a_list_at_a_tuple_default_is_left_out_like_the_tuple() -> None:
    """The wire does not tell a list from a tuple: either at the default is left out, by both encoders."""
    for message, same in ((Grown("a", 1, spans=[]), Grown("a", 1)),  # type: ignore[arg-type]
                          (Outer(Grown("a", 1), (), pair=[1, 2]), Outer(Grown("a", 1), ()))):  # type: ignore[arg-type]
        assert fast_encode(message) == reference_encode(message) == encode(same)
        assert to_json(message) == to_json(same)


def test_fields_with_a_default_but_no_marker_are_always_written() -> None:
    @dataclass(frozen=True)
    class Plain:
        a: int
        b: int = 0

    assert encode(Plain(1)) == msgpack.packb({"a": 1, "b": 0})
    assert _rejected(Plain, msgpack.packb({"a": 1})).reason is Reason.MISSING_FIELD


@pytest.mark.parametrize("keys", [15, 16, 17])
def test_a_map_of_sixteen_keys_or_more_round_trips(keys: int) -> None:
    extra = {"x": 1, "y": 2} if keys == 17 else {"y": 2} if keys == 16 else {}
    message = Wide(*range(15), **extra)
    data = _taken(message)
    assert len(msgpack.unpackb(data)) == keys
    assert data[0] == (0x8F if keys == 15 else 0xDE)
    if keys == 15:  # the same map under a longer header than it needs
        fault = _rejected(Wide, b"\xde\x00\x0f" + data[1:])
        assert fault.reason is Reason.NON_CANONICAL


# --- faults --------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, default", [("level", 0), ("spans", []), ("note", "")])
def test_a_field_written_at_its_default_is_not_canonical(field: str, default: Any) -> None:
    data = msgpack.packb({"name": "a", "count": 7, field: default})
    fault = _rejected(Grown, data)
    assert fault.reason is Reason.NON_CANONICAL
    assert fault.detail == f"Grown.{field}: holds its default: omit it"


@pytest.mark.parametrize("field, default", [
    ("tag", b"ab"), ("span", {"start": 0, "length": 1}), ("pair", [1, 2]), ("flag", False), ("ratio", 0.5),
])
def test_a_default_other_than_zero_written_is_not_canonical(field: str, default: Any) -> None:
    grown = {"name": "a", "count": 1}
    data = msgpack.packb({"grown": grown, "many": [], field: default}, use_bin_type=True)
    fault = _rejected(Outer, data)
    assert fault.reason is Reason.NON_CANONICAL
    assert fault.detail == f"Outer.{field}: holds its default: omit it"


def test_a_nested_default_written_is_named_where_it_is() -> None:
    grown = {"name": "a", "count": 1}
    data = msgpack.packb({"grown": grown, "many": [grown, {**grown, "note": ""}]})
    fault = _rejected(Outer, data)
    assert fault.reason is Reason.NON_CANONICAL
    assert fault.detail == "Outer.many[1].note: holds its default: omit it"


def test_the_empty_map_is_the_message_of_no_required_field() -> None:
    assert fast_decode(AllOmittable, b"\x80") == AllOmittable() == reference_decode(AllOmittable, b"\x80")
    assert _rejected(AllOmittable, msgpack.packb({"b": "x"})).reason is Reason.NON_CANONICAL


def _pairs(*items: tuple[str, Any]) -> bytes:
    """A map written key by key: repeated keys and any order."""
    body = b"".join(msgpack.packb(k) + msgpack.packb(v) for k, v in items)
    return bytes([0x80 | len(items)]) + body


@pytest.mark.parametrize("items, reason, detail", [
    ([("name", "a"), ("level", 3)], Reason.MISSING_FIELD, "missing field(s) count"),
    ([("name", "a")], Reason.MISSING_FIELD, "missing field(s) count"),
    ([("count", 1), ("level", 3)], Reason.MISSING_FIELD, "missing field(s) name"),
    ([("name", "a"), ("count", 1), ("level", 3), ("zz", 0)], Reason.UNKNOWN_FIELD, "unknown field 'zz'"),
    ([("name", "a"), ("count", 1), ("zz", 0), ("level", 3)], Reason.UNKNOWN_FIELD, "unknown field 'zz'"),
    ([("name", "a"), ("count", 1), ("zz", 0)], Reason.UNKNOWN_FIELD, "unknown field 'zz'"),
    ([("nome", "a"), ("count", 1)], Reason.UNKNOWN_FIELD, "unknown field 'nome'"),
    ([("nome", "a"), ("count", 1), ("level", 3)], Reason.UNKNOWN_FIELD, "unknown field 'nome'"),
    ([("name", "a"), ("count", 1), ("note", "x"), ("level", 3)], Reason.FIELD_ORDER,
     "fields out of order: ['name', 'count', 'note', 'level']"),
    ([("name", "a"), ("level", 3), ("count", 1)], Reason.FIELD_ORDER,
     "fields out of order: ['name', 'level', 'count']"),
    ([("count", 1), ("name", "a")], Reason.FIELD_ORDER, "fields out of order: ['count', 'name']"),
    ([("name", "a"), ("count", 1), ("level", 3), ("level", 4)], Reason.NON_CANONICAL, "duplicate field"),
    ([("name", "a"), ("count", 1), ("note", "x"), ("note", "x")], Reason.NON_CANONICAL, "duplicate field"),
    ([("name", "a"), ("count", 1), ("level", 0), ("zz", 0)], Reason.NON_CANONICAL,
     "holds its default: omit it"),  # the first fault in wire order
    ([("name", "a"), ("count", 1), ("level", 10)], Reason.OUT_OF_RANGE, "10 outside [0, 9]"),
    ([("name", "a"), ("count", 1), ("note", 5)], Reason.WRONG_FIELD_TYPE, "expected str, got int"),
])
def test_key_faults_keep_their_reasons(items: list[tuple[str, Any]], reason: Reason, detail: str) -> None:
    fault = _rejected(Grown, _pairs(*items))
    assert fault.reason is reason and fault.detail.endswith(detail)


def test_a_map_longer_than_every_field_is_refused() -> None:
    items = [("name", "a"), ("count", 1), ("level", 3), ("spans", []), ("note", "x"), ("note", "y")]
    assert _rejected(Grown, _pairs(*items)).reason is Reason.NON_CANONICAL  # spans at its default first
    items[3] = ("spans", [{"start": 1, "length": 1}])
    fault = _rejected(Grown, _pairs(*items))
    assert (fault.reason, fault.detail) == (Reason.NON_CANONICAL, "Grown: duplicate field")


def test_a_key_left_over_in_a_nested_map_is_not_taken_by_the_map_around_it() -> None:
    """The last nested message's header counts a third key after its two fields, `tag`, which is also the
    outer map's next omittable key. The nested map owns it, so the outer map is one key short: truncated,
    not an Outer whose tag is b"xy"."""
    grown = msgpack.packb({"name": "a", "count": 1})
    nested = bytes([grown[0] + 1]) + grown[1:]  # a header of three keys over two fields...
    tail = msgpack.packb("tag") + msgpack.packb(b"xy", use_bin_type=True)  # ...and the third key after them
    data = b"\x83" + msgpack.packb("grown") + grown + msgpack.packb("many") + b"\x91" + nested + tail
    fault = _rejected(Outer, data)
    assert (fault.reason, fault.detail) == (Reason.UNDECODABLE, "not canonical msgpack: OutOfData")
    framed = data + msgpack.packb("flag") + msgpack.packb(True)  # the outer map's third key
    fault = _rejected(Outer, framed)
    assert (fault.reason, fault.detail) == (Reason.UNKNOWN_FIELD, "Outer.many[0]: unknown field 'tag'")


def test_an_unusual_spelling_of_an_omittable_key_is_refused_by_the_reference() -> None:
    """A str8 key for a short name is not the key the fast path looks for: it declines, the reference
    names the long form."""
    data = msgpack.packb({"name": "a", "count": 1}) + b"\xd9\x05level\x03"
    data = bytes([data[0] + 1]) + data[1:]
    assert _rejected(Grown, data).reason is Reason.NON_CANONICAL


# --- schema ----------------------------------------------------------------------------------------

def test_an_omittable_field_needs_a_plain_default() -> None:
    @dataclass(frozen=True)
    class NoDefault:
        a: Annotated[int, OmitWhenDefault()]

    @dataclass(frozen=True)
    class Factory:
        a: Annotated[tuple[int, ...], OmitWhenDefault()] = dataclasses.field(default_factory=tuple)

    for cls in (NoDefault, Factory):
        with pytest.raises(TypeError, match="needs a plain default"):
            schema(cls)


def test_an_omittable_default_must_be_a_value_the_field_allows() -> None:
    """A decoder takes the default of an omitted field: one its own constraints refuse is a schema error."""

    @dataclass(frozen=True)
    class IntOutOfRange:
        a: Annotated[int, Range(1, 9), OmitWhenDefault()] = 0

    @dataclass(frozen=True)
    class LongStr:
        a: Annotated[str, MaxLen(2), OmitWhenDefault()] = "abc"

    @dataclass(frozen=True)
    class WrongSize:
        a: Annotated[bytes, Size(2), OmitWhenDefault()] = b""

    @dataclass(frozen=True)
    class TooManyItems:
        a: Annotated[tuple[int, ...], MaxLen(1), OmitWhenDefault()] = (1, 2)

    @dataclass(frozen=True)
    class BadNested:
        a: Annotated[Span, OmitWhenDefault()] = Span(0, 0)

    @dataclass(frozen=True)
    class WrongType:
        a: Annotated[float, OmitWhenDefault()] = 0

    for cls in (IntOutOfRange, LongStr, WrongSize, TooManyItems, BadNested, WrongType):
        with pytest.raises(TypeError, match="is not a value the field allows"):
            schema(cls)


def test_omittable_fields_are_trailing() -> None:
    @dataclass(frozen=True)
    class Between:
        a: Annotated[int, OmitWhenDefault()] = 0
        b: int = 0

    @dataclass(frozen=True)
    class KeywordAfter:
        a: Annotated[int, OmitWhenDefault()] = 0
        b: int = dataclasses.field(kw_only=True)

    for cls in (Between, KeywordAfter):
        with pytest.raises(TypeError, match="follows an omittable field"):
            schema(cls)


def test_the_field_spec_carries_the_marker_and_the_default() -> None:
    specs = {spec.name: spec for spec in schema(Outer)}
    assert not specs["grown"].omittable and specs["grown"].default is None
    assert specs["span"].omittable and specs["span"].default == Span(0, 1)
    assert specs["pair"].omittable and specs["pair"].default == (1, 2)


def test_unpack_limits_count_every_field() -> None:
    assert unpack_limits(Grown).max_map_len == 5 and unpack_limits(Wide).max_map_len == 17


def test_a_class_without_omittable_fields_reads_a_constant_header() -> None:
    """The generated code of a class that has no omittable field is what it was: its map header is
    matched as part of the first key's prefix, never read."""
    encoder(Base)
    reader(Base)
    source = "".join(linecache.cache["<codec read Base>"][2])
    assert "left" not in source and "map_length" not in source
    assert "w = " not in "".join(linecache.cache["<codec encode Base>"][2])
