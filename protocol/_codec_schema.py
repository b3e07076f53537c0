"""The schema language of canonical messages: field constraints and the field specs derived from them.

Split from `protocol.codec` so that the reference codec there and its fast path (`protocol._codec_fast`)
build on one definition of a message's fields; `protocol.codec` re-exports the schema language.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

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


@dataclass(frozen=True)
class OmitWhenDefault:
    """The field is written only when its value differs from its default, and such fields are trailing: how a
    field is added to a message without changing the bytes of any message that leaves it at its default."""


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
    omittable: bool = False  # OmitWhenDefault: left out of the map while it holds `default`
    default: Any = None  # the dataclass field's default, for an omittable field


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
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return FieldSpec(name, "message", message_cls=hint)
    raise TypeError(f"{name}: unsupported field type {hint!r}")


_T = TypeVar("_T")


def cache_per_class(fn: Callable[[type], _T]) -> Callable[[type], _T]:
    """`functools.cache` for a function of a message class, typed as taking any class: mypy checks a
    `type[X]` argument against `Hashable` through X's unbound `__hash__`, so `functools.cache`'s own type
    refuses every class."""
    return functools.cache(fn)


@cache_per_class
def schema(cls: type) -> tuple[FieldSpec, ...]:
    """The field specs of a message class, in wire order (declaration order); omittable fields last."""
    if not (dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen):  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__} is not a frozen dataclass")
    hints = typing.get_type_hints(cls, include_extras=True)
    specs = tuple(_field_spec(cls, f, hints[f.name]) for f in dataclasses.fields(cls))
    for before, after in itertools.pairwise(specs):
        if before.omittable and not after.omittable:
            raise TypeError(f"{cls.__name__}.{after.name}: follows an omittable field (they are trailing)")
    return specs


def _field_spec(cls: type, field: dataclasses.Field[Any], hint: Any) -> FieldSpec:
    """A field's spec; one marked `OmitWhenDefault` carries its default, which decides when it is written."""
    spec = _spec_for(field.name, hint)
    metadata = typing.get_args(hint)[1:] if typing.get_origin(hint) is typing.Annotated else ()
    if not any(isinstance(m, OmitWhenDefault) for m in metadata):
        return spec
    if field.default is dataclasses.MISSING:  # a default_factory too: a decoder needs the one default value
        raise TypeError(f"{cls.__name__}.{field.name}: an omittable field needs a plain default")
    spec = dataclasses.replace(spec, omittable=True, default=field.default)
    _check_default(cls, spec)
    return spec


def _check_default(cls: type, spec: FieldSpec) -> None:
    """A decoder takes the default of an omitted field, so the default must be a value the field allows."""
    from swarmnode.protocol.codec import _check_value  # the codec imports this module: import at use
    from swarmnode.protocol.errors import Reject

    try:
        _check_value(spec, spec.default, f"{cls.__name__}.{spec.name}")
    except Reject as exc:
        raise TypeError(f"{cls.__name__}.{spec.name}: its default {spec.default!r} is not a value the field "
                        f"allows ({exc})") from None



# --- decoding limits -----------------------------------------------------------------------------

MAX_KEY_LEN = 64  # a map key longer than any field name is an unknown field, refused unread


@dataclass(frozen=True)
class UnpackLimits:
    """msgpack's own per-object caps, the largest the schema tree of one message type allows."""

    max_str_len: int
    max_bin_len: int
    max_array_len: int
    max_map_len: int


@cache_per_class
def unpack_limits(cls: type) -> UnpackLimits:
    """Derive msgpack's structural limits from a message class's schema (and its nested messages)."""
    strs, bins, arrays, maps = [MAX_KEY_LEN], [0], [0], [len(schema(cls))]

    def visit(spec: FieldSpec) -> None:
        if spec.kind == "str":
            strs.append(spec.max_len or 0)
        elif spec.kind == "bytes":
            bins.append(spec.max_len or 0)
        elif spec.kind == "tuple":
            assert spec.item is not None
            arrays.append(spec.max_len or 0)
            visit(spec.item)
        elif spec.kind == "message":
            assert spec.message_cls is not None
            limits = unpack_limits(spec.message_cls)
            strs.append(limits.max_str_len)
            bins.append(limits.max_bin_len)
            arrays.append(limits.max_array_len)
            maps.append(limits.max_map_len)

    for spec in schema(cls):
        visit(spec)
    return UnpackLimits(max(strs), max(bins), max(arrays), max(maps))
