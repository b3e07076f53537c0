"""The canonical codec's fast path: a plan per message class, compiled once from its schema.

Fast accept, reference reject. A plan accepts exactly what the reference codec in `protocol.codec` accepts,
with exact type checks and bounds held as plain ints; at the first fault, or at anything it does not
handle, it raises one of `DECLINED` and the caller runs the reference, which names the fault (the same
Reject with the same message, in the same precedence). So the plans carry no error text of their own and
the reference stays the one definition of which fault is reported first. tests/test_codec_fast.py holds
the two to the same outputs on generated and hostile messages of every registered type.

Encoding checks each field, then one `msgpack.packb` writes every byte; its `default` hook turns each
nested message into its field map, checking it on the way.

Decoding walks the buffer in wire order like the reference: a value's type byte and declared length are
checked before the value is built (authenticate before allocate). Map headers and keys are compared as
precomputed canonical bytes, scalars are parsed straight from the buffer and only in their shortest form,
and only a tuple of scalars goes through msgpack (one call, stopped at the first nested container like
the reference), checked canonical by packing it again. The message must end exactly at the end of the
buffer, which stands in for the reference's framing pass: the walk never reads past a byte it checked.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import struct
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from operator import countOf
from typing import Any

import msgpack

from swarmnode.protocol._codec_schema import U64_MAX, FieldSpec, cache_per_class, schema, unpack_limits


class Slow(Exception):
    """The fast path declines; the reference codec decides (and names the fault, if there is one)."""


# What the fast path may meet on any input; each means "the reference decides". LookupError: a read past
# the buffer or a type byte with no entry in a header table; struct.error: a float cut short.
DECLINED = (
    Slow, LookupError, ValueError, TypeError, OverflowError, struct.error, msgpack.UnpackException,
    RecursionError,
)

Check = Callable[[Any], None]

# --- encoding ------------------------------------------------------------------------------------


def _scalar_check(spec: FieldSpec) -> Check:
    """Raise Slow unless the value is one the reference's `_check_value` accepts for this scalar spec."""
    kind, isfinite = spec.kind, math.isfinite
    if kind == "int":
        lo, hi = spec.lo, spec.hi

        def check_int(value: Any) -> None:
            if type(value) is not int or not lo <= value <= hi:
                raise Slow

        return check_int
    if kind == "bool":

        def check_bool(value: Any) -> None:
            if type(value) is not bool:
                raise Slow

        return check_bool
    if kind == "float":

        def check_float(value: Any) -> None:
            if type(value) is not float or not isfinite(value):
                raise Slow

        return check_float
    if kind == "str":
        cap, pattern = spec.max_len or 0, spec.pattern
        short = cap // 4  # no code point takes more than 4 bytes in UTF-8: shorter strings fit unencoded

        def check_str(value: Any) -> None:
            if type(value) is not str:
                raise Slow
            if len(value) > short and len(value.encode("utf-8", "surrogatepass")) > cap:
                raise Slow
            if pattern is not None and not pattern.fullmatch(value):
                raise Slow

        return check_str
    if kind == "bytes":
        size, cap = spec.size, spec.max_len or 0

        def check_bytes(value: Any) -> None:
            if type(value) is not bytes or len(value) > cap or size is not None and len(value) != size:
                raise Slow

        return check_bytes
    raise AssertionError(kind)


def _items_check(item: FieldSpec) -> Check:
    """Raise Slow unless every item of a non-empty list or tuple passes `item`, in few C passes."""
    kind = item.kind
    if kind == "int":
        lo, hi = item.lo, item.hi

        def check_ints(values: Any) -> None:
            if countOf(map(type, values), int) != len(values):  # exact ints: no bool, no IntEnum
                raise Slow
            if lo == 0 and hi == U64_MAX:
                array("Q", values)  # OverflowError outside [0, 2**64 - 1]: one C pass for both bounds
            elif min(values) < lo or max(values) > hi:
                raise Slow

        return check_ints
    if kind == "bytes":
        size, cap, kinds = item.size, item.max_len or 0, {bytes}

        def check_bytes(values: Any) -> None:
            if not set(map(type, values)) <= kinds or max(map(len, values)) > cap:
                raise Slow
            if size is not None and set(map(len, values)) != {size}:
                raise Slow

        return check_bytes
    if kind == "float":
        floats, isfinite = {float}, math.isfinite

        def check_floats(values: Any) -> None:
            if not set(map(type, values)) <= floats or not all(map(isfinite, values)):
                raise Slow

        return check_floats
    if kind == "message":
        classes = {item.message_cls}

        def check_messages(values: Any) -> None:  # each item is checked in full as it is packed
            if not set(map(type, values)) <= classes:
                raise Slow

        return check_messages
    one = _tuple_check(item) if kind == "tuple" else _scalar_check(item)

    def check_each(values: Any) -> None:
        for value in values:
            one(value)

    return check_each


