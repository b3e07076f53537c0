"""Pure rules of the weight-broadcast data plane (spec/shards.md is the normative twin).

Everything a shard holder and a downloader must agree on, without I/O: the checks a trainer-signed
`CheckpointManifest` must pass, the `CheckpointHead` gossiped for it and how a fetched manifest must match
it, the `ShardHave` bitfield layout, the retention rule, the HTTP paths and the `Range` header grammar.
Time and the trainer's address arrive as arguments.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

from swarmnode.crypto.hashing import sha256
from swarmnode.crypto.merkle import merkle_root
from swarmnode.protocol.codec import decode, encode
from swarmnode.protocol.envelope import ENVELOPE_OVERHEAD, Envelope, open_envelope
from swarmnode.protocol.errors import Ignore, Reason, Reject
from swarmnode.protocol.messages import MANIFEST_MAX_SHARDS, CheckpointHead, CheckpointManifest, ShardHave
from swarmnode.protocol.types import MIB

M = TypeVar("M", CheckpointManifest, CheckpointHead)

# --- parameters (spec/shards.md, Parameters) -----------------------------------------------------

DEFAULT_SHARD_SIZE = 50 * MIB
MAX_SHARD_SIZE = 4096 * MIB
MAX_SHARDS = MANIFEST_MAX_SHARDS  # CheckpointManifest.shards MaxLen; also 1024 bitfield bytes * 8
MAX_MANIFEST_ENVELOPE = CheckpointManifest.MAX_SIZE + ENVELOPE_OVERHEAD  # a manifest fetched over HTTP
PATH_PREFIX = "/shards/1.0.0"
MANIFEST_FILE = "manifest.msgpack"
PART_SUFFIX = ".part"
LATEST = "latest"


# --- manifest ------------------------------------------------------------------------------------


def _rule(detail: str) -> Reject:
    return Reject(Reason.RULE_VIOLATION, detail)


def is_safe_shard_name(name: str) -> bool:
    """A shard name is a plain file name: never hidden, a path step, the manifest file or a partial file."""
    return not (name.startswith(".") or name == MANIFEST_FILE or name.endswith(PART_SUFFIX))


def check_manifest(manifest: CheckpointManifest) -> None:
    """Raise Reject unless the manifest is internally consistent (the codec already checked field types)."""
    shards = manifest.shards
    if not shards:
        raise _rule("a checkpoint has at least one shard")
    names = [s.name for s in shards]
    if len(set(names)) != len(names):
        raise _rule("shard names must be unique")
    for shard in shards:
        if not is_safe_shard_name(shard.name):
            raise _rule(f"shard name {shard.name!r} is reserved")
        if not 1 <= shard.size <= MAX_SHARD_SIZE:
            raise _rule(f"shard {shard.name!r} size {shard.size} outside [1, {MAX_SHARD_SIZE}]")
    if sum(s.size for s in shards) != manifest.total_size:
        raise _rule(f"total_size {manifest.total_size} is not the sum of the shard sizes")
    _check_lineage(manifest.version, manifest.parent_version)
    if merkle_root([s.sha256 for s in shards]) != manifest.merkle_root:
        raise Reject(Reason.BAD_HASH, "merkle_root is not the root over the shard digests")


def _check_lineage(version: int, parent_version: int) -> None:
    if version == 0:
        if parent_version != 0:
            raise _rule(f"version 0 must have parent_version 0, not {parent_version}")
    elif parent_version >= version:
        raise _rule(f"parent_version {parent_version} is not below version {version}")


def envelope_timestamp(data: bytes) -> int:
    """The `ts` of an envelope, read before verification (only to choose the freshness reference)."""
    return decode(Envelope, data).ts


def _open_trainers(data: bytes, expect: type[M], *, run: str, trainer: bytes, now_ms: int) -> tuple[M, bytes]:
    """The message and canonical body of an envelope of type `expect` that the run's trainer signed.

    Data at rest (re-served by relays, read back from disk): an old timestamp is not stale, staleness is
    by version (`is_retained`); a timestamp from the future beyond the envelope's clock skew is refused.
    """
    freshness_ref = min(now_ms, envelope_timestamp(data))
    opened = open_envelope(data, run=run, now_ms=freshness_ref, replay=None, expect=expect)
    message: M = opened.message
    what = expect.TYPE
    if opened.sender != trainer:
        raise Reject(Reason.WRONG_SENDER, f"{what} signed by {opened.sender.hex()}, not the run's trainer")
    if message.run != run:
        raise Reject(Reason.RULE_VIOLATION, f"{what} body names run {message.run!r}, envelope {run!r}")
    return message, opened.envelope.body


def verify_manifest(data: bytes, *, run: str, trainer: bytes, now_ms: int) -> CheckpointManifest:
    """Open a manifest envelope fetched from anyone; trusted only when the run's trainer signed it.

    Duplicates are the caller's to drop, by (version, merkle_root).
    """
    manifest, _ = _open_trainers(data, CheckpointManifest, run=run, trainer=trainer, now_ms=now_ms)
    check_manifest(manifest)
    return manifest


# --- checkpoint heads ----------------------------------------------------------------------------


def manifest_digest(manifest: CheckpointManifest) -> bytes:
    """sha256 of the manifest's canonical body: what a head commits to."""
    return sha256(encode(manifest))


