"""The signed log's pure core: genesis, entry chaining, operation authentication, seals, heads, replay.

No SQLite here: `SignedLog` feeds entry bytes through `apply_entry` whether it is appending, opening its
own file or auditing a copy, so every copy of a log derives the same state, head hash and tree head.

An author signs its operation before it knows where the operation will land; the index, parent and
epoch of the entry are the host's. So at append time the author also signs the entry itself (its
**seal**), and the **signed head** (entry count and last entry hash) that is rewritten with every append:
an edited entry fails its own seal (blame lands on it, not on its successor), and a log missing its last
entries no longer matches the head its last author signed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from swarmnode.crypto.hashing import keccak256, sha256
from swarmnode.crypto.identity import NodeIdentity, format_address
from swarmnode.crypto.signing import InvalidSignature, recover_address
from swarmnode.ledger.accumulator import MerkleAccumulator
from swarmnode.ledger.errors import (
    BadSignature,
    CorruptLog,
    MalformedOperation,
    ReplayedOperation,
    TruncatedLog,
    WrongLedger,
)
from swarmnode.ledger.state import LedgerState, Operation, process_operation
from swarmnode.ledger.types import Params
from swarmnode.protocol.codec import Size, decode, encode, registry
from swarmnode.protocol.envelope import ENVELOPE_VERSION, Envelope, seal, signing_digest
from swarmnode.protocol.errors import Reject
from swarmnode.protocol.ledger_messages import LEDGER_OPERATIONS, LedgerEntry, LedgerGenesis

OPERATION_TYPES = registry(*LEDGER_OPERATIONS)
SEAL_DOMAIN = b"swarmnode/ledger-entry-seal/v1"
HEAD_DOMAIN = b"swarmnode/ledger-head/v1"


# --- genesis ---------------------------------------------------------------------------------------


def make_genesis(ledger_id: str, params: Params, genesis_time_s: int) -> LedgerGenesis:
    return LedgerGenesis(
        ledger_id=ledger_id,
        genesis_time_s=genesis_time_s,
        epoch_seconds=params.epoch_seconds,
        min_stake_per_unit_gwei=params.min_stake_per_unit_gwei,
        unbonding_delay_epochs=params.unbonding_delay_epochs,
        slash_gwei=params.slash_gwei,
        ejection_threshold=params.ejection_threshold,
    )


def genesis_params(genesis: LedgerGenesis) -> Params:
    return Params(
        min_stake_per_unit_gwei=genesis.min_stake_per_unit_gwei,
        unbonding_delay_epochs=genesis.unbonding_delay_epochs,
        slash_gwei=genesis.slash_gwei,
        ejection_threshold=genesis.ejection_threshold,
        epoch_seconds=genesis.epoch_seconds,
    )


def genesis_hash(genesis: LedgerGenesis) -> bytes:
    """Entry 0's parent: binds the ledger id and every parameter into the chain."""
    return sha256(encode(genesis))


