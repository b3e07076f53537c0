"""Canonical msgpack: one byte string per message, so signatures and hashes are well defined.

A message is a frozen dataclass. It encodes as a msgpack map whose keys are the field names in
declaration order; bytes use the bin type, integers their shortest form, floats float64; ext types are
never used. Decoding is total: any input yields a message or a `Reject` with a reason, never another
exception. A decoded message must re-encode to exactly the input bytes, which rules out every
alternative spelling (long integer forms, str8 for short strings, float32, duplicate keys).

Field constraints are declared with `typing.Annotated`: `Size(n)` (exact length), `MaxLen(n)`
(bytes, str or tuple), `Range(lo, hi)` (int), `Pattern(regex)` (str). Defaults: ints are u64, str and
bytes at most `DEFAULT_MAX_LEN`, tuples at most `DEFAULT_MAX_ITEMS`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import msgpack

from protocol.errors import Reason, Reject

U64_MAX = 2**64 - 1
DEFAULT_MAX_LEN = 1024
DEFAULT_MAX_ITEMS = 1024


@dataclass(frozen=True)
class Size:
    """Exact length of a bytes field."""

    n: int


@dataclass(frozen=True)
class MaxLen:
    """Upper bound on the length of a bytes, str or tuple field."""

    n: int


@dataclass(frozen=True)
class Range:
    """Inclusive bounds of an int field."""

    lo: int
    hi: int


@dataclass(frozen=True)
class Pattern:
    """A str field must match this regular expression in full."""

    regex: str


class Message(Protocol):
    """What every wire message class provides."""

    TYPE: ClassVar[str]
    MAX_SIZE: ClassVar[int]


M = TypeVar("M")


# --- schema --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FieldSpec:
    name: str
    kind: str  # "int" | "bool" | "float" | "str" | "bytes" | "tuple" | "message"
    size: int | None = None
    max_len: int | None = None
    lo: int = 0
    hi: int = U64_MAX
    pattern: re.Pattern[str] | None = None
    item: FieldSpec | None = None
    message_cls: type | None = None


def _spec_for(name: str, hint: Any) -> FieldSpec:
    metadata: tuple[Any, ...] = ()
    if typing.get_origin(hint) is typing.Annotated:
        hint, *rest = typing.get_args(hint)
        metadata = tuple(rest)
    size = next((m.n for m in metadata if isinstance(m, Size)), None)
    max_len = next((m.n for m in metadata if isinstance(m, MaxLen)), None)
    bounds = next((m for m in metadata if isinstance(m, Range)), Range(0, U64_MAX))
    pattern = next((re.compile(m.regex) for m in metadata if isinstance(m, Pattern)), None)
    if hint is bool:
        return FieldSpec(name, "bool")
    if hint is int:
        return FieldSpec(name, "int", lo=bounds.lo, hi=bounds.hi)
    if hint is float:
        return FieldSpec(name, "float")
    if hint is str:
        return FieldSpec(name, "str", max_len=max_len or DEFAULT_MAX_LEN, pattern=pattern)
    if hint is bytes:
        return FieldSpec(name, "bytes", size=size, max_len=max_len or size or DEFAULT_MAX_LEN)
    if typing.get_origin(hint) is tuple:
        item_hint, ellipsis = typing.get_args(hint)
        if ellipsis is not Ellipsis:
            raise TypeError(f"{name}: only homogeneous tuple[T, ...] fields are supported")
        return FieldSpec(name, "tuple", max_len=max_len or DEFAULT_MAX_ITEMS, item=_spec_for(name, item_hint))
    if dataclasses.is_dataclass(hint):
        return FieldSpec(name, "message", message_cls=hint)
    raise TypeError(f"{name}: unsupported field type {hint!r}")


@functools.cache
def schema(cls: type) -> tuple[FieldSpec, ...]:
    """The field specs of a message class, in wire order (declaration order)."""
    if not (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__} is not a frozen dataclass")
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple(_spec_for(f.name, hints[f.name]) for f in dataclasses.fields(cls))


# --- encoding ------------------------------------------------------------------------------------

def _to_wire(spec: FieldSpec, value: Any) -> Any:
    if spec.kind == "tuple":
        assert spec.item is not None
        return [_to_wire(spec.item, v) for v in value]
    if spec.kind == "message":
        return to_wire(value)
    return value


def to_wire(message: Any) -> dict[str, Any]:
    """The plain msgpack-ready map of a message, keys in wire order."""
    return {spec.name: _to_wire(spec, getattr(message, spec.name)) for spec in schema(type(message))}


def encode(message: Any) -> bytes:
    """Canonical bytes of a message. Validates every field first, so nothing invalid is ever signed."""
    validate(message)
    return msgpack.packb(to_wire(message), use_bin_type=True)


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
        if item.kind == "int" and all(type(v) is int for v in value):
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
        return _from_pairs(spec.message_cls, value, where)
    raise AssertionError(kind)


def validate(message: Any) -> None:
    """Check a constructed message against its schema; raises Reject like the decoder would."""
    name = type(message).__name__
    for spec in schema(type(message)):
        _check_value(spec, getattr(message, spec.name), f"{name}.{spec.name}")


def _from_pairs(cls: type[M], pairs: Any, where: str) -> M:
    """Build a message from the (key, value) pairs the unpacker produced, strictly in wire order."""
    if type(pairs) is not list or not all(type(p) is tuple and len(p) == 2 for p in pairs):
        raise _malformed(Reason.WRONG_FIELD_TYPE, where, "expected a map")
    specs = schema(cls)
    expected = [s.name for s in specs]
    keys = [k for k, _ in pairs]
    for key in keys:
        if key not in expected:
            raise _malformed(Reason.UNKNOWN_FIELD, where, f"unknown field {key!r}")
    if len(set(keys)) != len(keys):
        raise _malformed(Reason.NON_CANONICAL, where, "duplicate field")
    missing = [n for n in expected if n not in keys]
    if missing:
        raise _malformed(Reason.MISSING_FIELD, where, f"missing field(s) {', '.join(missing)}")
    if keys != expected:
        raise _malformed(Reason.FIELD_ORDER, where, f"fields out of order: {keys}")
    values = {s.name: _check_value(s, v, f"{where}.{s.name}") for s, (_, v) in zip(specs, pairs, strict=True)}
    return cls(**values)


# --- decoding ------------------------------------------------------------------------------------

def _unpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=True,
            object_pairs_hook=list,
            max_ext_len=0,
        )
    except msgpack.ExtraData as exc:
        raise Reject(Reason.TRAILING_BYTES, f"{len(exc.extra)} bytes after the message") from None
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException, RecursionError) as exc:
        # UnicodeDecodeError and msgpack's FormatError/StackError are ValueError subclasses.
        raise Reject(Reason.UNDECODABLE, f"not canonical msgpack: {type(exc).__name__}") from None


def decode(cls: type[M], data: bytes, *, max_size: int | None = None) -> M:
    """Decode canonical bytes into `cls`, or raise Reject. Total: no other exception escapes."""
    cap = max_size if max_size is not None else getattr(cls, "MAX_SIZE", None)
    if cap is not None and len(data) > cap:
        raise Reject(Reason.OVERSIZED, f"{cls.__name__} of {len(data)} bytes exceeds the cap of {cap}")
    message = _from_pairs(cls, _unpack(data), cls.__name__)
    if msgpack.packb(to_wire(message), use_bin_type=True) != data:
        raise Reject(Reason.NON_CANONICAL, f"{cls.__name__} is not in canonical form")
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
    """A JSON-ready view of a message (bytes as 0x-hex), for conformance vectors and `--json` output."""

    def convert(value: Any) -> Any:
        if isinstance(value, bytes):
            return "0x" + value.hex()
        if isinstance(value, tuple):
            return [convert(v) for v in value]
        if dataclasses.is_dataclass(value):
            return to_json(value)
        return value

    return {spec.name: convert(getattr(message, spec.name)) for spec in schema(type(message))}