def manifest_head(manifest: CheckpointManifest, digest: bytes | None = None) -> CheckpointHead:
    """The head gossiped for `manifest` (`digest`: its `manifest_digest`, when the caller has it)."""
    return CheckpointHead(
        run=manifest.run,
        version=manifest.version,
        parent_version=manifest.parent_version,
        model_config_hash=manifest.model_config_hash,
        total_size=manifest.total_size,
        shard_count=len(manifest.shards),
        merkle_root=manifest.merkle_root,
        manifest_digest=manifest_digest(manifest) if digest is None else digest,
        created_ms=manifest.created_ms,
    )


def check_head(head: CheckpointHead) -> None:
    """Raise Reject unless the head could describe a manifest that passes `check_manifest`."""
    if not 1 <= head.shard_count <= MAX_SHARDS:
        raise _rule(f"shard_count {head.shard_count} outside [1, {MAX_SHARDS}]")
    if not head.shard_count <= head.total_size <= head.shard_count * MAX_SHARD_SIZE:
        raise _rule(f"total_size {head.total_size} cannot be the sum of {head.shard_count} shard sizes")
    _check_lineage(head.version, head.parent_version)


_HEAD_FIELDS = (
    "run", "version", "parent_version", "model_config_hash", "total_size", "merkle_root", "created_ms"
)


def check_manifest_matches_head(
    manifest: CheckpointManifest, head: CheckpointHead, digest: bytes | None = None
) -> None:
    """Raise Reject unless `manifest` is the one `head` names (`digest`: its `manifest_digest`, if known).

    A differing header field is a RULE_VIOLATION naming it; a body that differs anywhere else (a shard's
    name or size: the Merkle root covers only the digests) is BAD_HASH.
    """
    for name in _HEAD_FIELDS:
        if getattr(manifest, name) != getattr(head, name):
            raise _rule(f"the manifest's {name} differs from the head's")
    if len(manifest.shards) != head.shard_count:
        raise _rule(f"the manifest lists {len(manifest.shards)} shards, the head {head.shard_count}")
    if (manifest_digest(manifest) if digest is None else digest) != head.manifest_digest:
        raise Reject(Reason.BAD_HASH, "the manifest's sha256 is not the head's manifest_digest")


def verify_head(data: bytes, *, run: str, trainer: bytes, now_ms: int) -> CheckpointHead:
    """Open a head envelope; trusted only when the run's trainer signed it and it is consistent."""
    head, _ = _open_trainers(data, CheckpointHead, run=run, trainer=trainer, now_ms=now_ms)
    check_head(head)
    return head


def verify_manifest_for_head(
    data: bytes, head: CheckpointHead, *, trainer: bytes, now_ms: int
) -> CheckpointManifest:
    """Open a manifest envelope fetched for a trusted `head`: the trainer's, well formed, and the one named.

    The digest is taken over the envelope's body, which is the manifest's canonical encoding.
    """
    manifest, body = _open_trainers(data, CheckpointManifest, run=head.run, trainer=trainer, now_ms=now_ms)
    check_manifest(manifest)
    check_manifest_matches_head(manifest, head, sha256(body))
    return manifest


# --- ShardHave bitfield --------------------------------------------------------------------------


def bitfield_length(shard_count: int) -> int:
    return (shard_count + 7) // 8


