"""The canonical codec's fast path: an encoder and a decoder per message class, generated from its schema.

Fast accept, reference reject. The generated functions accept exactly what the reference codec in
`protocol.codec` accepts, with exact type checks and bounds written into their source as literals; at the
first fault, or at anything they do not handle, they raise one of `DECLINED` and the caller runs the
reference, which names the fault (the same Reject with the same message, in the same precedence). So the
fast path carries no error text of its own and the reference stays the one definition of which fault is
reported first. tests/test_codec_fast.py holds the two to the same outputs on generated and hostile
messages of every registered type.

Why generated source rather than a plan walked per call: a message such as a RolloutSubmission is mostly
small nested messages (one Completion per sampled completion), so the cost was the interpreter's per-field
dispatch (a closure call, a loop step, a tuple pack and unpack per field), not the bytes. One straight-line
function per class pays none of it; the source of each is kept in `linecache`, so tracebacks and profilers
show it (`<codec encode Completion>`).

Encoding checks each field and builds the whole msgpack-ready tree (nested messages become their field
maps, checked on the way), then one `msgpack.packb` writes every byte. A homogeneous list is checked in a
few C passes (`countOf(map(type, ...))`, one `array("Q", ...)` for the u64 range, `max(map(len, ...))`).

Decoding walks the buffer in wire order like the reference: a value's type byte and declared length are
checked before the value is built (authenticate before allocate). A map header, each key and any constant
header of the value after it (a fixed-size bin, a float64) are compared as one precomputed byte string;
scalars are parsed straight from the buffer and only in their shortest form; only a tuple of scalars goes
through msgpack (one call, stopped at the first nested container like the reference), checked canonical by
packing it again. The message must end exactly at the end of the buffer, which stands in for the
reference's framing pass: positions only grow, so a read cut short by the end of the buffer leaves the
walk past the end, and that is declined.

Omittable fields (`OmitWhenDefault`): the encoder adds one to the map only when it is off its default. The
reader matches the header of a map that leaves them all out as a constant, like any other class's; another
header is read for the number of omittable fields present, each is taken if its key comes next (declining
one written at its default), and a key none of them takes declines. A class without omittable fields gets
the same code as before they existed.
"""

from __future__ import annotations

import dataclasses
import linecache
import math
import struct
from array import array
from collections.abc import Callable
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

Encoder = Callable[[Any], dict[str, Any]]
Reader = Callable[[bytes, int, "Cursor"], tuple[Any, int]]


def _compile(kind: str, cls_name: str, lines: list[str], namespace: dict[str, Any]) -> Any:
    """The function `fn` defined by `lines`, its constants taken from `namespace`; its source is kept
    in linecache under a readable name so that tracebacks and profilers show the generated lines."""
    filename = f"<codec {kind} {cls_name}>"
    source = "\n".join(lines) + "\n"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own source, built from schemas
    return namespace["fn"]


def _indent(lines: list[str], depth: int = 1) -> list[str]:
    return ["    " * depth + line for line in lines]


# --- encoding ------------------------------------------------------------------------------------


