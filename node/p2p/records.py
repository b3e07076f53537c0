"""DHT key formats and record validation for the swarmnode namespaces (spec/discovery.md is the twin).

Two kinds of DHT entries:

- Provider records say "this peer provides X". Their key is a sha2-256 multihash of a UTF-8 name,
  `0x12 0x20 || sha256(name)`, the same shape as a CID's multihash, so they fit the Kademlia limits
  (80 bytes) and spread evenly over the key space. Names:
  `swarmnode/<run>/role/<role>` and `swarmnode/<run>/checkpoint/<version>`.
- Value records are namespaced strings. Only `/swarmnode/run/<run>` exists: its value is the trainer's
  signed `RunDescriptor` envelope. The DHT runs with strict validation, so a PUT for any key outside
  our namespace, or a value that fails `RunRecordValidator`, is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from libp2p.records.validator import Validator

from swarmnode.crypto.hashing import sha256
from swarmnode.protocol.codec import decode
from swarmnode.protocol.envelope import Envelope, open_envelope
from swarmnode.protocol.errors import ProtocolError
from swarmnode.protocol.messages import RunDescriptor
from swarmnode.protocol.runs import check_descriptor

NAMESPACE = "swarmnode"
ROLES = ("trainer", "relay", "worker", "validator")
MULTIHASH_SHA2_256 = b"\x12\x20"
PROVIDER_KEY_SIZE = len(MULTIHASH_SHA2_256) + 32
RUN_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


class InvalidRecord(ValueError):
    """A DHT key or value outside our formats; the DHT refuses to store or return it."""


def check_run(run: str) -> str:
    if not RUN_PATTERN.fullmatch(run):
        raise InvalidRecord(f"run id {run!r} does not match {RUN_PATTERN.pattern}")
    return run


def provider_key(name: str) -> bytes:
    """The 34-byte DHT key of a provider name: sha2-256 multihash of its UTF-8 bytes."""
    return MULTIHASH_SHA2_256 + sha256(name.encode())


def role_name(run: str, role: str) -> str:
    if role not in ROLES:
        raise InvalidRecord(f"unknown role {role!r}; one of {ROLES}")
    return f"{NAMESPACE}/{check_run(run)}/role/{role}"


def checkpoint_name(run: str, version: int) -> str:
    if not 0 <= version < 2**64:
        raise InvalidRecord(f"checkpoint version {version} is not a u64")
    return f"{NAMESPACE}/{check_run(run)}/checkpoint/{version}"


def role_key(run: str, role: str) -> bytes:
    return provider_key(role_name(run, role))


def checkpoint_key(run: str, version: int) -> bytes:
    return provider_key(checkpoint_name(run, version))


def is_provider_key(key: bytes) -> bool:
    """Shape check for provider keys we accept from peers (we cannot invert the hash)."""
    return len(key) == PROVIDER_KEY_SIZE and key.startswith(MULTIHASH_SHA2_256)


def run_record_key(run: str) -> str:
    return f"/{NAMESPACE}/run/{check_run(run)}"


def parse_run_record_key(key: str) -> str:
    prefix = f"/{NAMESPACE}/run/"
    if not key.startswith(prefix):
        raise InvalidRecord(f"{key!r} is not a run record key")
    return check_run(key[len(prefix) :])


@dataclass(frozen=True)
class RunRecord:
    """A verified run descriptor value: who signed it, when, and the descriptor."""

    sender: bytes
    seq: int
    descriptor: RunDescriptor


def open_run_record(key: str, value: bytes, *, trainer: bytes | None = None) -> RunRecord:
    """Verify a `/swarmnode/run/<run>` value; raise InvalidRecord with the reason.

    The envelope must carry a RunDescriptor for the run in the key, signed by the trainer it names
    (and by `trainer` when the node pins one). Records are long-lived, so the envelope's clock-skew rule
    is evaluated at the envelope's own timestamp: freshness does not apply to a stored record.
    """
    run = parse_run_record_key(key)
    try:
        ts = decode(Envelope, value).ts
        opened = open_envelope(value, run=run, now_ms=ts, replay=None, expect=RunDescriptor)
    except ProtocolError as exc:
        raise InvalidRecord(f"run record for {run!r}: {exc}") from None
    descriptor: RunDescriptor = opened.message
    if descriptor.run != run:
        raise InvalidRecord(f"descriptor names run {descriptor.run!r}, key names {run!r}")
    if descriptor.trainer != opened.sender:
        raise InvalidRecord("a run descriptor must be signed by the trainer it names")
    if trainer is not None and opened.sender != trainer:
        raise InvalidRecord(f"run {run!r} is pinned to trainer 0x{trainer.hex()}")
    try:
        check_descriptor(descriptor)
    except ProtocolError as exc:
        raise InvalidRecord(f"run record for {run!r}: {exc}") from None
    return RunRecord(opened.sender, opened.envelope.seq, descriptor)


def select_run_record(key: str, values: list[bytes], *, trainer: bytes | None = None) -> int:
    """Index of the best value: valid first, then newest (created_ms, seq), ties to the smallest bytes."""
    best: tuple[int, tuple[int, int, int, bytes]] | None = None
    for index, value in enumerate(values):
        try:
            record = open_run_record(key, value, trainer=trainer)
        except InvalidRecord:
            continue
        rank = (1, record.descriptor.created_ms, record.seq, bytes(255 - b for b in value[:64]))
        if best is None or rank > best[1]:
            best = (index, rank)
    return 0 if best is None else best[0]


class RunRecordValidator(Validator):
    """py-libp2p `Validator` for the `swarmnode` namespace, registered on a strict NamespacedValidator."""

    def __init__(self, trainer: bytes | None = None) -> None:
        self.trainer = trainer
        self.rejected = 0

    def validate(self, key: str, value: bytes) -> None:
        try:
            open_run_record(key, value, trainer=self.trainer)
        except InvalidRecord:
            self.rejected += 1
            raise

    def select(self, key: str, values: list[bytes]) -> int:
        return select_run_record(key, values, trainer=self.trainer)