def encode_bitfield(held: Iterable[int], shard_count: int) -> bytes:
    """Bit i (most significant bit first, as in BitTorrent) set = shard i held."""
    out = bytearray(bitfield_length(shard_count))
    for index in held:
        if not 0 <= index < shard_count:
            raise ValueError(f"shard index {index} outside [0, {shard_count})")
        out[index >> 3] |= 0x80 >> (index & 7)
    return bytes(out)


def decode_bitfield(bitfield: bytes, shard_count: int) -> frozenset[int]:
    """The held shard indices; Reject a wrong length or a set spare bit (one spelling per set)."""
    if len(bitfield) != bitfield_length(shard_count):
        raise _rule(f"bitfield of {len(bitfield)} bytes for {shard_count} shards")
    spare = bitfield_length(shard_count) * 8 - shard_count
    if spare and bitfield[-1] & ((1 << spare) - 1):
        raise _rule("bitfield sets a bit past the last shard")
    return frozenset(i for i in range(shard_count) if bitfield[i >> 3] & (0x80 >> (i & 7)))


def check_have(have: ShardHave, manifest: CheckpointManifest) -> frozenset[int]:
    """The shards `have` claims for this manifest's version; Reject a claim about a different checkpoint."""
    if have.run != manifest.run or have.version != manifest.version:
        raise Ignore(Reason.NOT_FOR_US, f"have for {have.run}/{have.version}, manifest {manifest.version}")
    if have.merkle_root != manifest.merkle_root:
        raise Reject(Reason.UNKNOWN_CHECKPOINT, f"have names a different root for version {have.version}")
    parse_endpoint(have.endpoint)
    return decode_bitfield(have.bitfield, len(manifest.shards))


def verify_have(data: bytes, manifest: CheckpointManifest, endpoint: str, *, now_ms: int) -> ShardHave:
    """Open a `ShardHave` envelope fetched from `endpoint` about the trusted `manifest`'s version.

    Anyone may sign a claim about itself; the claim must name the endpoint it was fetched from (over
    gossip, the caller checks the sender's announced endpoint instead) and fit the manifest.
    """
    freshness_ref = min(now_ms, envelope_timestamp(data))
    opened = open_envelope(data, run=manifest.run, now_ms=freshness_ref, replay=None, expect=ShardHave)
    have: ShardHave = opened.message
    check_have(have, manifest)
    if have.endpoint != endpoint:
        raise Reject(Reason.RULE_VIOLATION, f"{endpoint} announced itself as {have.endpoint}")
    return have


# --- retention -----------------------------------------------------------------------------------


def is_retained(version: int, latest: int, async_level: int) -> bool:
    """Keep a version while it is at most `async_level + 1` behind the newest.

    Workers may generate with a policy `async_level` versions old; one more version stays so that
    rollouts in flight when the trainer publishes can still be verified against their checkpoint.
    """
    return version + async_level + 1 >= latest


def versions_to_prune(versions: Iterable[int], latest: int, async_level: int) -> list[int]:
    return sorted(v for v in versions if not is_retained(v, latest, async_level))