def _check_lines(spec: FieldSpec, v: str, tag: str, ns: dict[str, Any]) -> list[str]:
    """Source lines that raise Slow unless the value in variable `v` is one the reference's `_check_value`
    accepts for `spec`, and leave in `v` its msgpack-ready form (a nested message becomes its field map).
    Constants the lines need are put in `ns` under names ending in `tag`."""
    kind = spec.kind
    if kind == "int":
        return [f"if type({v}) is not int or not {spec.lo} <= {v} <= {spec.hi}: raise Slow"]
    if kind == "bool":
        return [f"if type({v}) is not bool: raise Slow"]
    if kind == "float":  # x - x is 0.0 exactly for a finite float, nan for inf and nan
        return [f"if type({v}) is not float or {v} - {v} != 0.0: raise Slow"]
    if kind == "str":
        cap = spec.max_len or 0
        lines = [
            f"if type({v}) is not str: raise Slow",
            # no code point takes more than 4 bytes in UTF-8: shorter strings fit unencoded
            f"if len({v}) > {cap // 4} and len({v}.encode('utf-8', 'surrogatepass')) > {cap}: raise Slow",
        ]
        if spec.pattern is not None:
            ns[f"P{tag}"] = spec.pattern
            lines.append(f"if not P{tag}.fullmatch({v}): raise Slow")
        return lines
    if kind == "bytes":
        size, cap = spec.size, spec.max_len or 0
        if size is not None and size > cap:  # no value fits both bounds
            return ["raise Slow"]
        if size is not None:
            return [f"if type({v}) is not bytes or len({v}) != {size}: raise Slow"]
        return [f"if type({v}) is not bytes or len({v}) > {cap}: raise Slow"]
    if kind == "message":
        ns[f"C{tag}"], ns[f"E{tag}"] = spec.message_cls, encoder(spec.message_cls)  # type: ignore[arg-type]
        return [f"if type({v}) is not C{tag}: raise Slow", f"{v} = E{tag}({v})"]
    assert kind == "tuple" and spec.item is not None
    return [
        f"if type({v}) is not tuple and type({v}) is not list or len({v}) > {spec.max_len or 0}: raise Slow",
        f"if {v}:",
        *_indent(_items_lines(spec.item, v, tag, ns)),
    ]


def _items_lines(item: FieldSpec, v: str, tag: str, ns: dict[str, Any]) -> list[str]:
    """Source lines checking every item of the non-empty list or tuple in `v` against `item`: a few C
    passes over the whole list for scalars, one generated call per item for anything else."""
    kind = item.kind
    every = f"countOf(map(type, {v}), {{}}) != len({v})"  # exact types: no bool for int, no IntEnum
    if kind == "int":
        lines = [f"if {every.format('int')}: raise Slow"]
        if item.lo == 0 and item.hi == U64_MAX:
            return [*lines, f"array('Q', {v})"]  # OverflowError outside [0, 2**64 - 1]: one C pass
        return [*lines, f"if min({v}) < {item.lo} or max({v}) > {item.hi}: raise Slow"]
    if kind == "bytes":
        lines = [f"if {every.format('bytes')} or max(map(len, {v})) > {item.max_len or 0}: raise Slow"]
        if item.size is not None:
            lines.append(f"if countOf(map(len, {v}), {item.size}) != len({v}): raise Slow")
        return lines
    if kind == "float":
        return [f"if {every.format('float')} or not all(map(isfinite, {v})): raise Slow"]
    if kind == "bool":
        return [f"if {every.format('bool')}: raise Slow"]
    if kind == "message":
        ns[f"C{tag}"], ns[f"E{tag}"] = item.message_cls, encoder(item.message_cls)  # type: ignore[arg-type]
        return [f"if {every.format(f'C{tag}')}: raise Slow", f"{v} = list(map(E{tag}, {v}))"]
    ns[f"I{tag}"] = _item_encoder(item)  # str, or a nested tuple: checked (and converted) one by one
    return [f"{v} = tuple(map(I{tag}, {v}))"]


def _item_encoder(spec: FieldSpec) -> Callable[[Any], Any]:
    ns = _namespace()
    lines = ["def fn(x):", *_indent(_check_lines(spec, "x", "", ns)), "    return x"]
    fn: Callable[[Any], Any] = _compile("encode item", spec.name, lines, ns)
    return fn


def _namespace() -> dict[str, Any]:
    return {"Slow": Slow, "countOf": countOf, "array": array, "isfinite": math.isfinite}


def _plain(value: Any) -> Any:
    """A msgpack-ready value with every array a list: so two values compare as the wire sees them."""
    if type(value) is list or type(value) is tuple:
        return [_plain(v) for v in value]
    if type(value) is dict:
        return {k: _plain(v) for k, v in value.items()}
    return value


def _omit_lines(spec: FieldSpec, v: str, tag: str, ns: dict[str, Any]) -> list[str]:
    """Source lines that add the checked omittable field in `v` to the map `w` unless it holds its default
    as the wire sees it (the reference's `_omitted`): a list or tuple and its items alike."""
    put = f"w[{spec.name!r}] = {v}"
    if spec.kind == "tuple" and spec.default == ():
        return [f"if {v}: {put}"]  # the common case, cheapest: any non-empty array is written
    if spec.kind not in ("tuple", "message"):
        ns[f"D{tag}"] = spec.default
        return [f"if {v} != D{tag}: {put}"]
    try:
        ns[f"D{tag}"] = _plain(_item_encoder(spec)(spec.default))
    except DECLINED:  # a default its own field refuses: the reference decides every message of the class
        return ["raise Slow"]
    ns["plain"] = _plain
    return [f"if plain({v}) != D{tag}: {put}"]


