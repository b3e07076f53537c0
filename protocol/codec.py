"""Canonical msgpack: one byte string per message, so signatures and hashes are well defined.

A message is a frozen dataclass. It encodes as a msgpack map whose keys are the field names in
declaration order; bytes use the bin type, integers their shortest form, floats float64; ext types are
never used. Decoding is total: any input yields a message or a `Reject` with a reason, never another
exception. A decoded message must re-encode to exactly the input bytes, which rules out every
alternative spelling (long integer forms, str8 for short strings, float32, duplicate keys).

Field constraints are declared with `typing.Annotated`: `Size(n)` (exact length), `MaxLen(n)`
(bytes, str or tuple), `Range(lo, hi)` (int), `Pattern(regex)` (str). Defaults: ints are u64, str and
bytes at most `DEFAULT_MAX_LEN`, tuples at most `DEFAULT_MAX_ITEMS`. `OmitWhenDefault()` marks a trailing
field with a default that is written only when it differs from that default, so that a field can be added
to a message without changing the bytes of the messages that leave it at its default; a map that writes it
with its default value is not canonical.
"""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Any, NoReturn

import msgpack

from swarmnode.protocol._codec_fast import DECLINED, fast_decode, fast_encode

# re-exported (`X as X`): the schema language is part of this module's API
from swarmnode.protocol._codec_schema import DEFAULT_MAX_ITEMS as DEFAULT_MAX_ITEMS
from swarmnode.protocol._codec_schema import DEFAULT_MAX_LEN as DEFAULT_MAX_LEN
from swarmnode.protocol._codec_schema import MAX_KEY_LEN as MAX_KEY_LEN
from swarmnode.protocol._codec_schema import U64_MAX as U64_MAX
from swarmnode.protocol._codec_schema import FieldSpec as FieldSpec
from swarmnode.protocol._codec_schema import M as M
from swarmnode.protocol._codec_schema import MaxLen as MaxLen
from swarmnode.protocol._codec_schema import Message as Message
from swarmnode.protocol._codec_schema import OmitWhenDefault as OmitWhenDefault
from swarmnode.protocol._codec_schema import Pattern as Pattern
from swarmnode.protocol._codec_schema import Range as Range
from swarmnode.protocol._codec_schema import Size as Size
from swarmnode.protocol._codec_schema import UnpackLimits as UnpackLimits
from swarmnode.protocol._codec_schema import schema as schema
from swarmnode.protocol._codec_schema import unpack_limits as unpack_limits
from swarmnode.protocol.errors import Reason, Reject

# --- encoding ------------------------------------------------------------------------------------

def _to_wire(spec: FieldSpec, value: Any) -> Any:
    if spec.kind == "tuple":
        assert spec.item is not None
        return [_to_wire(spec.item, v) for v in value]
    if spec.kind == "message":
        return to_wire(value)
    return value


def _omitted(spec: FieldSpec, value: Any) -> bool:
    """Whether a field is left out of its map: omittable and at its default as the wire sees it (a list
    and a tuple of the same items are one array, so both are left out)."""
    return spec.omittable and _to_wire(spec, value) == _to_wire(spec, spec.default)


def to_wire(message: Any) -> dict[str, Any]:
    """The plain msgpack-ready map of a message, keys in wire order; omitted fields are left out."""
    fields = ((spec, getattr(message, spec.name)) for spec in schema(type(message)))
    return {spec.name: _to_wire(spec, v) for spec, v in fields if not _omitted(spec, v)}


def encode(message: Any) -> bytes:
    """Canonical bytes of a message. Validates every field first, so nothing invalid is ever signed.

    A plan compiled once per class (`protocol._codec_fast`) does the work; where it declines (a fault, or
    a shape it does not handle) the reference encoder decides and names the fault.
    """
    try:
        return fast_encode(message)
    except DECLINED:
        pass  # outside the handler the reference runs with the fast path's frames already freed
    return reference_encode(message)


def reference_encode(message: Any) -> bytes:
    """The straightforward encoder: the definition the fast path is held to (tests/test_codec_fast.py)."""
    validate(message)
    data: bytes = msgpack.packb(to_wire(message), use_bin_type=True)
    return data


# --- validation ----------------------------------------------------------------------------------

def _malformed(reason: Reason, where: str, detail: str) -> Reject:
    return Reject(reason, f"{where}: {detail}")


