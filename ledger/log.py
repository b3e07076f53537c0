"""The signed log's pure core: genesis, entry chaining, operation authentication, replay.

No SQLite here: `SignedLog` feeds entry bytes through `apply_entry` whether it is appending, opening its
own file or auditing a copy, so every copy of a log derives the same state, head hash and tree head.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from crypto.hashing import sha256
from crypto.identity import NodeIdentity
from crypto.signing import InvalidSignature, recover_address
from ledger.accumulator import MerkleAccumulator
from ledger.errors import BadSignature, CorruptLog, MalformedOperation, ReplayedOperation, WrongLedger
from ledger.state import LedgerState, Operation, process_operation
from ledger.types import Params
from protocol.codec import decode, encode, registry
from protocol.envelope import ENVELOPE_VERSION, Envelope, seal, signing_digest
from protocol.errors import Reject
from protocol.ledger_messages import LEDGER_OPERATIONS, LedgerEntry, LedgerGenesis

OPERATION_TYPES = registry(*LEDGER_OPERATIONS)


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


def apply_entry(log: LogState, data: bytes, *, check_signatures: bool = True) -> AppliedEntry:
    """Check one entry against the log and apply it; on any error the log state is unchanged.

    `check_signatures=False` skips signature recovery (the op's and its evidence's) for replaying a log
    this node wrote itself; every other rule, and the hash chain, are still enforced.
    """
    try:
        entry = decode(LedgerEntry, data)
    except Reject as exc:
        raise MalformedOperation(f"entry does not decode: {exc.detail}") from None
    if entry.index != log.size:
        raise CorruptLog(log.size, f"entry claims index {entry.index}")
    if entry.prev_hash != log.head:
        raise CorruptLog(log.size, "prev_hash does not match the previous entry's hash")
    auth = authenticate(entry.op, log.genesis.ledger_id, check_signature=check_signatures)
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
    entry_hash = sha256(data)
    if closed is not None:
        log.checkpoints.append(closed)
    log.nonces[auth.sender] = auth.seq
    log.tree.append(entry_hash)
    log.head = entry_hash
    log.size += 1
    log.last_epoch = entry.epoch
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