def _tuple_check(spec: FieldSpec) -> Check:
    assert spec.item is not None
    cap, items = spec.max_len or 0, _items_check(spec.item)

    def check_tuple(value: Any) -> None:
        if type(value) is not tuple and type(value) is not list or len(value) > cap:
            raise Slow
        if value:
            items(value)

    return check_tuple


def _field_check(spec: FieldSpec) -> Check:
    if spec.kind == "tuple":
        return _tuple_check(spec)
    if spec.kind == "message":
        cls = spec.message_cls

        def check_message(value: Any) -> None:  # checked in full by `wire` when it is packed
            if type(value) is not cls:
                raise Slow

        return check_message
    return _scalar_check(spec)


@dataclass(frozen=True)
class EncodePlan:
    names: tuple[str, ...]
    values: Callable[[Any], tuple[Any, ...]]  # the field values in wire order, in one C call
    checks: tuple[Check, ...]


@cache_per_class
def encode_plan(cls: type) -> EncodePlan:
    specs = schema(cls)
    names = tuple(spec.name for spec in specs)
    if len(names) > 1:
        values: Callable[[Any], tuple[Any, ...]] = operator.attrgetter(*names)
    else:  # attrgetter of one name returns the value itself, not a 1-tuple
        getters = tuple(map(operator.attrgetter, names))

        def values(message: Any) -> tuple[Any, ...]:
            return tuple(get(message) for get in getters)

    return EncodePlan(names, values, tuple(map(_field_check, specs)))


def wire(message: Any) -> dict[str, Any]:
    """The checked field map of one message; nested messages are left to msgpack's `default` hook."""
    plan = encode_plan(type(message))
    values = plan.values(message)
    for check, value in zip(plan.checks, values, strict=True):
        check(value)
    return dict(zip(plan.names, values, strict=True))


def fast_encode(message: Any) -> bytes:
    """The canonical bytes of `message`, or one of DECLINED where the reference must decide."""
    data: bytes = msgpack.packb(wire(message), use_bin_type=True, default=wire)
    return data


# --- decoding ------------------------------------------------------------------------------------

# Header byte -> (bytes of length after it, the least length that needs this form): a longer form than
# the length needs is not canonical.
_STR_HEADS = {0xD9: (1, 32), 0xDA: (2, 256), 0xDB: (4, 65536)}
_BIN_HEADS = {0xC4: (1, 0), 0xC5: (2, 256), 0xC6: (4, 65536)}
_ARRAY_HEADS = {0xDC: (2, 16), 0xDD: (4, 65536)}
_UINT_HEADS = {0xCC: (1, 0x80), 0xCD: (2, 0x100), 0xCE: (4, 0x10000), 0xCF: (8, 1 << 32)}
_F64 = struct.Struct(">d")


def _long_length(data: bytes, p: int, heads: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """(declared length, where the payload starts) of the header at p, refusing a longer form than needed."""
    width, least = heads[data[p]]
    n = int.from_bytes(data[p + 1 : p + 1 + width], "big")
    if n < least:
        raise Slow
    return n, p + 1 + width


def _map_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x80 | n])
    return b"\xde" + n.to_bytes(2, "big") if n < 65536 else b"\xdf" + n.to_bytes(4, "big")


def _bin_header(n: int) -> bytes:
    if n < 256:
        return bytes([0xC4, n])
    return b"\xc5" + n.to_bytes(2, "big") if n < 65536 else b"\xc6" + n.to_bytes(4, "big")


