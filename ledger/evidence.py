"""Checks on what a slash cites: pure functions over the worker's signed submission envelope.

The contract checks the worker's signature from a citation (header fields, the body's keccak256, the
signature) with ecrecover; what only the full submission shows (its run, its chunk count) is checked here,
by the signed log's state machine and by the EVM client before it sends (spec/ledger.md, Trust).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from swarmnode.crypto.hashing import keccak256
from swarmnode.crypto.signing import InvalidSignature, recover_address
from swarmnode.ledger.errors import InvalidEvidence
from swarmnode.protocol.codec import decode
from swarmnode.protocol.envelope import Envelope, signing_digest, signing_digest_of_body_hash
from swarmnode.protocol.errors import Reason, Reject
from swarmnode.protocol.ledger_messages import Slash
from swarmnode.protocol.messages import RolloutSubmission

# Rejections whose verdict anyone holding the checkpoint and the run descriptor can recompute. A malformed
# rollout (a field outside what the run allows, e.g. a token id beyond the vocabulary) is read off the
# signed submission and the descriptor alone; a fabricated environment turn off those and the environment's
# code the descriptor names (a replay: spec/environments.md).
SLASHABLE_REASONS = frozenset(
    {
        Reason.BAD_ASSIGNMENT,
        Reason.BAD_REWARD,
        Reason.BAD_TERMINATION,
        Reason.BAD_PROOF,
        Reason.BAD_SAMPLING,
        Reason.MALFORMED_ROLLOUT,
        Reason.FABRICATED_ENV_TURN,
    }
)


@dataclass(frozen=True)
class SignedMessage:
    """An envelope whose signature recovered to its sender, with the decoded body."""

    envelope: Envelope
    message: Any


def open_signed(data: bytes, cls: type, what: str) -> SignedMessage:
    """Decode an envelope of type `cls`, recover its signer, decode its body; InvalidEvidence otherwise.

    No clock and no replay window: stored evidence is re-verified long after it was signed.
    """
    try:
        envelope = decode(Envelope, data)
    except Reject as exc:
        raise InvalidEvidence(f"{what} is not a canonical envelope: {exc.detail}") from None
    if envelope.type != cls.TYPE:  # type: ignore[attr-defined]
        raise InvalidEvidence(f"{what} is a {envelope.type!r} envelope, expected {cls.TYPE!r}")  # type: ignore[attr-defined]
    digest = signing_digest(
        envelope.type, envelope.run, envelope.sender, envelope.seq, envelope.ts, envelope.body
    )
    try:
        signer = recover_address(digest, envelope.sig)
    except InvalidSignature as exc:
        raise InvalidEvidence(f"{what} signature is invalid: {exc}") from None
    if signer != envelope.sender:
        raise InvalidEvidence(f"{what} signature does not recover to its sender {envelope.sender.hex()}")
    try:
        message: Any = decode(cls, envelope.body)
    except Reject as exc:
        raise InvalidEvidence(f"{what} body does not decode: {exc.detail}") from None
    return SignedMessage(envelope, message)


@dataclass(frozen=True)
class SubmissionCitation:
    """What a slash puts on chain of the worker's signed submission: the envelope's header fields, the
    keccak256 of its body and its signature. The contract recomputes `digest` from them (domain
    `swarmnode/rollout_submission/v1`, the slash's run, the slashed worker) and ecrecovers the worker."""

    seq: int
    ts: int
    body_hash: bytes
    sig: bytes
    digest: bytes


def cite_submission(op: Slash) -> SubmissionCitation:
    """The citation of the slash's evidence, computed as the contract does; InvalidEvidence if the
    evidence is not a canonical envelope. Whether the signature recovers is `check_slash_evidence`."""
    try:
        envelope = decode(Envelope, op.evidence)
    except Reject as exc:
        raise InvalidEvidence(f"the evidence is not a canonical envelope: {exc.detail}") from None
    body_hash = keccak256(envelope.body)
    digest = signing_digest_of_body_hash(
        RolloutSubmission.TYPE, op.run, op.worker, envelope.seq, envelope.ts, body_hash
    )
    return SubmissionCitation(envelope.seq, envelope.ts, body_hash, envelope.sig, digest)


def slash_digest(op: Slash) -> bytes:
    """The name of a slashed submission on the ledger: the signing digest the worker signed."""
    return cite_submission(op).digest


def check_slash_form(op: Slash) -> None:
    """The stateless rules the contract also enforces: a slashable reason and ascending chunk indices."""
    if op.reason_code not in SLASHABLE_REASONS:
        raise InvalidEvidence(f"reason {op.reason_code} is not a recomputable, slashable rejection")
    if any(b <= a for a, b in zip(op.failing_chunks, op.failing_chunks[1:], strict=False)):
        raise InvalidEvidence("failing chunk indices must be strictly ascending")
    if op.reason_code == Reason.BAD_PROOF and not op.failing_chunks:
        raise InvalidEvidence("a bad-proof slash must name at least one failing chunk")


def _chunk_count(submission: RolloutSubmission) -> int:
    return sum(len(c.proofs) for group in submission.groups for c in group.completions)


def check_slash_evidence(op: Slash) -> None:
    """The evidence must be a submission the slashed worker signed in this run (what the contract checks
    with ecrecover), whose failing chunks exist (what only the full submission shows)."""
    citation = cite_submission(op)
    try:
        signer = recover_address(citation.digest, citation.sig)
    except InvalidSignature as exc:
        raise InvalidEvidence(f"the evidence's signature is invalid: {exc}") from None
    if signer != op.worker:
        raise InvalidEvidence(
            f"the evidence is not a rollout submission the slashed worker signed in run {op.run!r}"
        )
    signed = open_signed(op.evidence, RolloutSubmission, "evidence submission")
    submission: RolloutSubmission = signed.message
    if submission.run != op.run:
        raise InvalidEvidence(f"the evidence submission belongs to run {submission.run!r}, not {op.run!r}")
    chunks = _chunk_count(submission)
    if op.failing_chunks and op.failing_chunks[-1] >= chunks:
        raise InvalidEvidence(
            f"failing chunk {op.failing_chunks[-1]} is outside the submission's {chunks} chunks"
        )