def epoch_at(genesis: LedgerGenesis, unix_s: float) -> int:
    return max(0, int(unix_s - genesis.genesis_time_s) // genesis.epoch_seconds)


# --- operations ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuthenticatedOp:
    sender: bytes
    seq: int
    op: Operation


def sign_operation(identity: NodeIdentity, op: Operation, *, ledger_id: str, nonce: int, ts_ms: int) -> bytes:
    """An operation as its author signs it: an envelope for this ledger at the author's next nonce."""
    return seal(identity, op, run=ledger_id, seq=nonce, ts=ts_ms)


def authenticate(data: bytes, ledger_id: str, *, check_signature: bool = True) -> AuthenticatedOp:
    """Decode an operation envelope and prove who signed it; typed errors, never another exception."""
    try:
        envelope = decode(Envelope, data)
    except Reject as exc:
        raise MalformedOperation(f"not a canonical envelope: {exc.detail}") from None
    if envelope.v != ENVELOPE_VERSION:
        raise MalformedOperation(f"envelope version {envelope.v}, expected {ENVELOPE_VERSION}")
    cls = OPERATION_TYPES.get(envelope.type)
    if cls is None:
        raise MalformedOperation(f"{envelope.type!r} is not a ledger operation")
    if envelope.run != ledger_id:
        raise WrongLedger(f"operation signed for ledger {envelope.run!r}, this is {ledger_id!r}")
    if check_signature:
        digest = signing_digest(
            envelope.type, envelope.run, envelope.sender, envelope.seq, envelope.ts, envelope.body
        )
        try:
            signer = recover_address(digest, envelope.sig)
        except InvalidSignature as exc:
            raise BadSignature(f"{envelope.type} from 0x{envelope.sender.hex()}: {exc}") from None
        if signer != envelope.sender:
            raise BadSignature(
                f"{envelope.type} claims sender 0x{envelope.sender.hex()} but was signed by another key"
            )
    try:
        op: Any = decode(cls, envelope.body)
    except Reject as exc:
        raise MalformedOperation(f"{envelope.type} body: {exc.detail}") from None
    return AuthenticatedOp(envelope.sender, envelope.seq, op)


# --- seals and the signed head ------------------------------------------------------------------------


def _lp(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def seal_digest(ledger_id: str, index: int, entry_hash: bytes) -> bytes:
    """What an entry's author signs when it is appended: this entry, at this index, of this ledger."""
    return keccak256(_lp(SEAL_DOMAIN) + _lp(ledger_id.encode()) + struct.pack(">Q", index) + entry_hash)


def head_digest(ledger_id: str, size: int, head: bytes) -> bytes:
    """What the last entry's author signs as the log's head: `size` entries, the last one hashing to `head`.

    Another domain than the seal's: an entry's seal must never pass for the head of a log that ends there.
    """
    return keccak256(_lp(HEAD_DOMAIN) + _lp(ledger_id.encode()) + struct.pack(">Q", size) + head)


def seal_entry(identity: NodeIdentity, ledger_id: str, index: int, entry_hash: bytes) -> bytes:
    return identity.sign(seal_digest(ledger_id, index, entry_hash))


@dataclass(frozen=True)
class SignedHead:
    """The log's latest entry count and last entry hash, signed by that entry's author (stored beside it)."""

    MAX_SIZE: ClassVar[int] = 256

    size: int
    head: Annotated[bytes, Size(32)]
    signer: Annotated[bytes, Size(20)]
    sig: Annotated[bytes, Size(65)]


def sign_head(identity: NodeIdentity, ledger_id: str, size: int, head: bytes) -> SignedHead:
    return SignedHead(size, head, identity.address, identity.sign(head_digest(ledger_id, size, head)))


def _recovers_to(digest: bytes, sig: bytes, signer: bytes) -> bool:
    try:
        return recover_address(digest, sig) == signer
    except InvalidSignature:
        return False


def check_head(log: LogState, head: SignedHead | None, *, check_signature: bool = True) -> None:
    """The replayed log must end exactly where its signed head says; CorruptLog names the first bad entry.

    More entries counted than stored is a truncation (`TruncatedLog`, naming the first missing index).
    """
    if head is None:
        if log.size:
            raise CorruptLog(None, f"no signed head for {log.size} entries: the log may have been truncated")
        return
    if head.size > log.size:
        raise TruncatedLog(
            log.size,
            f"the log was truncated: its signed head counts {head.size} entries, {log.size} remain "
            f"(entries {log.size}..{head.size - 1} are missing)",
        )
    if head.size < log.size:
        raise CorruptLog(
            head.size,
            f"entries {head.size}..{log.size - 1} lie beyond the signed head of {head.size} entries",
        )
    last = log.size - 1
    if head.head != log.head:
        raise CorruptLog(last, f"entry {last} is not the last entry the signed head names")
    if head.signer != log.last_author:
        raise CorruptLog(
            last,
            f"the head is signed by {format_address(head.signer)}, not by entry {last}'s author "
            f"{format_address(log.last_author)}",
        )
    if check_signature and not _recovers_to(
        head_digest(log.genesis.ledger_id, head.size, head.head), head.sig, head.signer
    ):
        raise CorruptLog(last, f"the signed head of entry {last} does not carry its author's signature")


# --- log state and replay --------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """The tree head over every entry up to the end of `epoch`: `size` entries, RFC 6962 `root`."""

    epoch: int
    size: int
    root: bytes


@dataclass
class LogState:
    genesis: LedgerGenesis
    ledger: LedgerState
    head: bytes
    size: int = 0
    last_epoch: int = 0
    last_author: bytes = b""  # who appended (and sealed) the last entry: the head's signer
    nonces: dict[bytes, int] = field(default_factory=dict)  # highest seq used per author
    tree: MerkleAccumulator = field(default_factory=MerkleAccumulator)
    checkpoints: list[Checkpoint] = field(default_factory=list)  # closed epochs, ascending


def new_log_state(genesis: LedgerGenesis) -> LogState:
    return LogState(genesis, LedgerState(genesis_params(genesis)), head=genesis_hash(genesis))


def next_nonce(log: LogState, author: bytes) -> int:
    return log.nonces.get(author, -1) + 1


def make_entry(log: LogState, op_envelope: bytes, epoch: int) -> bytes:
    """The next entry's bytes: the envelope at position `size`, chained to the current head."""
    return encode(LedgerEntry(index=log.size, prev_hash=log.head, epoch=epoch, op=op_envelope))


@dataclass(frozen=True)
class AppliedEntry:
    index: int
    entry_hash: bytes
    epoch: int
    author: bytes
    op: Operation
    result: Any
    closed: Checkpoint | None  # the checkpoint this entry closed by opening a later epoch


def apply_entry(
    log: LogState,
    data: bytes,
    *,
    seal: bytes | None = None,
    stored_epoch: int | None = None,
    check_signatures: bool = True,
) -> AppliedEntry:
    """Check one entry against the log and apply it; on any error the log state is unchanged.

    `seal` is the author's signature over the entry (`seal_digest`); a stored log always passes it, only
    tests that build a state from bare entries leave it out. `check_signatures=False` skips signature
    recovery (the op's, the seal's and the evidence's) for replaying a log this node wrote itself; every
    other rule, and the hash chain, are still enforced. `stored_epoch` is the epoch a store keeps beside
    the entry (for range queries); it must agree with the entry's own.
    """
    try:
        entry = decode(LedgerEntry, data)
    except Reject as exc:
        raise MalformedOperation(f"entry does not decode: {exc.detail}") from None
    if entry.index != log.size:
        raise CorruptLog(log.size, f"entry claims index {entry.index}")
    if entry.prev_hash != log.head:
        raise CorruptLog(log.size, "prev_hash does not match the previous entry's hash")
    if stored_epoch is not None and stored_epoch != entry.epoch:
        raise CorruptLog(log.size, f"the epoch column says {stored_epoch}, the entry says {entry.epoch}")
    auth = authenticate(entry.op, log.genesis.ledger_id, check_signature=check_signatures)
    entry_hash = sha256(data)
    if (
        seal is not None
        and check_signatures
        and not _recovers_to(seal_digest(log.genesis.ledger_id, log.size, entry_hash), seal, auth.sender)
    ):
        raise BadSignature(
            f"entry {log.size} (epoch {entry.epoch}) is not sealed by its author "
            f"{format_address(auth.sender)}: it was changed after it was appended, or appended without them"
        )
    if auth.seq <= log.nonces.get(auth.sender, -1):
        raise ReplayedOperation(
            f"nonce {auth.seq} of 0x{auth.sender.hex()} was already used (highest {log.nonces[auth.sender]})"
        )
    closed = (
        Checkpoint(log.last_epoch, log.size, log.tree.root())
        if entry.epoch > log.last_epoch and log.size
        else None
    )
    result = process_operation(
        log.ledger, auth.sender, auth.op, entry.epoch, verify_evidence=check_signatures
    )
    # From here on nothing can fail: commit the log-level effects.
    if closed is not None:
        log.checkpoints.append(closed)
    log.nonces[auth.sender] = auth.seq
    log.tree.append(entry_hash)
    log.head = entry_hash
    log.size += 1
    log.last_epoch = entry.epoch
    log.last_author = auth.sender
    return AppliedEntry(entry.index, entry_hash, entry.epoch, auth.sender, auth.op, result, closed)


def checkpoint_at(log: LogState, epoch: int) -> Checkpoint:
    """Tree head as of the end of `epoch` (the current head if that epoch is still open)."""
    best: Checkpoint | None = None
    for checkpoint in log.checkpoints:
        if checkpoint.epoch > epoch:
            break
        best = checkpoint
    if epoch >= log.last_epoch:
        return Checkpoint(epoch, log.size, log.tree.root())
    if best is None:
        return Checkpoint(epoch, 0, MerkleAccumulator().root())
    return Checkpoint(epoch, best.size, best.root)