# --- HTTP paths ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def parse_endpoint(url: str) -> Endpoint:
    """`http://host:port` with nothing after it; Reject anything else (a peer announced it)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Reject(Reason.RULE_VIOLATION, f"endpoint {url!r}: {exc}") from None
    if parts.scheme != "http" or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise Reject(Reason.RULE_VIOLATION, f"endpoint {url!r} is not http://host:port")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise Reject(Reason.RULE_VIOLATION, f"endpoint {url!r} carries more than host and port")
    return Endpoint(parts.hostname, port)


def _poll_query(after: int | None, wait_s: int) -> str:
    if after is None:
        return f"?wait={wait_s}" if wait_s else ""
    return f"?after={after}&wait={wait_s}"


def latest_manifest_path(run: str, after: int | None = None, wait_s: int = 0) -> str:
    """The newest manifest; with `wait_s`, held until one newer than `after` (or any, if None) exists."""
    return f"{PATH_PREFIX}/{run}/{LATEST}/manifest{_poll_query(after, wait_s)}"


def manifest_path(run: str, version: int) -> str:
    return f"{PATH_PREFIX}/{run}/{version}/manifest"


def shard_path(run: str, version: int, name: str) -> str:
    return f"{PATH_PREFIX}/{run}/{version}/shard/{name}"


def have_path(run: str, version: int, after: int | None = None, wait_s: int = 0) -> str:
    """A signed ShardHave; with `wait_s`, held until more than `after` shards are held."""
    return f"{PATH_PREFIX}/{run}/{version}/have{_poll_query(after, wait_s)}"


STATS_PATH = f"{PATH_PREFIX}/stats"


@dataclass(frozen=True)
class Route:
    """A parsed request target. kind: manifest | latest | shard | have | stats.

    Long polls (latest, have) wait up to `wait_s` for a version newer than `after`, or for more than
    `after` held shards; `after` is -1 when the query names none.
    """

    kind: str
    run: str = ""
    version: int = 0
    name: str = ""
    after: int = -1
    wait_s: int = 0


_RUN = r"[a-z0-9][a-z0-9._-]{0,63}"
_VERSION = r"0|[1-9][0-9]{0,19}"
_ROUTE = re.compile(
    rf"{re.escape(PATH_PREFIX)}/(?P<run>{_RUN})/"
    rf"(?:(?P<latest>{LATEST})/manifest|(?P<version>{_VERSION})/(?:(?P<kind>manifest|have)|shard/(?P<name>[A-Za-z0-9._-]{{1,128}})))"
)
_QUERY = re.compile(r"(?:after=(?P<after>0|[1-9][0-9]{0,19})&)?wait=(?P<wait>[0-9]{1,4})")
_U64_MAX = 2**64 - 1


def parse_route(target: str, max_wait_s: int) -> Route | None:
    """The route a request target names, or None (404). Long-poll waits are capped at `max_wait_s`."""
    path, _, query = target.partition("?")
    if path == STATS_PATH and not query:
        return Route("stats")
    match = _ROUTE.fullmatch(path)
    if match is None:
        return None
    after, wait_s = -1, 0
    if query:
        q = _QUERY.fullmatch(query)
        if q is None or match["name"] is not None or match["kind"] == "manifest":
            return None
        after, wait_s = int(q["after"] or -1), min(int(q["wait"]), max_wait_s)
        if after > _U64_MAX:
            return None
    if match["latest"] is not None:
        return Route("latest", match["run"], after=after, wait_s=wait_s)
    version = int(match["version"])
    if version > _U64_MAX:
        return None
    if match["name"] is not None:
        if not is_safe_shard_name(match["name"]):
            return None
        return Route("shard", match["run"], version, match["name"])
    return Route(match["kind"], match["run"], version, after=after, wait_s=wait_s)


# --- Range requests (RFC 9110 section 14) --------------------------------------------------------


class Unsatisfiable(Exception):
    """The range starts at or past the end of the representation: answer 416."""


_RANGE = re.compile(r"bytes=(?P<first>[0-9]{0,19})-(?P<last>[0-9]{0,19})")


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The half-open byte span `[start, end)` a `Range` header asks for, or None to send everything.

    One range only: multiple ranges and malformed headers are ignored (RFC 9110 allows it), so the
    full representation is sent. Raises Unsatisfiable for a range that starts past the end.
    """
    if header is None:
        return None
    match = _RANGE.fullmatch(header.strip())
    if match is None:
        return None
    first, last = match["first"], match["last"]
    if first:
        start = int(first)
        end = size if not last else int(last) + 1
        if last and end <= start:
            return None  # invalid (last < first): ignore the header
        if start >= size:
            raise Unsatisfiable(f"range starts at {start}, size is {size}")
        return start, min(end, size)
    if not last:
        return None
    suffix = int(last)
    if suffix == 0:
        raise Unsatisfiable("empty suffix range")
    return max(0, size - suffix), size


def content_range(start: int, end: int, size: int) -> str:
    return f"bytes {start}-{end - 1}/{size}"


_CONTENT_RANGE = re.compile(r"bytes (?P<first>[0-9]{1,19})-(?P<last>[0-9]{1,19})/(?P<size>[0-9]{1,19})")


def parse_content_range(header: str) -> tuple[int, int, int] | None:
    """`(start, end, size)` of a 206 response's `Content-Range` (end exclusive), or None if malformed."""
    match = _CONTENT_RANGE.fullmatch(header.strip())
    if match is None:
        return None
    start, last, size = int(match["first"]), int(match["last"]), int(match["size"])
    if last < start or last >= size:
        return None
    return start, last + 1, size