def _array_length(data: bytes, p: int) -> tuple[int, int]:
    first = data[p]
    if 0x90 <= first <= 0x9F:
        return first - 0x90, p + 1
    return _long_length(data, p, _ARRAY_HEADS)


class _Guard:
    """msgpack's container hooks while a tuple of scalars is built: only the outer array may complete.
    Apart from the cursor, so that the unpacker holding these hooks holds no cycle back to its buffer."""

    def __init__(self) -> None:
        self.arrays = 0

    def on_array(self, value: Any) -> Any:
        self.arrays += 1
        if self.arrays > 1:
            raise Slow
        return value

    def on_map(self, pairs: Any) -> Any:
        raise Slow


class Cursor:
    """One buffer being decoded and, made when a tuple of scalars first needs it, an unpacker over it."""

    __slots__ = ("at", "cls", "data", "guard", "unpacker")

    def __init__(self, data: bytes, cls: type) -> None:
        self.data = data
        self.cls = cls  # the root class: the unpacker's limits are its schema tree's, as in the reference
        self.unpacker: msgpack.Unpacker | None = None
        self.guard = _Guard()
        self.at = 0  # where the unpacker stands

    def unpack(self, p: int) -> tuple[Any, int]:
        """The object msgpack builds from p in one call, and where it ends."""
        unpacker = self.unpacker
        if unpacker is None:
            limits = unpack_limits(self.cls)
            unpacker = self.unpacker = msgpack.Unpacker(
                None, raw=False, use_list=False, strict_map_key=True, max_ext_len=0,
                max_buffer_size=max(len(self.data), 1), max_str_len=limits.max_str_len,
                max_bin_len=limits.max_bin_len, max_array_len=limits.max_array_len,
                max_map_len=limits.max_map_len, list_hook=self.guard.on_array,
                object_pairs_hook=self.guard.on_map,
            )
            unpacker.feed(self.data)
        if p != self.at:  # the walk only goes forward: step over what was parsed without msgpack
            unpacker.read_bytes(p - self.at)
        self.guard.arrays = 0
        value = unpacker.unpack()
        self.at = unpacker.tell()
        return value, self.at


Reader = Callable[[Cursor, bytes, int], tuple[Any, int]]


def _int_reader(lo: int, hi: int) -> Reader:
    heads = _UINT_HEADS

    def read_int(cursor: Cursor, data: bytes, p: int) -> tuple[Any, int]:
        first = data[p]
        if first < 0x80:
            value, p = first, p + 1
        else:  # only the unsigned forms: a non-negative value is never written signed
            width, least = heads[first]
            value = int.from_bytes(data[p + 1 : p + 1 + width], "big")
            if value < least:
                raise Slow
            p += 1 + width
        if not lo <= value <= hi:
            raise Slow
        return value, p

    return read_int


def _read_bool(cursor: Cursor, data: bytes, p: int) -> tuple[Any, int]:
    first = data[p]
    if first == 0xC3:
        return True, p + 1
    if first == 0xC2:
        return False, p + 1
    raise Slow


def _read_float(cursor: Cursor, data: bytes, p: int) -> tuple[Any, int]:
    if data[p] != 0xCB:
        raise Slow
    (value,) = _F64.unpack_from(data, p + 1)
    if not math.isfinite(value):
        raise Slow
    return value, p + 9


def _str_reader(cap: int, pattern: Any) -> Reader:
    heads = _STR_HEADS

    def read_str(cursor: Cursor, data: bytes, p: int) -> tuple[Any, int]:
        first = data[p]
        if 0xA0 <= first <= 0xBF:
            n, start = first - 0xA0, p + 1
        else:
            n, start = _long_length(data, p, heads)
        end = start + n
        if n > cap or end > len(data):
            raise Slow
        value = data[start:end].decode()  # strict UTF-8, as msgpack's raw=False
        if pattern is not None and not pattern.fullmatch(value):
            raise Slow
        return value, end

    return read_str