def _check_value(spec: FieldSpec, value: Any, where: str) -> Any:
    """Check one decoded wire value against its spec and return the Python value for the dataclass."""
    kind = spec.kind
    if kind == "bool":
        if type(value) is not bool:
            raise _malformed(Reason.WRONG_FIELD_TYPE, where, f"expected bool, got {type(value).__name__}")
        return value
    if kind == "int":
        if type(value) is not int:
            raise _malformed(Reason.WRONG_FIELD_TYPE, where, f"expected int, got {type(value).__name__}")
        if not spec.lo <= value <= spec.hi:
            raise _malformed(Reason.OUT_OF_RANGE, where, f"{value} outside [{spec.lo}, {spec.hi}]")
        return value
    if kind == "float":
        if type(value) is not float:
            raise _malformed(Reason.WRONG_FIELD_TYPE, where, f"expected float, got {type(value).__name__}")
        if not math.isfinite(value):
            raise _malformed(Reason.OUT_OF_RANGE, where, "floats must be finite")
        return value
    if kind == "str":
        if type(value) is not str:
            raise _malformed(Reason.WRONG_FIELD_TYPE, where, f"expected str, got {type(value).__name__}")
        if len(value.encode("utf-8", "surrogatepass")) > (spec.max_len or 0):
            raise _malformed(Reason.OVERSIZED, where, f"longer than {spec.max_len} bytes")
        if spec.pattern is not None and not spec.pattern.fullmatch(value):
            raise _malformed(Reason.OUT_OF_RANGE, where, f"{value!r} does not match {spec.pattern.pattern}")
        return value
    if kind == "bytes":
        if type(value) is not bytes:
            raise _malformed(Reason.WRONG_FIELD_TYPE, where, f"expected bytes, got {type(value).__name__}")
        if spec.size is not None and len(value) != spec.size:
            raise _malformed(Reason.OUT_OF_RANGE, where, f"must be {spec.size} bytes, got {len(value)}")
        if len(value) > (spec.max_len or 0):
            raise _malformed(Reason.OVERSIZED, where, f"longer than {spec.max_len} bytes")
        return value
    if kind == "tuple":
        if type(value) not in (list, tuple):
            raise _malformed(Reason.WRONG_FIELD_TYPE, where, f"expected array, got {type(value).__name__}")
        if len(value) > (spec.max_len or 0):
            raise _malformed(Reason.OVERSIZED, where, f"more than {spec.max_len} items")
        assert spec.item is not None
        item = spec.item
        if item.kind == "int" and set(map(type, value)) <= {int}:
            # Fast path for token ids and chunk indices: one pass, no per-item error context needed.
            if value and not (item.lo <= min(value) and max(value) <= item.hi):
                bad = next(i for i, v in enumerate(value) if not item.lo <= v <= item.hi)
                raise _malformed(Reason.OUT_OF_RANGE, f"{where}[{bad}]", f"outside [{item.lo}, {item.hi}]")
            return tuple(value)
        return tuple(_check_value(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if kind == "message":
        assert spec.message_cls is not None
        if isinstance(value, spec.message_cls):
            validate(value)
            return value
        expected = spec.message_cls.__name__
        raise _malformed(Reason.WRONG_FIELD_TYPE, where, f"expected {expected}, got {type(value).__name__}")
    raise AssertionError(kind)


def validate(message: Any) -> None:
    """Check a constructed message against its schema; raises Reject like the decoder would."""
    name = type(message).__name__
    for spec in schema(type(message)):
        _check_value(spec, getattr(message, spec.name), f"{name}.{spec.name}")


# --- decoding ------------------------------------------------------------------------------------
#
# Decoding is guided by the schema: the reader peeks at each value's msgpack type byte and declared
# length before msgpack builds anything, so a value of the wrong kind, a container longer than its
# field allows or a string over its cap is refused having allocated nothing. Only a tuple of scalars
# is built by msgpack in one call (C speed for token ids), and then with hooks that stop at the first
# nested container. Memory is bounded by the decoded message plus one field's worth of garbage; the
# first fault in wire order is the one reported (spec/wire.md, "Decoding limits").


_FAMILY: tuple[str, ...] = tuple(
    "int" if b <= 0x7F or b >= 0xE0 or 0xCC <= b <= 0xD3
    else "map" if 0x80 <= b <= 0x8F or b in (0xDE, 0xDF)
    else "array" if 0x90 <= b <= 0x9F or b in (0xDC, 0xDD)
    else "str" if 0xA0 <= b <= 0xBF or 0xD9 <= b <= 0xDB
    else "bin" if 0xC4 <= b <= 0xC6
    else "nil" if b == 0xC0
    else "bool" if b in (0xC2, 0xC3)
    else "float" if b in (0xCA, 0xCB)
    else "ext"  # ext types and the never-used 0xc1: not in this dialect
    for b in range(256)
)
_KIND_FAMILY = {
    "int": "int", "bool": "bool", "float": "float", "str": "str", "bytes": "bin", "tuple": "array",
    "message": "map",
}
_WIDTH = {0xD9: 1, 0xC4: 1, 0xDA: 2, 0xC5: 2, 0xDC: 2, 0xDE: 2, 0xDB: 4, 0xC6: 4, 0xDD: 4, 0xDF: 4}


def _canonical_header_size(family: str, n: int) -> int:
    """Bytes of the shortest header for a str, bin, array or map of n items/bytes."""
    if family == "str" and n < 32 or family in ("array", "map") and n < 16:
        return 1
    if family in ("str", "bin") and n < 256:
        return 2
    return 3 if n < 65536 else 5


def _check_framing(data: bytes) -> None:
    """The buffer must be one msgpack object and nothing after it (truncation, a bad type byte,
    nesting deeper than msgpack's stack, trailing bytes), checked by skipping it in C: nothing is built."""
    skipper = msgpack.Unpacker(None, max_buffer_size=max(len(data), 1))
    skipper.feed(data)
    skipper.skip()
    rest = len(data) - skipper.tell()
    if rest:
        raise Reject(Reason.TRAILING_BYTES, f"{rest} bytes after the message")


class _Nested(Exception):
    """A container inside a tuple of scalars: msgpack is stopped as soon as it completes one."""


class _FlatGuard:
    """msgpack's container hooks while a tuple of scalars is unpacked in one call. A separate object
    from the reader so the unpacker holding these hooks holds no cycle back to its own buffer."""

    def __init__(self) -> None:
        self.containers = 0

    def on_array(self, value: Any) -> Any:
        self.containers += 1
        if self.containers > 1:  # the outer tuple is the only array allowed to complete
            raise _Nested
        return value

    def on_map(self, pairs: Any) -> Any:
        raise _Nested  # maps are only ever read field by field, never built by msgpack


def _next_field(specs: tuple[FieldSpec, ...], j: int, key: str) -> int | None:
    """The index of the field `key` names if it may come next, from `specs[j]` on: omittable fields
    (trailing) may be absent, so the key may skip them; None if the key leaves the schema's order."""
    for k in range(j, len(specs)):
        if specs[k].name == key:
            return k
        if not specs[k].omittable:
            return None
    return None


class _Reader:
    """Walks one buffer in wire order under a message schema, refusing each fault before allocating."""

    def __init__(self, data: bytes, limits: UnpackLimits) -> None:
        self.data = data
        self.end = len(data)
        self.guard = _FlatGuard()
        self.unpacker = msgpack.Unpacker(
            None,
            raw=False,
            use_list=False,
            strict_map_key=True,
            max_ext_len=0,
            max_buffer_size=max(self.end, 1),
            max_str_len=limits.max_str_len,
            max_bin_len=limits.max_bin_len,
            max_array_len=limits.max_array_len,
            max_map_len=limits.max_map_len,
            list_hook=self.guard.on_array,
            object_pairs_hook=self.guard.on_map,
        )
        self.unpacker.feed(data)

    def _peek(self) -> tuple[int, str]:
        pos = self.unpacker.tell()
        if pos >= self.end:
            raise Reject(Reason.UNDECODABLE, "not canonical msgpack: truncated")
        family = _FAMILY[self.data[pos]]
        if family == "ext":
            raise Reject(Reason.UNDECODABLE, f"not canonical msgpack: type byte 0x{self.data[pos]:02x}")
        return pos, family

    def _length(self, pos: int) -> int:
        """The declared length of the str, bin, array or map whose header starts at pos."""
        first = self.data[pos]
        width = _WIDTH.get(first)
        if width is None:  # fix forms
            return first & (0x1F if 0xA0 <= first <= 0xBF else 0x0F)
        if pos + 1 + width > self.end:
            raise Reject(Reason.UNDECODABLE, "not canonical msgpack: truncated header")
        return int.from_bytes(self.data[pos + 1 : pos + 1 + width], "big")

    def _canonical(self, pos: int, where: str, ok: bool) -> None:
        if not ok:
            raise Reject(Reason.NON_CANONICAL, f"{where}: not in canonical form (at byte {pos})")

    def message(self, cls: type[M], where: str) -> M:
        pos, family = self._peek()
        if family != "map":
            raise _malformed(Reason.WRONG_FIELD_TYPE, where, f"expected a map, got {family}")
        n = self.unpacker.read_map_header()
        self._canonical(pos, where, self.unpacker.tell() - pos == _canonical_header_size("map", n))
        specs = schema(cls)
        values: dict[str, Any] = {}
        j = 0  # the next field the map may hold
        for i in range(n):
            key = self._key(where)
            k = _next_field(specs, j, key)
            if k is None:
                self._key_fault(specs, where, [*values, key], n - i - 1)
            spec, j = specs[k], k + 1
            values[key] = self.value(spec, f"{where}.{key}")
            if spec.omittable and values[key] == spec.default:
                raise _malformed(Reason.NON_CANONICAL, f"{where}.{key}", "holds its default: omit it")
        missing = ", ".join(s.name for s in specs[j:] if not s.omittable)
        if missing:
            raise _malformed(Reason.MISSING_FIELD, where, f"missing field(s) {missing}")
        return cls(**values)

    def _key(self, where: str) -> str:
        pos, family = self._peek()
        if family == "bin":
            raise _malformed(Reason.UNKNOWN_FIELD, where, "unknown field (a bin key)")
        if family != "str":
            raise Reject(Reason.UNDECODABLE, f"not canonical msgpack: {where} has a {family} map key")
        n = self._length(pos)
        if n > MAX_KEY_LEN:
            raise _malformed(Reason.UNKNOWN_FIELD, where, f"unknown field (a key of {n} bytes)")
        key = self.unpacker.unpack()
        self._canonical(pos, where, self.unpacker.tell() - pos == _canonical_header_size("str", n) + n)
        return key  # type: ignore[no-any-return]

    def _key_fault(
        self, specs: tuple[FieldSpec, ...], where: str, keys: list[str], remaining: int
    ) -> NoReturn:
        """Name what is wrong with a map whose keys left the schema's order; reads at most one key more than
        the schema has fields, skipping values unbuilt. Precedence: unknown, duplicate, missing (an omittable
        field is never missing), order."""
        names = [s.name for s in specs]
        while True:
            if keys[-1] not in names:
                raise _malformed(Reason.UNKNOWN_FIELD, where, f"unknown field {keys[-1]!r}")
            if remaining == 0 or len(keys) > len(names):
                break
            self.unpacker.skip()
            keys.append(self._key(where))
            remaining -= 1
        if len(set(keys)) != len(keys):
            raise _malformed(Reason.NON_CANONICAL, where, "duplicate field")
        missing = [s.name for s in specs if s.name not in keys and not s.omittable]
        if missing:
            raise _malformed(Reason.MISSING_FIELD, where, f"missing field(s) {', '.join(missing)}")
        raise _malformed(Reason.FIELD_ORDER, where, f"fields out of order: {keys}")

    def value(self, spec: FieldSpec, where: str) -> Any:
        pos, family = self._peek()
        kind = spec.kind
        if family != _KIND_FAMILY[kind]:
            raise _malformed(Reason.WRONG_FIELD_TYPE, where, f"expected {kind}, got {family}")
        if kind == "message":
            return self.message(spec.message_cls, where)  # type: ignore[arg-type]
        if kind == "tuple":
            return self._tuple(spec, pos, where)
        if kind in ("str", "bytes"):
            n = self._length(pos)
            if spec.size is not None and n != spec.size:
                raise _malformed(Reason.OUT_OF_RANGE, where, f"must be {spec.size} bytes, got {n}")
            if n > (spec.max_len or 0):
                raise _malformed(Reason.OVERSIZED, where, f"longer than {spec.max_len} bytes")
            value = _check_value(spec, self.unpacker.unpack(), where)
            self._canonical(pos, where, self.unpacker.tell() - pos == _canonical_header_size(family, n) + n)
            return value
        value = _check_value(spec, self.unpacker.unpack(), where)
        self._canonical(pos, where, self.data[pos : self.unpacker.tell()] == msgpack.packb(value))
        return value

    def _tuple(self, spec: FieldSpec, pos: int, where: str) -> tuple[Any, ...]:
        assert spec.item is not None
        n = self._length(pos)
        if n > (spec.max_len or 0):
            raise _malformed(Reason.OVERSIZED, where, f"more than {spec.max_len} items")
        if spec.item.kind in ("message", "tuple"):
            self.unpacker.read_array_header()
            self._canonical(pos, where, self.unpacker.tell() - pos == _canonical_header_size("array", n))
            return tuple(self.value(spec.item, f"{where}[{i}]") for i in range(n))
        self.guard.containers = 0
        try:
            raw = self.unpacker.unpack()
        except _Nested:
            raise _malformed(
                Reason.WRONG_FIELD_TYPE, where, f"expected {spec.item.kind} items, got a container"
            ) from None
        value = _check_value(spec, raw, where)
        packed = msgpack.packb(value, use_bin_type=True)
        self._canonical(pos, where, self.data[pos : self.unpacker.tell()] == packed)
        return value  # type: ignore[no-any-return]


def decode(cls: type[M], data: bytes, *, max_size: int | None = None) -> M:
    """Decode canonical bytes into `cls`, or raise Reject. Total: no other exception escapes.

    A plan compiled once per class (`protocol._codec_fast`) accepts exactly what `reference_decode`
    accepts; at the first fault it declines and the reference names it (same Reject, same precedence).
    """
    cap = max_size if max_size is not None else getattr(cls, "MAX_SIZE", None)
    if cap is not None and len(data) > cap:
        raise Reject(Reason.OVERSIZED, f"{cls.__name__} of {len(data)} bytes exceeds the cap of {cap}")
    if type(data) is bytes:
        try:
            return fast_decode(cls, data)  # type: ignore[no-any-return]
        except DECLINED:
            pass  # outside the handler the reference runs with the fast path's garbage already freed
    return reference_decode(cls, data, max_size=max_size)


def reference_decode(cls: type[M], data: bytes, *, max_size: int | None = None) -> M:
    """The schema-guided walk: the definition the fast path is held to, and the one that names faults.

    Order: the type's size cap; the framing (one whole msgpack object, nothing after it) checked
    without building anything; then the schema-guided walk (each value's type and declared length
    before it is built, its range, its canonical form), then trailing bytes.
    """
    cap = max_size if max_size is not None else getattr(cls, "MAX_SIZE", None)
    if cap is not None and len(data) > cap:
        raise Reject(Reason.OVERSIZED, f"{cls.__name__} of {len(data)} bytes exceeds the cap of {cap}")
    try:
        _check_framing(data)
        reader = _Reader(data, unpack_limits(cls))
        message = reader.message(cls, cls.__name__)
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException, RecursionError) as exc:
        # UnicodeDecodeError and msgpack's FormatError/StackError are ValueError subclasses; OutOfData
        # (truncation) is an UnpackException.
        raise Reject(Reason.UNDECODABLE, f"not canonical msgpack: {type(exc).__name__}") from None
    return message


def registry(*classes: type) -> types.MappingProxyType[str, type]:
    """An immutable type-name → class map, built explicitly (no import-time registration)."""
    table: dict[str, type] = {}
    for cls in classes:
        name = cls.TYPE  # type: ignore[attr-defined]
        if name in table:
            raise ValueError(f"duplicate message type {name!r}")
        table[name] = cls
    return types.MappingProxyType(table)


def to_json(message: Any) -> dict[str, Any]:
    """A JSON-ready view of a message (bytes as 0x-hex), for conformance vectors and `--json` output; omitted
    fields are left out, as on the wire."""

    def convert(value: Any) -> Any:
        if isinstance(value, bytes):
            return "0x" + value.hex()
        if isinstance(value, tuple):
            return [convert(v) for v in value]
        if dataclasses.is_dataclass(value):
            return to_json(value)
        return value

    fields = ((spec, getattr(message, spec.name)) for spec in schema(type(message)))
    return {spec.name: convert(v) for spec, v in fields if not _omitted(spec, v)}