@cache_per_class
def encoder(cls: type) -> Encoder:
    """The generated function from a message of exactly `cls` to its checked msgpack-ready field map."""
    specs = schema(cls)
    ns = _namespace()
    lines = ["def fn(m):"]
    for i, spec in enumerate(specs):
        lines.append(f"    v{i} = m.{spec.name}")
        lines += _indent(_check_lines(spec, f"v{i}", str(i), ns))
    fields = ", ".join(f"{spec.name!r}: v{i}" for i, spec in enumerate(specs) if not spec.omittable)
    if not any(spec.omittable for spec in specs):
        lines.append(f"    return {{{fields}}}")
    else:
        lines.append(f"    w = {{{fields}}}")
        for i, spec in enumerate(specs):
            if spec.omittable:
                lines += _indent(_omit_lines(spec, f"v{i}", str(i), ns))
        lines.append("    return w")
    fn: Encoder = _compile("encode", cls.__name__, lines, ns)
    return fn


def fast_encode(message: Any) -> bytes:
    """The canonical bytes of `message`, or one of DECLINED where the reference must decide."""
    data: bytes = msgpack.packb(encoder(type(message))(message), use_bin_type=True)
    return data


# --- decoding ------------------------------------------------------------------------------------

# Header byte -> (bytes of length after it, the least length that needs this form): a longer form than
# the length needs is not canonical.
_STR_HEADS = {0xD9: (1, 32), 0xDA: (2, 256), 0xDB: (4, 65536)}
_ARRAY_HEADS = {0xDC: (2, 16), 0xDD: (4, 65536)}
_MAP_HEADS = {0xDE: (2, 16), 0xDF: (4, 65536)}
_UINT_HEADS = {0xCC: (1, 0x80), 0xCD: (2, 0x100), 0xCE: (4, 0x10000), 0xCF: (8, 1 << 32)}
_F64 = struct.Struct(">d")
WALKED_ITEMS = 16  # a tuple of scalars up to this long is read item by item, past it by one msgpack call