def _bytes_reader(size: int | None, cap: int) -> Reader:
    if size is not None and size > cap:  # no value fits both bounds

        def read_none(cursor: Cursor, data: bytes, p: int) -> tuple[Any, int]:
            raise Slow

        return read_none
    if size is not None:  # an exact size has one canonical header: compare it whole
        head = _bin_header(size)
        skip = len(head)

        def read_sized(cursor: Cursor, data: bytes, p: int) -> tuple[Any, int]:
            end = p + skip + size
            if not data.startswith(head, p) or end > len(data):
                raise Slow
            return data[p + skip : end], end

        return read_sized
    heads = _BIN_HEADS

    def read_bytes(cursor: Cursor, data: bytes, p: int) -> tuple[Any, int]:
        n, start = _long_length(data, p, heads)
        end = start + n
        if n > cap or end > len(data):
            raise Slow
        return data[start:end], end

    return read_bytes


def _scalar_tuple_reader(cap: int, item: FieldSpec) -> Reader:
    items = _items_check(item)

    def read_scalars(cursor: Cursor, data: bytes, p: int) -> tuple[Any, int]:
        n, _ = _array_length(data, p)
        if n > cap:
            raise Slow
        value, end = cursor.unpack(p)
        if value:
            items(value)
        packed = msgpack.packb(value, use_bin_type=True)
        if end - p != len(packed) or not data.startswith(packed, p):
            raise Slow
        return value, end

    return read_scalars


def _walked_tuple_reader(cap: int, item: FieldSpec) -> Reader:
    read_item = _reader(item)

    def read_walked(cursor: Cursor, data: bytes, p: int) -> tuple[Any, int]:
        n, p = _array_length(data, p)
        if n > cap:
            raise Slow
        values = []
        for _ in range(n):
            value, p = read_item(cursor, data, p)
            values.append(value)
        return tuple(values), p

    return read_walked


def _message_reader(cls: type) -> Reader:
    def read_nested(cursor: Cursor, data: bytes, p: int) -> tuple[Any, int]:
        return read_message(decode_plan(cls), cursor, data, p)  # looked up when met: no recursion at build

    return read_nested


def _reader(spec: FieldSpec) -> Reader:
    kind = spec.kind
    if kind == "int":
        return _int_reader(spec.lo, spec.hi)
    if kind == "bool":
        return _read_bool
    if kind == "float":
        return _read_float
    if kind == "str":
        return _str_reader(spec.max_len or 0, spec.pattern)
    if kind == "bytes":
        return _bytes_reader(spec.size, spec.max_len or 0)
    if kind == "message":
        assert spec.message_cls is not None
        return _message_reader(spec.message_cls)
    assert kind == "tuple" and spec.item is not None
    if spec.item.kind in ("message", "tuple"):
        return _walked_tuple_reader(spec.max_len or 0, spec.item)
    return _scalar_tuple_reader(spec.max_len or 0, spec.item)


@dataclass(frozen=True)
class DecodePlan:
    cls: type
    header: bytes  # the canonical map header of this many fields
    fields: tuple[tuple[bytes, int, Reader], ...]  # canonical key bytes, their length, the value's reader


@cache_per_class
def decode_plan(cls: type) -> DecodePlan:
    specs = schema(cls)
    if not all(f.init and not f.kw_only for f in dataclasses.fields(cls)):
        raise Slow  # built by keyword only: the reference decides
    keys = [msgpack.packb(spec.name) for spec in specs]
    fields = tuple((key, len(key), _reader(spec)) for key, spec in zip(keys, specs, strict=True))
    return DecodePlan(cls, _map_header(len(specs)), fields)


def read_message(plan: DecodePlan, cursor: Cursor, data: bytes, p: int) -> tuple[Any, int]:
    if not data.startswith(plan.header, p):
        raise Slow
    p += len(plan.header)
    values = []
    for key, key_len, read in plan.fields:
        if not data.startswith(key, p):
            raise Slow
        value, p = read(cursor, data, p + key_len)
        values.append(value)
    return plan.cls(*values), p


def fast_decode(cls: type, data: bytes) -> Any:
    """The message `data` encodes as `cls`, or one of DECLINED where the reference must decide."""
    message, end = read_message(decode_plan(cls), Cursor(data, cls), data, 0)
    if end != len(data):
        raise Slow
    return message