def _long_length(data: bytes, p: int, heads: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """(declared length, where the payload starts) of the header at p, refusing a longer form than needed."""
    width, least = heads[data[p]]
    n = int.from_bytes(data[p + 1 : p + 1 + width], "big")
    if n < least:
        raise Slow
    return n, p + 1 + width


def _long_uint(data: bytes, p: int) -> tuple[int, int]:
    """(value, where it ends) of a uint8..uint64 at p, refusing a longer form than the value needs; only
    the unsigned forms: a non-negative value is never written signed."""
    return _long_length(data, p, _UINT_HEADS)


def _long_array_length(data: bytes, p: int) -> tuple[int, int]:
    return _long_length(data, p, _ARRAY_HEADS)


def _map_length(data: bytes, p: int) -> tuple[int, int]:
    """(declared size, where the first key starts) of a map header in its shortest form."""
    first = data[p]
    if 0x80 <= first <= 0x8F:
        return first - 0x80, p + 1
    return _long_length(data, p, _MAP_HEADS)


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
    return _long_array_length(data, p)


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
    """One buffer being decoded and, made when a long tuple of scalars first needs them, an unpacker over it
    and a packer to check that tuple's bytes canonical (one per decode, not one per tuple)."""

    __slots__ = ("at", "cls", "data", "guard", "packer", "unpacker")

    def __init__(self, data: bytes, cls: type) -> None:
        self.data = data
        self.cls = cls  # the root class: the unpacker's limits are its schema tree's, as in the reference
        self.unpacker: msgpack.Unpacker | None = None
        self.guard: _Guard | None = None
        self.packer: msgpack.Packer | None = None
        self.at = 0  # where the unpacker stands

    def unpack(self, p: int) -> tuple[Any, int]:
        """The object msgpack builds from p in one call, and where it ends."""
        unpacker, guard = self.unpacker, self.guard
        if unpacker is None or guard is None:
            limits = unpack_limits(self.cls)
            guard = self.guard = _Guard()
            unpacker = self.unpacker = msgpack.Unpacker(
                None, raw=False, use_list=False, strict_map_key=True, max_ext_len=0,
                max_buffer_size=max(len(self.data), 1), max_str_len=limits.max_str_len,
                max_bin_len=limits.max_bin_len, max_array_len=limits.max_array_len,
                max_map_len=limits.max_map_len, list_hook=guard.on_array, object_pairs_hook=guard.on_map,
            )
            unpacker.feed(self.data)
        if p != self.at:  # the walk only goes forward: step over what was parsed without msgpack
            unpacker.read_bytes(p - self.at)
        guard.arrays = 0
        value = unpacker.unpack()
        self.at = unpacker.tell()
        return value, self.at

    def canonical(self, value: Any, p: int, end: int) -> bool:
        """Whether the bytes from p to end are exactly what msgpack writes for `value`."""
        packer = self.packer
        if packer is None:
            packer = self.packer = msgpack.Packer(use_bin_type=True)
        packed = packer.pack(value)
        return end - p == len(packed) and self.data.startswith(packed, p)


def _str_reader(cap: int, pattern: Any) -> Callable[[bytes, int], tuple[str, int]]:
    heads = _STR_HEADS

    def read_str(data: bytes, p: int) -> tuple[str, int]:
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


def _scalar_tuple_reader(cap: int, item: FieldSpec) -> Callable[[Cursor, bytes, int], tuple[Any, int]]:
    """A tuple of scalars. A short one is read item by item like a message's fields (cheaper than any
    msgpack call); a long one in one msgpack call, its items checked in C passes and its bytes checked
    canonical by packing it again."""
    ns = _decode_namespace()
    prefix, read_item = _read_lines(item, "x", "", ns)
    ns["PREFIX"] = prefix
    if item.kind == "int":
        # array("Q") refuses every msgpack value but ints and bools, and turns a bool into 0 or 1, which
        # packs unlike the bool that was read: so the canonical check refuses bools too, with no type pass.
        check = ["w = array('Q', v)"]
        if not (item.lo == 0 and item.hi == U64_MAX):
            check.append(f"if min(w) < {item.lo} or max(w) > {item.hi}: raise Slow")
        check.append("w = w.tolist()")
    else:
        check = [*_items_lines(item, "v", "", ns), "w = v"]
    lines = [
        "def fn(cur, data, p):",
        "    b = data[p]",
        "    if 0x90 <= b <= 0x9F:",
        "        count = b - 0x90",
        "        start = p + 1",
        "    else:",
        "        count, start = long_array_length(data, p)",
        f"    if count > {cap}: raise Slow",  # before anything is allocated
        f"    if count > {WALKED_ITEMS}:",
        "        v, end = cur.unpack(p)",
        *_indent(check, 2),
        "        if not cur.canonical(w, p, end): raise Slow",
        "        return v, end",
        "    p = start",
        "    items = []",
        "    for _ in range(count):",
    ]
    if prefix:
        lines += ["        if not data.startswith(PREFIX, p): raise Slow", f"        p += {len(prefix)}"]
    lines += [*_indent(read_item, 2), "        items.append(x)", "    return tuple(items), p"]
    fn: Callable[[Cursor, bytes, int], tuple[Any, int]] = _compile("read tuple", item.name, lines, ns)
    return fn


def _uint_lines(v: str) -> list[str]:
    return [
        "b = data[p]",
        "if b < 0x80:",
        f"    {v} = b",
        "    p += 1",
        "else:",
        f"    {v}, p = long_uint(data, p)",
    ]


def _bin_lines(v: str, cap: int) -> list[str]:
    """Read a bin of at most `cap` bytes in its shortest header form; forms longer than `cap` needs are
    not written at all (their type byte declines)."""
    lines = ["b = data[p]", "if b == 0xC4:", "    n = data[p + 1]", "    p += 2"]
    if cap >= 256:
        lines += [
            "elif b == 0xC5:",
            "    n = int.from_bytes(data[p + 1 : p + 3], 'big')",
            "    if n < 256: raise Slow",
            "    p += 3",
        ]
    if cap >= 65536:
        lines += [
            "elif b == 0xC6:",
            "    n = int.from_bytes(data[p + 1 : p + 5], 'big')",
            "    if n < 65536: raise Slow",
            "    p += 5",
        ]
    lines += ["else:", "    raise Slow", f"if n > {cap}: raise Slow"]
    return [*lines, f"{v} = data[p : p + n]", "p += n"]


def _read_lines(spec: FieldSpec, v: str, tag: str, ns: dict[str, Any]) -> tuple[bytes, list[str]]:
    """(the constant bytes the value starts with, source lines that read the rest of it from `data` at `p`
    into variable `v` and move `p` past it), raising Slow where the reference would reject or where it
    might not; constants the lines need are put in `ns` under names ending in `tag`."""
    kind = spec.kind
    if kind == "int":
        lines = _uint_lines(v)
        if not (spec.lo == 0 and spec.hi == U64_MAX):
            lines.append(f"if not {spec.lo} <= {v} <= {spec.hi}: raise Slow")
        return b"", lines
    if kind == "bool":
        return b"", [
            "b = data[p]",
            "p += 1",
            f"if b == 0xC3: {v} = True",
            f"elif b == 0xC2: {v} = False",
            "else: raise Slow",
        ]
    if kind == "float":
        return b"\xcb", [f"({v},) = f64(data, p)", "p += 8", f"if {v} - {v} != 0.0: raise Slow"]
    if kind == "str":
        ns[f"S{tag}"] = _str_reader(spec.max_len or 0, spec.pattern)
        return b"", [f"{v}, p = S{tag}(data, p)"]
    if kind == "bytes":
        size, cap = spec.size, spec.max_len or 0
        if size is not None and size > cap:  # no value fits both bounds
            return b"", ["raise Slow"]
        if size is not None:  # an exact size has one canonical header: part of the constant prefix
            return _bin_header(size), [f"{v} = data[p : p + {size}]", f"p += {size}"]
        return b"", _bin_lines(v, cap)
    if kind == "message":
        assert spec.message_cls is not None
        ns[f"R{tag}"] = reader(spec.message_cls)
        return b"", [f"{v}, p = R{tag}(data, p, cur)"]
    assert kind == "tuple" and spec.item is not None
    if spec.item.kind not in ("message", "tuple"):
        ns[f"T{tag}"] = _scalar_tuple_reader(spec.max_len or 0, spec.item)
        return b"", [f"{v}, p = T{tag}(cur, data, p)"]
    item = spec.item
    ns[f"R{tag}"] = reader(item.message_cls) if item.kind == "message" else _item_reader(item)  # type: ignore[arg-type]
    return b"", [
        "b = data[p]",
        "if 0x90 <= b <= 0x9F:",
        "    n = b - 0x90",
        "    p += 1",
        "else:",
        "    n, p = long_array_length(data, p)",
        f"if n > {spec.max_len or 0}: raise Slow",
        "items = []",
        "for _ in range(n):",
        f"    item, p = R{tag}(data, p, cur)",
        "    items.append(item)",
        f"{v} = tuple(items)",
    ]


def _decode_namespace() -> dict[str, Any]:
    return {
        **_namespace(), "f64": _F64.unpack_from, "long_uint": _long_uint,
        "long_array_length": _long_array_length, "map_length": _map_length,
    }


def _item_reader(spec: FieldSpec) -> Reader:
    """A standalone reader of one value (an item of a tuple of tuples)."""
    ns = _decode_namespace()
    prefix, lines = _read_lines(spec, "x", "", ns)
    ns["PREFIX"] = prefix
    head = ["    if not data.startswith(PREFIX, p): raise Slow", f"    p += {len(prefix)}"] if prefix else []
    lines = ["def fn(data, p, cur):", *head, *_indent(lines), "    return x, p"]
    fn: Reader = _compile("read item", spec.name, lines, ns)
    return fn


def _declined(data: bytes, p: int, cur: Cursor) -> tuple[Any, int]:
    raise Slow


def _keys_left_lines(required: int, total: int) -> list[str]:
    """Read the header of a map that may leave out its omittable fields: `left` is the number of omittable
    fields it holds; a count outside what the schema allows, or a longer header than it needs, declines."""
    if total < 16:  # only a fixmap is canonical: any other type byte gives a count out of range
        return [f"left = data[p] - {0x80 + required}", f"if not 0 <= left <= {total - required}: raise Slow",
                "p += 1"]
    return ["left, p = map_length(data, p)", f"left -= {required}",
            f"if not 0 <= left <= {total - required}: raise Slow"]


def _first_key_lines(prefix: bytes, key: bytes, required: int, total: int, ns: dict[str, Any]) -> list[str]:
    """Match the map header and first key of a class with omittable fields: as one constant where the map
    leaves them all out (the common case, as cheap as a class without them), else read the header."""
    ns["K0"], ns["KEY0"] = prefix, key
    return [
        "if data.startswith(K0, p):",
        "    left = 0",
        f"    p += {len(prefix)}",
        "else:",
        *_indent(_keys_left_lines(required, total)),
        "    if not data.startswith(KEY0, p): raise Slow",
        f"    p += {len(key)}",
    ]


def _omittable_lines(spec: FieldSpec, i: int, ns: dict[str, Any]) -> list[str]:
    """Read omittable field i into `v{i}` if its key comes next, else take its default; one written with its
    default value declines (the reference names it NON_CANONICAL)."""
    fixed, value_lines = _read_lines(spec, f"v{i}", str(i), ns)
    key = msgpack.packb(spec.name) + fixed
    ns[f"K{i}"], ns[f"D{i}"] = key, spec.default
    return [
        f"if left and data.startswith(K{i}, p):",
        f"    p += {len(key)}",
        *_indent(value_lines),
        f"    if v{i} == D{i}: raise Slow",
        "    left -= 1",
        "else:",
        f"    v{i} = D{i}",
    ]


@cache_per_class
def reader(cls: type) -> Reader:
    """The generated reader of a message of `cls` at position p: (the message, where it ends)."""
    specs = schema(cls)
    if not all(f.init and not f.kw_only for f in dataclasses.fields(cls)):
        return _declined  # built by keyword only: the reference decides
    ns = _decode_namespace()
    ns["cls"] = cls
    lines = ["def fn(data, p, cur):"]
    required = sum(not spec.omittable for spec in specs)
    # The bytes every message of cls starts with, up to its first value; with omittable fields, those of a
    # message that leaves them all out.
    prefix = _map_header(required)
    if required == 0 < len(specs):  # no key to match the header with: it is read
        lines += _indent(_keys_left_lines(0, len(specs)))
        prefix = b""
    for i, spec in enumerate(specs):
        if spec.omittable:
            lines += _indent(_omittable_lines(spec, i, ns))
            continue
        fixed, value_lines = _read_lines(spec, f"v{i}", str(i), ns)
        key = msgpack.packb(spec.name) + fixed
        prefix += key
        ns[f"K{i}"] = prefix
        if i == 0 and required < len(specs):
            lines += _indent(_first_key_lines(prefix, key, required, len(specs), ns))
        else:
            lines += [f"    if not data.startswith(K{i}, p): raise Slow", f"    p += {len(prefix)}"]
        lines += _indent(value_lines)
        prefix = b""
    if required < len(specs):
        lines.append("    if left: raise Slow")  # a key the omittable fields did not take
    if not specs:
        ns["K"] = prefix
        lines += ["    if not data.startswith(K, p): raise Slow", f"    p += {len(prefix)}"]
    lines.append(f"    return cls({', '.join(f'v{i}' for i in range(len(specs)))}), p")
    fn: Reader = _compile("read", cls.__name__, lines, ns)
    return fn


def fast_decode(cls: type, data: bytes) -> Any:
    """The message `data` encodes as `cls`, or one of DECLINED where the reference must decide."""
    message, end = reader(cls)(data, 0, Cursor(data, cls))
    if end != len(data):
        raise Slow
    return message
